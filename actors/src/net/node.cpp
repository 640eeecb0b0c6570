#include "net/node.hpp"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <stdexcept>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "net/transport.hpp"
#include "system.hpp"
#include "troupe/actors/remote.hpp"
#include "troupe/core/log.hpp"

// ---- codecs of the status report (only the node speaks them) ------------------------------

template <>
struct troupe::codec<troupe::node_info> {
  using tuple = std::tuple<std::uint32_t, std::string, std::uint16_t, bool, std::uint64_t, std::vector<std::string>>;
  static void encode(byte_writer& w, const node_info& n) {
    troupe::codec<tuple>::encode(w, {n.id, n.host, n.port, n.alive, n.actors, n.labels});
  }
  static node_info decode(byte_reader& r) {
    auto [id, host, port, alive, actors, labels] = troupe::codec<tuple>::decode(r);
    return {id, std::move(host), port, alive, actors, std::move(labels)};
  }
};

template <>
struct troupe::codec<troupe::actor_status> {
  using tuple = std::tuple<std::uint64_t, std::string, std::string, std::int64_t, std::uint64_t, double, std::uint64_t>;
  static void encode(byte_writer& w, const actor_status& a) {
    troupe::codec<tuple>::encode(w, {a.id, a.type, a.name, a.mailbox_depth, a.messages, a.messages_per_s, a.wire});
  }
  static actor_status decode(byte_reader& r) {
    auto [id, type, name, depth, messages, rate, wire] = troupe::codec<tuple>::decode(r);
    return {id, std::move(type), std::move(name), depth, messages, rate, wire};
  }
};

template <>
struct troupe::codec<troupe::node_status> {
  static void encode(byte_writer& w, const node_status& s) {
    troupe::codec<node_info>::encode(w, s.info);
    troupe::codec<std::uint64_t>::encode(w, s.dead_letters);
    troupe::codec<std::vector<actor_status>>::encode(w, s.actors);
    troupe::codec<std::string>::encode(w, s.problem);
  }
  static node_status decode(byte_reader& r) {
    node_status s;
    s.info = troupe::codec<node_info>::decode(r);
    s.dead_letters = troupe::codec<std::uint64_t>::decode(r);
    s.actors = troupe::codec<std::vector<actor_status>>::decode(r);
    s.problem = troupe::codec<std::string>::decode(r);
    return s;
  }
};

namespace troupe::detail {

namespace {

namespace asio = boost::asio;
using net::connection;
using net::envelope;
using net::envelope_kind;
using clock_type = std::chrono::steady_clock;

/// Control codes after the handshake's (transport.hpp).
enum class ctl : std::uint64_t {
  join = 16,
  welcome = 17,
  hello = 18,
  members = 19,
  heartbeat = 20,
  down = 21,
  leave = 22,
  moved = 23,  // an actor was re-created on another node (head -> all)
  lost = 24,   // "this node counts you as lost": the receiver stops dialling the sender
  relocated = 25,  // the head has re-created what it will of a lost node (head -> all)
};
/// Operations of the node itself (calls and tells to net::node_target).
enum class op : std::uint64_t {
  spawn = 1,
  lookup = 2,
  register_name = 3,
  unregister_name = 4,
  stop_actor = 5,
  watch = 6,
  node_stats = 7,
  cluster_status = 8,
  restartable = 9,  // tells the head how to re-create an actor elsewhere
  forget_name = 10,  // unregister_name of one name, cluster-wide
};

constexpr int wire_shift = 40;
constexpr node_id head_id = 1;
/// A connection that keeps dropping right after each redial: the peer counts as lost.
constexpr int max_redials = 3;
/// How many of the exported actors that went a node remembers (see op::watch).
constexpr std::size_t remembered_gone = 1 << 16;
/// How long the cluster remembers a node that was lost or left.
constexpr auto forget_after = std::chrono::seconds(10);

/// id, host, port, alive, actors, key (see ctl::hello).
using join_tuple = std::tuple<std::string, std::uint16_t, std::vector<std::string>>;  // host, port, labels
using member_tuple = std::tuple<std::uint32_t, std::string, std::uint16_t, bool, std::uint64_t, std::vector<std::byte>>;
/// A node's id and key: what it says on a connection it opens to another node.
using hello_tuple = std::tuple<std::uint32_t, std::vector<std::byte>>;
using spawn_opts_tuple = std::tuple<std::uint64_t, std::uint8_t, std::int32_t, std::int64_t, double,
                                    std::int64_t, bool, bool, bool>;
using spawn_tuple =
    std::tuple<std::string, std::uint64_t, std::uint64_t, spawn_opts_tuple, std::vector<std::byte>>;
using name_tuple = std::tuple<std::string, std::uint64_t, std::uint32_t, std::string>;
using found_tuple = std::tuple<bool, std::uint64_t, std::uint32_t, std::string>;
using down_tuple = std::tuple<std::uint64_t, std::uint8_t, std::string>;
using moved_tuple = std::tuple<std::uint64_t, std::uint32_t>;

spawn_opts_tuple pack(const spawn_options& o) {
  return {o.mailbox_capacity, static_cast<std::uint8_t>(o.overflow), o.restart.max_restarts,
          o.restart.backoff.count(), o.restart.backoff_multiplier, o.restart.max_backoff.count(),
          o.reentrant, o.fail_on_ask_exception, o.detached};
}
spawn_options unpack(const spawn_opts_tuple& t) {
  spawn_options o;
  o.mailbox_capacity = std::get<0>(t);
  if (std::get<1>(t) > static_cast<std::uint8_t>(overflow_policy::reject))
    throw error(errc::decode_error, "unknown overflow policy");
  o.overflow = static_cast<overflow_policy>(std::get<1>(t));
  o.restart.max_restarts = std::get<2>(t);
  o.restart.backoff = std::chrono::milliseconds(std::get<3>(t));
  o.restart.backoff_multiplier = std::get<4>(t);
  o.restart.max_backoff = std::chrono::milliseconds(std::get<5>(t));
  o.reentrant = std::get<6>(t);
  o.fail_on_ask_exception = std::get<7>(t);
  o.detached = std::get<8>(t);
  return o;
}

envelope make_envelope(envelope_kind kind, std::uint64_t target, std::uint64_t method,
                       std::vector<std::byte> payload = {}, std::uint64_t request = 0) {
  envelope e;
  e.kind = kind;
  e.target = target;
  e.method = method;
  e.request_id = request;
  e.payload = std::move(payload);
  return e;
}
envelope control(ctl code, std::vector<std::byte> payload = {}) {
  return make_envelope(envelope_kind::control, 0, static_cast<std::uint64_t>(code), std::move(payload));
}

/// True when every character of `text` is an ASCII letter or digit, or one of `others`.
bool made_of(std::string_view text, std::string_view others) {
  return std::all_of(text.begin(), text.end(), [others](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           others.find(ch) != std::string_view::npos;
  });
}

/// Why `labels` are not node labels (node_config::labels), or "" when they are.
std::string label_problem(const std::vector<std::string>& labels) {
  if (labels.size() > 32) return std::to_string(labels.size()) + " labels, more than 32";
  for (auto& l : labels) {
    if (l.empty() || l.size() > 64) return "a label of " + std::to_string(l.size()) + " characters (1 to 64)";
    if (!made_of(l, "._:=/-")) return "the label '" + l + "' has a character outside [A-Za-z0-9._:=/-]";
  }
  return {};
}

/// "HOST:PORT" (IPv6 hosts in brackets) into its parts.
std::pair<std::string, std::uint16_t> split_address(const std::string& a, const char* what) {
  auto colon = a.rfind(':');
  auto bad = [&](const char* why) {
    return std::invalid_argument(std::string(what) + " '" + a + "' is not HOST:PORT (" + why + ")");
  };
  if (colon == std::string::npos || colon == 0) throw bad("no port");
  std::string host = a.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  auto p = a.data() + colon + 1, end = a.data() + a.size();
  auto [ptr, ec] = std::from_chars(p, end, port);
  if (p == end || ec != std::errc() || ptr != end || port > 65535) throw bad("the port must be 0-65535");
  return {host, static_cast<std::uint16_t>(port)};
}

/// The TLS settings, each defaulting to its environment variable.
net::tls_config tls_settings(const std::string& cert, const std::string& key, const std::string& ca) {
  auto pick = [](const std::string& v, const char* env) {
    if (!v.empty()) return v;
    const char* e = std::getenv(env);
    return std::string(e ? e : "");
  };
  net::tls_config tls{pick(cert, "TROUPE_TLS_CERTIFICATE"), pick(key, "TROUPE_TLS_PRIVATE_KEY"), pick(ca, "TROUPE_TLS_CA")};
  // TLS is on when a certificate is named: a key or a CA alone would leave the node in plain
  // text while its operator believes it secured.
  if (!tls.enabled() && (!tls.private_key.empty() || !tls.ca.empty()))
    throw std::invalid_argument(
        "a TLS private key or CA is set but no certificate: name the certificate too (node_config::tls_certificate, "
        "--tls-cert or TROUPE_TLS_CERTIFICATE), or drop the key and CA for plain TCP");
  return tls;
}

bool wildcard(const std::string& host) { return host == "0.0.0.0" || host == "::" || host.empty(); }

// ---- the registry of remote classes ---------------------------------------------------------

struct type_registry {
  std::mutex mu;
  std::unordered_map<std::string, remote_type_entry> types;
  std::unordered_map<std::string, std::unordered_map<std::uint64_t, construct_fn>> ctors;
};
type_registry& registry() {
  static type_registry r;
  return r;
}
const remote_type_entry* find_type(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.types.find(std::string(name));
  return it == r.types.end() ? nullptr : &it->second;  // entries are never erased
}
construct_fn find_ctor(std::string_view type, std::uint64_t key) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.ctors.find(std::string(type));
  if (it == r.ctors.end()) return nullptr;
  auto c = it->second.find(key);
  return c == it->second.end() ? nullptr : c->second;
}

/// The largest payload a call or reply may carry: a frame's limit less room for the rest of
/// the envelope. A larger one is refused before it is sent (the receiver would drop the
/// connection, and every call on it).
constexpr std::uint64_t max_payload_bytes = net::wire_limits{}.max_frame_bytes - (std::uint64_t{1} << 20);

std::string too_large(std::size_t bytes, const char* what) {
  return std::string(what) + " of " + std::to_string(bytes) + " bytes is larger than the " +
         std::to_string(max_payload_bytes) + " bytes a frame may carry";
}

/// The error an exception becomes on the wire.
std::pair<errc, std::string> describe(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const error& x) {
    // what() ends with the category's text, which the receiver's error adds again.
    std::string what = x.what();
    auto suffix = ": " + x.code().message();
    if (what.size() > suffix.size() && what.ends_with(suffix)) what.resize(what.size() - suffix.size());
    return {x.code_value(), what};
  } catch (const std::exception& x) {
    return {errc::remote_exception, demangle(typeid(x).name()) + ": " + x.what()};
  } catch (...) {
    return {errc::remote_exception, "an exception that is not a std::exception"};
  }
}

std::exception_ptr error_from(const envelope& env) {
  auto code = static_cast<errc>(env.error_code);
  if (env.error_code == 0 || env.error_code > static_cast<std::uint32_t>(errc::message_too_large))
    code = errc::remote_exception;
  return std::make_exception_ptr(error(code, env.error_message));
}

}  // namespace

// ---- the node ------------------------------------------------------------------------------

class node_runtime;

/// The node whose incoming payload this thread is decoding: what an actor_ref decodes against.

/// The head's answer to a cluster-wide name: completes the registration's future, and on a
/// refusal removes the local name the registration added (only while it still names that actor).
class name_sink final : public reply_sink {
public:
  name_sink(state<void>* st, system_impl& sys, std::string name, cell_base* added) noexcept
      : inner_(st), sys_(sys), name_(std::move(name)), added_(added) {}
  ~name_sink() override {
    if (!done_) roll_back();  // the inner sink fails the future with broken_promise
  }
  void deliver(std::span<const std::byte> payload) noexcept override {
    done_ = true;
    inner_.deliver(payload);
  }
  void fail(std::exception_ptr e) noexcept override {
    done_ = true;
    roll_back();
    inner_.fail(std::move(e));
  }

private:
  void roll_back() noexcept {
    if (!added_) return;
    std::lock_guard lock(sys_.names_mutex);
    if (auto it = sys_.names.find(name_); it != sys_.names.end() && it->second.get() == added_) sys_.names.erase(it);
  }

  typed_sink<void> inner_;
  system_impl& sys_;
  std::string name_;
  cell_base* added_;
  bool done_ = false;
};

thread_local node_runtime* tls_decoding_node = nullptr;
struct decoding_scope {
  explicit decoding_scope(node_runtime* n) noexcept : saved(std::exchange(tls_decoding_node, n)) {}
  ~decoding_scope() { tls_decoding_node = saved; }
  decoding_scope(const decoding_scope&) = delete;
  decoding_scope& operator=(const decoding_scope&) = delete;
  node_runtime* saved;
};

class remote_actor {
public:
  remote_actor(std::shared_ptr<node_runtime> n, system_impl& s, node_id where, std::uint64_t wire)
      : node(std::move(n)), sys(&s), where(where), wire(wire) {
    sys->add_ref();
  }
  ~remote_actor() { sys->release(); }

  std::atomic<std::uint32_t> refs{1};
  std::shared_ptr<node_runtime> node;
  system_impl* sys;
  const node_id where;
  const std::uint64_t wire;
};

class node_runtime : public std::enable_shared_from_this<node_runtime> {
public:
  node_runtime(system_impl& sys, const node_config& cfg) : sys_(sys), cfg_(cfg) {
    if (cfg_.token.empty())
      if (const char* t = std::getenv("TROUPE_CLUSTER_TOKEN")) cfg_.token = t;
    if (cfg_.token.empty())
      throw std::invalid_argument(
          "a node needs the cluster's token: set node_config::token (--token) or TROUPE_CLUSTER_TOKEN");
    if (cfg_.heartbeat.count() <= 0 || cfg_.node_timeout <= cfg_.heartbeat)
      throw std::invalid_argument("node_config: heartbeat must be positive and below node_timeout");
    if (auto why = label_problem(cfg_.labels); !why.empty())
      throw std::invalid_argument("node_config::labels (--label): " + why);
    std::tie(listen_host_, listen_port_) = split_address(cfg_.listen, "node_config::listen (--host, --port)");
    if (!cfg_.head.empty()) std::tie(head_host_, head_port_) = split_address(cfg_.head, "node_config::head (the CLI's --address or --head)");
  }

  void start() {
    net::transport_config tc;
    tc.token = cfg_.token;
    tc.tls = tls_settings(cfg_.tls_certificate, cfg_.tls_private_key, cfg_.tls_ca);
    auto weak = weak_from_this();
    net::transport_handlers h;
    h.on_open = [weak](const std::shared_ptr<connection>& c) {
      if (auto self = weak.lock()) self->on_open(c);
    };
    h.on_envelope = [weak](const std::shared_ptr<connection>& c, envelope env) {
      if (auto self = weak.lock()) self->on_envelope(c, std::move(env));
    };
    h.on_close = [weak](const std::shared_ptr<connection>& c, const std::string& why) {
      if (auto self = weak.lock()) self->on_close(c, why);
    };
    transport_ = std::make_unique<net::transport>(io_, tc, std::move(h));
    port_ = transport_->listen(listen_host_, listen_port_);
    thread_ = std::thread([this] {
      // This thread must never wait: a call from the network into a full mailbox gets in past
      // its capacity (waiting would stop the heartbeats and every other actor's traffic), and a
      // get() in a continuation that runs here is refused instead of hanging.
      tls_on_worker() = true;
      io_.run();
    });
    arm_heartbeat();
    if (head_host_.empty()) {
      std::lock_guard lock(mu_);
      self_ = head_id;
      auto& m = members_[head_id];
      m.id = head_id;
      m.host = cfg_.advertise.empty() ? (wildcard(listen_host_) ? "127.0.0.1" : listen_host_) : cfg_.advertise;
      m.port = port_;
      m.key = net::random_nonce();
      log().info("troupe node 1 (head) listening on {}:{}", listen_host_, port_);
      return;
    }
    join();
  }

  void stop() noexcept {
    std::vector<std::unique_ptr<reply_sink>> sinks;
    std::vector<watch> watches;
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      for (auto& [id, p] : pending_) sinks.push_back(std::move(p.sink));
      pending_.clear();
      for (auto& [w, entry] : watches_)
        for (auto& x : entry.list) watches.push_back(std::move(x));
      watches_.clear();
      exported_.clear();
      awaited_.clear();
      wire_of_.clear();
      for (auto& [id, m] : members_) {
        if (m.conn && self_ != 0) m.conn->send(control(ctl::leave));  // not lost: gone on purpose
        m.conn.reset();
        m.backlog.clear();
        for (auto& s : m.in_doubt) sinks.push_back(std::move(s));
        m.in_doubt.clear();
      }
      conns_.clear();
    }
    for (auto& s : sinks)
      if (s) s->fail(std::make_exception_ptr(error(errc::system_shutdown, "this node is stopping")));
    for (auto& w : watches)
      if (w.st) w.st->fail(std::make_exception_ptr(error(errc::system_shutdown)), true);
    if (transport_) transport_->close_all("this node is stopping");
    // Let the closes go out, then stop the loop.
    asio::post(io_, [this] { work_.reset(); heartbeat_.cancel(); });
    if (thread_.joinable()) {
      auto deadline = clock_type::now() + std::chrono::milliseconds(500);
      while (!io_.stopped() && clock_type::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      io_.stop();
      thread_.join();
    }
    transport_.reset();
  }

  std::uint16_t port() const noexcept { return port_; }
  node_id self() const {
    std::lock_guard lock(mu_);
    return self_;
  }
  /// unregister_name: the head forgets the name (a tell: a later register_name from this
  /// node arrives after it).
  void forget_name(const std::string& name, cell_base* had) {
    {
      std::lock_guard lock(mu_);
      // A name of an actor that never travelled (not a TROUPE_REMOTE class) was never
      // cluster-wide: another node's actor may hold that name there.
      if (had && !wire_of_.contains(had)) return;
      if (self_ == head_id) {
        names_.erase(name);
        return;
      }
    }
    call(head_id, make_envelope(envelope_kind::tell, net::node_target, static_cast<std::uint64_t>(op::forget_name), encode(name)),
         nullptr);
  }
  /// A worker's: why it lost the head, "" while it has not.
  std::string head_lost() const {
    std::lock_guard lock(mu_);
    return head_lost_;
  }

  bool member_alive(node_id id) const {
    std::lock_guard lock(mu_);
    auto it = members_.find(id);
    return !stopped_ && it != members_.end() && it->second.alive;
  }

  /// Where an actor lives now: where it was made, unless it was re-created elsewhere.
  node_id location(node_id made_on, std::uint64_t wire) const {
    std::lock_guard lock(mu_);
    return route(made_on, wire);
  }

  // ---- calls out -------------------------------------------------------------------------

  void call(node_id to, envelope env, std::unique_ptr<reply_sink> sink) {
    std::exception_ptr failure;
    if (env.payload.size() > max_payload_bytes) {
      error e(errc::message_too_large, too_large(env.payload.size(), "a message"));
      if (!sink) throw e;  // a tell has nobody else to tell
      failure = std::make_exception_ptr(e);
    } else {
      std::lock_guard lock(mu_);
      if (env.target != net::node_target) to = route(to, env.target);
      auto it = members_.find(to);
      if (stopped_) {
        failure = std::make_exception_ptr(error(errc::system_shutdown, "this node is stopping"));
      } else if (it == members_.end() || !it->second.alive) {
        failure = std::make_exception_ptr(
            error(errc::node_lost, "node " + std::to_string(to) +
                                       (it == members_.end() ? " is not a member of the cluster" : " is lost")));
      } else {
        auto& m = it->second;
        if (sink) {
          env.kind = envelope_kind::call;
          env.request_id = next_request_++;
          pending_.emplace(env.request_id, pending_call{to, std::move(sink), m.conn != nullptr});
        }
        if (m.conn) {
          m.conn->send(std::move(env));
        } else {
          m.backlog.push_back(std::move(env));
          if (!m.dialing) dial(m);
        }
      }
    }
    if (failure) {
      if (sink) sink->fail(failure);
      else sys_.dead_letters.fetch_add(1, std::memory_order_relaxed);
    }
  }

  remote_ptr make_remote(node_id where, std::uint64_t wire) {
    return remote_ptr::adopt(new remote_actor(shared_from_this(), sys_, where, wire));
  }

  /// The address other nodes reach a local actor at (exported under it from now on).
  ref_address address_of_local(cell_base& c, std::string_view type) {
    const auto* entry = find_type(type);
    if (!entry) throw error(errc::type_mismatch, "an actor_ref of " + std::string(type) + ", which is no remote class");
    return {self(), export_local(c, type)};
  }

  /// The actor at an address decoded here: this node's own actor, or a handle to another's.
  spawned resolve(const ref_address& a, std::string_view type) {
    if (a.where != self()) return {{}, make_remote(a.where, a.wire)};
    std::lock_guard lock(mu_);
    auto it = exported_.find(a.wire);
    if (it == exported_.end() || !it->second.cell)
      throw error(errc::actor_dead, "an actor_ref to actor " + std::to_string(a.wire) + " of node " +
                                        std::to_string(a.where) + ", which is gone");
    if (!it->second.type || it->second.type->name != type)
      throw error(errc::decode_error, "an actor_ref of " + std::string(type) + " points to a " +
                                          std::string(it->second.type ? it->second.type->name : "?"));
    return {it->second.cell, {}};
  }

  spawned spawn(node_id where, std::string_view type, std::uint64_t ctor, std::vector<std::byte> args,
                const spawn_options& opts) {
    node_id self;
    std::uint64_t wire;
    {
      std::lock_guard lock(mu_);
      self = self_;
      if (where == 0) where = place();
      auto it = members_.find(where);
      if (it == members_.end() || !it->second.alive)
        throw error(errc::node_lost, "spawn_on: node " + std::to_string(where) + " is not a live member");
      ++it->second.placed;
      wire = (static_cast<std::uint64_t>(self) << wire_shift) | sys_.next_id();
    }
    if (where == self) return {construct_local(type, ctor, args, opts), {}};
    auto record = spawn_tuple{std::string(type), ctor, wire, pack(opts), std::move(args)};
    if (opts.restart.max_restarts != 0) {
      // The head re-creates it elsewhere if its node is lost.
      if (self == head_id) add_restartable(where, record);
      else call(head_id, make_envelope(envelope_kind::tell, net::node_target, static_cast<std::uint64_t>(op::restartable),
                                       encode(std::tuple<std::uint32_t, spawn_tuple>(where, record))),
                nullptr);
    }
    auto payload = encode(record);
    struct spawn_sink final : reply_sink {
      std::string what;
      void deliver(std::span<const std::byte>) noexcept override {}
      void fail(std::exception_ptr e) noexcept override {
        log().warn("spawn_on of {} failed: {}", what, describe(e).second);
      }
    };
    auto sink = std::make_unique<spawn_sink>();
    sink->what = std::string(type) + " on node " + std::to_string(where);
    call(where, make_envelope(envelope_kind::call, net::node_target, static_cast<std::uint64_t>(op::spawn), std::move(payload)),
         std::move(sink));
    return {{}, make_remote(where, wire)};
  }

  /// Blocking lookup of a cluster-wide name (asks the head).
  std::optional<spawned> lookup(std::string_view name, std::string& type) {
    found_tuple found;
    if (self() == head_id) {
      found = find_name(std::string(name));
    } else {
      auto* st = make_state<found_tuple>();
      st->set_system(&sys_);
      st->add_ref();
      future<found_tuple> f{state_ptr<found_tuple>(st)};
      call(head_id,
           make_envelope(envelope_kind::call, net::node_target, static_cast<std::uint64_t>(op::lookup), encode(std::string(name))),
           std::make_unique<typed_sink<found_tuple>>(st));
      found = std::move(f).timeout(cfg_.join_timeout).get();
    }
    auto& [ok, wire, where, t] = found;
    if (!ok) return std::nullopt;
    type = t;
    if (where == self()) {
      std::lock_guard lock(mu_);
      auto it = exported_.find(wire);
      if (it == exported_.end() || !it->second.cell) return std::nullopt;
      return spawned{it->second.cell, {}};
    }
    return spawned{{}, make_remote(where, wire)};
  }

  /// Names an actor cluster-wide. The future completes with the head's answer; on a refusal
  /// (name_taken) the local name `added` by this registration goes too.
  future<void> publish_name(const std::string& name, cell_base* local, remote_actor* remote, std::string_view type,
                            cell_base* added) {
    name_tuple t;
    if (local) {
      auto wire = export_local(*local, type);
      t = {name, wire, self(), std::string(type)};
    } else {
      t = {name, remote->wire, remote->where, std::string(type)};
    }
    auto* st = make_state<void>();
    st->set_system(&sys_);
    st->add_ref();
    future<void> f{state_ptr<void>(st)};
    auto sink = std::make_unique<name_sink>(st, sys_, name, added);
    if (self() == head_id) {
      errc code{};
      if (auto why = add_name(std::move(t), code); !why.empty()) {
        sink->fail(std::make_exception_ptr(error(code, why)));  // removes the local name it added
        throw error(code, why);  // known at once: register_name throws, even inside an actor
      }
      sink->deliver({});
      return f;
    }
    call(head_id, make_envelope(envelope_kind::call, net::node_target, static_cast<std::uint64_t>(op::register_name), encode(t)),
         std::move(sink));
    return f;
  }

  /// register_name: waits for the head's answer where a thread may wait; elsewhere the answer,
  /// a refusal, is logged.
  void await_name(const std::string& name, future<void> f) {
    if (tls_current_cell() != nullptr || tls_on_worker()) {
      std::move(f).then([] {}, [name, self = self()](std::exception_ptr e) {
        log().warn("troupe node {}: register_name(\"{}\") refused: {}", self, name, describe(e).second);
      });
      return;
    }
    std::move(f).timeout(cfg_.join_timeout).get();
  }

  void stop_remote(remote_actor& a) {
    {
      std::lock_guard lock(mu_);
      restartable_.erase(a.wire);  // stopped on purpose: not to be re-created
    }
    if (self() != head_id)
      call(head_id, make_envelope(envelope_kind::tell, net::node_target, static_cast<std::uint64_t>(op::restartable),
                                  encode(std::tuple<std::uint32_t, spawn_tuple>(0, spawn_tuple{{}, 0, a.wire, {}, {}}))),
           nullptr);
    call(location(a.where, a.wire), make_envelope(envelope_kind::tell, net::node_target, static_cast<std::uint64_t>(op::stop_actor), encode(a.wire)),
         nullptr);
  }

  /// A monitor of a remote actor: a future or an actor with on_down.
  struct watch {
    state_ptr<down_notice> st;
    cell_ptr cell;
  };

  void add_watch(remote_actor& a, watch w) {
    bool lost = false;
    node_id where;
    {
      std::lock_guard lock(mu_);
      where = route(a.where, a.wire);
      auto it = members_.find(where);
      lost = stopped_ || it == members_.end() || !it->second.alive;
      if (!lost || may_relocate(where)) {
        auto& entry = watches_[a.wire];
        entry.host = where;
        entry.list.push_back(std::move(w));
        if (lost) {  // its node is lost: the watch waits for the head's word (see watched)
          entry.held_since = it->second.lost_at;
          return;
        }
      }
    }
    if (lost) return fire(std::move(w), down_notice{a.wire, exit_reason::node_lost, "node " + std::to_string(where) + " is lost"});
    call(where, make_envelope(envelope_kind::tell, net::node_target, static_cast<std::uint64_t>(op::watch), encode(a.wire)),
         nullptr);
  }

private:
  struct member {
    node_id id = 0;
    std::string host;
    std::uint16_t port = 0;
    bool alive = true;
    std::uint64_t actors = 0;
    std::uint64_t placed = 0;  // actors this node placed there since its last load report
    std::vector<std::string> labels;  // the head's: what it joined with
    std::shared_ptr<connection> conn;
    bool dialing = false;
    bool timed_out = false;
    int redials = 0;  // redials in a row whose connection carried nothing
    clock_type::time_point lost_at{};  // when it was lost (members lost long ago are forgotten)
    bool left = false;  // gone on purpose (said goodbye): nothing of it is re-created
    std::vector<envelope> backlog;
    std::vector<std::unique_ptr<reply_sink>> in_doubt;  // written before the connection dropped
    clock_type::time_point heard = clock_type::now();
    /// The random key the head gave the node when it joined: its hello shows it, so that a peer
    /// that holds the cluster's token is not taken for a member it is not. Empty while unknown.
    std::vector<std::byte> key;
    clock_type::time_point said_hello{};  // when known from a hello alone (port 0)
  };
  /// The monitors of one remote actor. When its host is lost, the head may re-create it
  /// elsewhere (a restart policy): the watches are held, not fired, until the head says where
  /// it went (ctl::moved: they move there) or that it re-created all it will of that node
  /// (ctl::relocated: they fire node_lost). A head that never says fires them after hold_limit().
  struct watched {
    node_id host = 0;
    std::vector<watch> list;
    clock_type::time_point held_since{};  // while held; epoch when not
    bool held() const { return held_since != clock_type::time_point{}; }
  };
  /// What a change of membership sets off outside mu_: completing a future may run its
  /// continuations inline, and a call takes mu_.
  struct aftermath {
    std::vector<std::unique_ptr<reply_sink>> failed;
    std::exception_ptr failure;
    std::vector<std::pair<watch, down_notice>> fired;
    std::vector<std::pair<node_id, std::uint64_t>> rewatch;  // (host, wire): monitor it there
    std::vector<cell_ptr> orphans;  // actors whose owner went (spawn_options::detached)
    std::vector<std::pair<std::shared_ptr<connection>, envelope>> unmade;  // calls to an actor never made
  };
  struct restartable {
    node_id host = 0;
    spawn_tuple spawn;  // how to make it again (its wire id included)
    int restarts = 0;
  };

  std::chrono::milliseconds hold_limit() const { return 3 * cfg_.node_timeout; }

  /// Whether the head may still re-create actors of lost node `id` elsewhere (under mu_).
  bool may_relocate(node_id id) const {
    if (stopped_ || id == head_id) return false;
    auto m = members_.find(id);
    if (m == members_.end() || m->second.alive || m->second.left) return false;
    if (clock_type::now() - m->second.lost_at > hold_limit()) return false;
    if (self_ == head_id) return true;
    auto h = members_.find(head_id);
    return h != members_.end() && h->second.alive;
  }

  /// The watched actor `wire` lives on `to` now (under mu_): its watches go there.
  void rehost(std::uint64_t wire, node_id to, aftermath& out) {
    auto it = watches_.find(wire);
    if (it == watches_.end() || it->second.host == to) return;
    it->second.host = to;
    auto m = members_.find(to);
    if (m != members_.end() && m->second.alive) {
      it->second.held_since = {};
      out.rewatch.emplace_back(to, wire);
    } else {
      it->second.held_since = clock_type::now();  // lost as well: held (hold_limit() at most)
    }
  }

  /// Takes out the watches `pred` picks, to fire node_lost (under mu_).
  template <class Pred>
  void take_watches(Pred pred, aftermath& out) {
    for (auto w = watches_.begin(); w != watches_.end();) {
      if (!pred(w->second)) {
        ++w;
        continue;
      }
      for (auto& x : w->second.list)
        out.fired.emplace_back(std::move(x), down_notice{w->first, exit_reason::node_lost,
                                                         "node " + std::to_string(w->second.host) + " is lost"});
      w = watches_.erase(w);
    }
  }

  void post(aftermath a) {
    if (a.failed.empty() && a.fired.empty() && a.rewatch.empty() && a.orphans.empty() && a.unmade.empty()) return;
    asio::post(io_, [weak = weak_from_this(), a = std::make_shared<aftermath>(std::move(a))] {
      for (auto& s : a->failed) s->fail(a->failure);
      if (auto self = weak.lock())
        for (auto& [host, wire] : a->rewatch)
          self->call(host, make_envelope(envelope_kind::tell, net::node_target, static_cast<std::uint64_t>(op::watch), encode(wire)),
                     nullptr);
      for (auto& [w, n] : a->fired) fire(std::move(w), n);
      for (auto& c : a->orphans) c->stop(exit_reason::stopped);
      if (auto self = weak.lock())
        for (auto& [c, env] : a->unmade)
          self->refuse_call(c, env, a->failure);
    });
  }

  node_id route(node_id made_on, std::uint64_t wire) const {  // under mu_
    if (relocated_.empty()) return made_on;
    auto it = relocated_.find(wire);
    return it == relocated_.end() ? made_on : it->second;
  }

  void add_restartable(node_id host, const spawn_tuple& record) {  // head
    std::lock_guard lock(mu_);
    restartable_[std::get<2>(record)] = {host, record, 0};
  }

  /// Head: re-creates the restartable actors of a lost node (not one that left: `recreate`
  /// false) on the least-loaded live node, under the same wire id, tells every node where they
  /// are now, then that this is all (the watches of its other actors fire).
  void relocate(node_id lost, bool recreate) {
    std::vector<std::pair<node_id, spawn_tuple>> todo;
    aftermath after;
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      for (auto it = restartable_.begin(); it != restartable_.end();) {
        auto& r = it->second;
        if (r.host != lost) {
          ++it;
          continue;
        }
        if (!recreate) {
          it = restartable_.erase(it);
          continue;
        }
        int max = std::get<2>(std::get<3>(r.spawn));
        if (max >= 0 && r.restarts >= max) {
          log().warn("troupe node 1: actor {} ({}) was on lost node {} and has used its {} restarts", it->first,
                     std::get<0>(r.spawn), lost, max);
          it = restartable_.erase(it);
          continue;
        }
        node_id to = place();
        ++r.restarts;
        r.host = to;
        ++members_[to].placed;
        relocated_[it->first] = to;
        todo.emplace_back(to, r.spawn);
        auto payload = encode(moved_tuple{it->first, to});
        for (auto& [id, m] : members_)
          if (id != self_ && m.alive && m.conn) m.conn->send(control(ctl::moved, payload));
        rehost(it->first, to, after);
        log().info("troupe node 1: re-creating actor {} ({}) of lost node {} on node {}", it->first,
                   std::get<0>(r.spawn), lost, to);
        ++it;
      }
      auto payload = encode(static_cast<std::uint32_t>(lost));
      for (auto& [id, m] : members_)
        if (id != self_ && m.alive && m.conn) m.conn->send(control(ctl::relocated, payload));
      take_watches([lost](const watched& w) { return w.host == lost; }, after);
    }
    for (auto& [to, record] : todo) {
      if (to == self()) {
        if (auto failure = host_spawned(record); !failure.empty())
          log().warn("troupe node 1: re-creating actor {} failed: {}", std::get<2>(record), failure);
        continue;
      }
      struct respawn_sink final : reply_sink {
        void deliver(std::span<const std::byte>) noexcept override {}
        void fail(std::exception_ptr e) noexcept override {
          log().warn("troupe node 1: re-creating an actor failed: {}", describe(e).second);
        }
      };
      call(to, make_envelope(envelope_kind::call, net::node_target, static_cast<std::uint64_t>(op::spawn), encode(record)),
           std::make_unique<respawn_sink>());
    }
    post(std::move(after));  // (the watches go to the new hosts after the spawns)
  }
  struct pending_call {
    node_id to;
    std::unique_ptr<reply_sink> sink;
    bool written;  // handed to a connection (not waiting in a backlog)
  };
  struct exported {
    cell_ptr cell;
    const remote_type_entry* type = nullptr;
    std::string failure;           // set when construction failed
    std::vector<node_id> watchers;
    node_id owner = 0;  // the node whose end ends it (spawned from there, not detached)
  };

  class conn_responder final : public responder {
  public:
    conn_responder(std::weak_ptr<node_runtime> n, std::uint64_t conn, std::uint64_t request)
        : node_(std::move(n)), conn_(conn), request_(request) {}
    void reply(std::vector<std::byte> payload) noexcept override {
      if (payload.size() > max_payload_bytes) {
        // Sent, the frame would cost the connection (and every call on it): the caller gets why.
        auto env = make_envelope(envelope_kind::error, 0, 0, {}, request_);
        env.error_code = static_cast<std::uint32_t>(errc::message_too_large);
        env.error_message = too_large(payload.size(), "the reply");
        send(std::move(env));
        return;
      }
      send(make_envelope(envelope_kind::reply, 0, 0, std::move(payload), request_));
    }
    void error(std::exception_ptr e) noexcept override {
      auto [code, what] = describe(std::move(e));
      auto env = make_envelope(envelope_kind::error, 0, 0, {}, request_);
      env.error_code = static_cast<std::uint32_t>(code);
      env.error_message = what.substr(0, 4096);
      send(std::move(env));
    }

  private:
    void send(envelope env) noexcept {
      if (auto n = node_.lock()) n->send_on(conn_, std::move(env));
    }
    std::weak_ptr<node_runtime> node_;
    std::uint64_t conn_;
    std::uint64_t request_;
  };

  void send_on(std::uint64_t conn, envelope env) noexcept {
    std::lock_guard lock(mu_);
    auto it = conns_.find(conn);
    if (it != conns_.end()) it->second->send(std::move(env));
  }

  // ---- membership ------------------------------------------------------------------------

  void join() {
    {
      std::lock_guard lock(mu_);
      auto& m = members_[head_id];
      m.id = head_id;
      m.host = head_host_;
      m.port = head_port_;
      m.dialing = true;
    }
    transport_->connect(head_host_, head_port_, head_id, [this](const std::string& why) {
      std::lock_guard lock(mu_);
      join_error_ = why;
      joined_cv_.notify_all();
    });
    std::unique_lock lock(mu_);
    if (!joined_cv_.wait_for(lock, cfg_.join_timeout, [&] { return self_ != 0 || !join_error_.empty(); }))
      join_error_ = "no answer within " + std::to_string(cfg_.join_timeout.count()) + " ms";
    if (self_ == 0) {
      auto why = join_error_;
      lock.unlock();
      stop();
      throw error(errc::connection_lost, "cannot join the head at " + cfg_.head + ": " + why);
    }
  }

  void on_open(const std::shared_ptr<connection>& c) {
    std::lock_guard lock(mu_);
    if (stopped_) return c->close("this node is stopping");
    conns_[c->id()] = c;
    if (!c->outbound()) return;  // the peer says who it is (hello or join)
    node_id to = static_cast<node_id>(c->tag());
    if (to == head_id && self_ == 0) {
      // Joining: say where this node can be reached.
      std::string host = cfg_.advertise;
      if (host.empty()) host = wildcard(listen_host_) ? c->local_host() : listen_host_;
      c->send(control(ctl::join, encode(join_tuple(host, port_, cfg_.labels))));
      auto& m = members_[head_id];
      m.conn = c;
      m.dialing = false;
      m.heard = clock_type::now();
      conn_node_[c->id()] = head_id;
      return;
    }
    c->send(control(ctl::hello, encode(hello_tuple(self_, members_[self_].key))));
    attach(to, c);
  }

  /// Makes `c` the connection to `to` and sends what waited for it (under mu_).
  void attach(node_id to, const std::shared_ptr<connection>& c) {
    conn_node_[c->id()] = to;
    auto it = members_.find(to);
    if (it == members_.end() || !it->second.alive) return;
    auto& m = it->second;
    m.heard = clock_type::now();
    m.dialing = false;
    m.timed_out = false;
    if (m.conn && m.conn->is_open()) return;
    m.conn = c;
    if (!m.in_doubt.empty()) {
      // The redial succeeded: the peer lives, but the calls written before the drop may or
      // may not have run, and are never sent twice.
      auto failure = std::make_exception_ptr(error(
          errc::connection_lost, "the connection to node " + std::to_string(to) +
                                     " dropped after the call was sent (it may have run)"));
      asio::post(io_, [sinks = std::make_shared<std::vector<std::unique_ptr<reply_sink>>>(std::move(m.in_doubt)), failure] {
        for (auto& s : *sinks) s->fail(failure);
      });
      m.in_doubt.clear();
    }
    for (auto& env : m.backlog) {
      if (env.kind == envelope_kind::call)
        if (auto p = pending_.find(env.request_id); p != pending_.end()) p->second.written = true;
      c->send(std::move(env));
    }
    m.backlog.clear();
  }

  void dial(member& m) {
    m.dialing = true;
    auto weak = weak_from_this();
    node_id id = m.id;
    transport_->connect(m.host, m.port, id, [weak, id](const std::string& why) {
      if (auto self = weak.lock()) self->lose(id, why);
    });
  }

  std::vector<member_tuple> member_list() const {
    std::vector<member_tuple> out;
    for (auto& [id, m] : members_) out.emplace_back(id, m.host, m.port, m.alive, m.actors, m.key);
    return out;
  }

  void broadcast_members() {  // head, under mu_
    auto payload = encode(member_list());
    for (auto& [id, m] : members_)
      if (id != self_ && m.alive && m.conn) m.conn->send(control(ctl::members, payload));
  }

  void on_members(const std::vector<member_tuple>& list) {  // worker, under mu_
    std::vector<node_id> lost;
    std::unordered_set<node_id> listed;
    for (auto& [id, host, port, alive, actors, key] : list) {
      listed.insert(id);
      largest_id_ = std::max(largest_id_, static_cast<node_id>(id));
      if (id == self_) continue;
      auto [it, fresh] = members_.try_emplace(id);
      auto& m = it->second;
      if (m.key != key) {
        // Known so far from a hello alone, and the hello did not show the key the head gave
        // that node: the peer was not it.
        if (!m.key.empty() && m.conn) {
          log().warn("troupe node {}: a peer said it was node {} without that node's key; closing its connection", self_, id);
          m.conn->refuse("hello with another node's id");
          conn_node_.erase(m.conn->id());
          m.conn.reset();
          // What went to it went to no node: failed, not left waiting.
          auto failure = std::make_exception_ptr(error(errc::connection_lost, "the peer that took the call was not node " + std::to_string(id)));
          auto sinks = std::make_shared<std::vector<std::unique_ptr<reply_sink>>>(take_calls_to(id, true));
          asio::post(io_, [sinks, failure] {
            for (auto& s : *sinks) s->fail(failure);
          });
        }
        m.key = key;
      }
      if (fresh || m.port == 0) {  // new, or known only from its hello so far
        m.id = id;
        m.host = host;
        m.port = port;
      }
      m.actors = actors;
      m.placed = 0;
      if (!alive && m.alive) lost.push_back(id);
    }
    // A node the head no longer lists was forgotten there, long after it was lost.
    std::vector<node_id> unknown;
    const auto now = clock_type::now();
    for (auto& [id, m] : members_) {
      if (id == self_ || id == head_id || listed.contains(id) || !m.alive) continue;
      if (m.port != 0) lost.push_back(id);
      // Known from a hello alone, and still not listed a node_timeout later (the head lists a
      // node before it welcomes it): no node the head made.
      else if (now - m.said_hello > cfg_.node_timeout) unknown.push_back(id);
    }
    for (auto id : lost) lose_locked(id, "the head reports it gone", gone::reported);
    for (auto id : unknown) lose_locked(id, "it said hello as a node the head does not know");
    std::erase_if(members_, [&](const auto& kv) {
      return kv.first != self_ && kv.first != head_id && !kv.second.alive && !listed.contains(kv.first);
    });
  }

  node_id place() const {  // under mu_: the live member with the fewest actors
    node_id best = self_;
    std::uint64_t best_load = ~std::uint64_t{0};
    for (auto& [id, m] : members_) {
      if (!m.alive) continue;
      std::uint64_t load = (id == self_ ? sys_.live_count.load(std::memory_order_relaxed) : m.actors) + m.placed;
      if (load < best_load) best = id, best_load = load;
    }
    return best;
  }

  // ---- failure detection -----------------------------------------------------------------

  void arm_heartbeat() {
    heartbeat_.expires_after(cfg_.heartbeat);
    heartbeat_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->beat();
    });
  }

  void beat() {
    std::vector<std::pair<std::uint64_t, std::vector<early_call>>> never_came;
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      auto now = clock_type::now();
      // When this node itself stalled (its loop ran late), silence from others proves nothing:
      // they get a fresh period instead of being declared lost for this node's delay.
      if (now - last_beat_ > 2 * cfg_.heartbeat)
        for (auto& [id, m] : members_) m.heard = std::max(m.heard, now - cfg_.heartbeat);
      last_beat_ = now;
      for (auto& [cid, t] : told_lost_)
        if (now - t.since > cfg_.node_timeout) t.conn->close("a lost node's connection, still open after it was told");
      for (auto e = awaited_.begin(); e != awaited_.end();) {
        if (now - e->second.since > forget_after) {
          send_down_to(e->second.watchers, down_tuple{e->first, static_cast<std::uint8_t>(exit_reason::stopped), "no such actor"});
          never_came.emplace_back(e->first, std::move(e->second.calls));
          e = awaited_.erase(e);
        } else {
          ++e;
        }
      }
      // Bytes of a large frame still arriving count as hearing from the peer (on whichever of
      // the two connections between a pair they come).
      for (auto& [cid, c] : conns_)
        if (auto n = conn_node_.find(cid); n != conn_node_.end())
          if (auto m = members_.find(n->second); m != members_.end()) m->second.heard = std::max(m->second.heard, c->last_read());
      std::uint64_t actors = sys_.live_count.load(std::memory_order_relaxed);
      auto payload = encode(actors);
      std::vector<std::pair<node_id, std::string>> lost_now;
      for (auto& [id, m] : members_) {
        if (id == self_ || !m.alive) continue;
        if (m.conn) {
          if (now - m.heard > cfg_.node_timeout) {
            const auto why = "no heartbeat from node " + std::to_string(id) + " for " +
                             std::to_string(cfg_.node_timeout.count()) + " ms";
            m.timed_out = true;
            // A connection closed already says so no more: lose the node here.
            if (!m.conn->is_open()) lost_now.push_back({id, why});
            else m.conn->close(why);
          } else {
            m.conn->send(control(ctl::heartbeat, payload));
          }
        }
      }
      for (auto& [id, why] : lost_now) lose_locked(id, why);
      aftermath after;
      take_watches([&](const watched& w) { return w.held() && now - w.held_since > hold_limit(); }, after);
      post(std::move(after));
      if (self_ == head_id) {
        self_member().actors = actors;
        if (++beats_ % 10 == 0) {
          // Nodes lost or gone more than forget_after ago are forgotten (every node learnt of
          // it from earlier broadcasts); their ids are never given again.
          std::erase_if(members_, [now](const auto& kv) { return !kv.second.alive && now - kv.second.lost_at > forget_after; });
          broadcast_members();
        }
      }
    }
    for (auto& [wire, calls] : never_came)
      for (auto& [c, env] : calls) refuse_call(c, env, std::make_exception_ptr(error(errc::actor_dead, no_actor(wire))));
    arm_heartbeat();
  }

  member& self_member() { return members_[self_]; }

  void on_close(const std::shared_ptr<connection>& c, const std::string& why) {
    if (!c) return;
    std::lock_guard lock(mu_);
    conns_.erase(c->id());
    told_lost_.erase(c->id());
    if (self_ == 0 && c->outbound() && c->tag() == head_id) {
      join_error_ = why;
      joined_cv_.notify_all();
      return;
    }
    auto it = conn_node_.find(c->id());
    if (it == conn_node_.end()) {
      // A dial that reached the peer but never finished the handshake counts as a failed dial.
      if (stopped_ || !c->outbound() || c->tag() == 0) return;
      auto m = members_.find(static_cast<node_id>(c->tag()));
      if (m != members_.end() && m->second.alive && !m->second.conn) lose_locked(m->first, why);
      return;
    }
    node_id id = it->second;
    conn_node_.erase(it);
    if (stopped_) return;
    auto m = members_.find(id);
    if (m == members_.end() || !m->second.alive || m->second.conn != c) return;
    m->second.conn.reset();
    if (m->second.timed_out || (self_ == 0 && id == head_id)) return lose_locked(id, why);
    // A dropped connection: redial once. If the peer answers, it lives: the calls already
    // written fail (they may have run), the queued ones go out on the new connection.
    if (++m->second.redials > max_redials)
      return lose_locked(id, why + " (again after " + std::to_string(max_redials) + " redials in a row)");
    log().info("troupe node {}: connection to node {} closed ({}); redialling", self_, id, why);
    for (auto& s : take_calls_to(id, true)) m->second.in_doubt.push_back(std::move(s));
    dial(m->second);
  }

  /// Takes the pending calls to `id` (only those handed to a connection when `written_only`)
  /// out of pending_ (under mu_).
  std::vector<std::unique_ptr<reply_sink>> take_calls_to(node_id id, bool written_only) {
    std::vector<std::unique_ptr<reply_sink>> out;
    for (auto p = pending_.begin(); p != pending_.end();) {
      if (p->second.to == id && (p->second.written || !written_only)) {
        out.push_back(std::move(p->second.sink));
        p = pending_.erase(p);
      } else {
        ++p;
      }
    }
    return out;
  }

  void lose(node_id id, const std::string& why) {
    std::lock_guard lock(mu_);
    lose_locked(id, why);
  }

  /// How a node went: lost here, left (said goodbye), or reported gone by the head (which
  /// logged the reason; here it is news).
  enum class gone { lost, left, reported };

  void lose_locked(node_id id, const std::string& why, gone how = gone::lost) {
    const bool left = how == gone::left;
    if (id == self_) {  // whatever a peer says, this node is not lost to itself
      if (auto me = members_.find(id); me != members_.end()) me->second.dialing = false;  // (a failed dial to itself)
      return;
    }
    auto it = members_.find(id);
    if (it == members_.end() || !it->second.alive || stopped_) return;
    auto& m = it->second;
    m.alive = false;
    m.lost_at = clock_type::now();
    m.left = left;
    m.dialing = false;
    if (m.conn) m.conn->close("node " + std::to_string(id) + " is lost");
    m.conn.reset();
    std::size_t dropped = 0;
    for (auto& env : m.backlog)
      if (env.kind == envelope_kind::tell) ++dropped;
    m.backlog.clear();
    sys_.dead_letters.fetch_add(dropped, std::memory_order_relaxed);
    if (left)
      log().info("troupe node {}: node {} ({}:{}) left the cluster", self_, id, m.host, m.port);
    else if (how == gone::reported)
      log().info("troupe node {}: node {} ({}:{}) is gone: {}", self_, id, m.host, m.port, why);
    else
      log().warn("troupe node {}: node {} ({}:{}) is lost: {}", self_, id, m.host, m.port, why);
    if (id == head_id && self_ != head_id) {
      head_lost_ = left ? "the head left the cluster" : why;
      // A head that stopped in order (the end of a run) is no failure; one that went silent is.
      log().log(left ? spdlog::level::warn : spdlog::level::err,
                "troupe node {}: the head {}, so this node is out of the cluster: names, lookups and the "
                "head's placement are gone (calls to the actors and nodes it knows still go through); "
                "restart it to join again",
                self_, left ? "left the cluster" : "is lost");
    }
    aftermath after;
    after.failure = std::make_exception_ptr(error(errc::node_lost, "node " + std::to_string(id) + " is lost: " + why));
    after.failed = std::move(m.in_doubt);
    m.in_doubt.clear();
    for (auto& s : take_calls_to(id, false)) after.failed.push_back(std::move(s));
    // Watches of its actors: those the head re-created already go to their new host; the
    // others wait for the head's word when it may still re-create them (see watched).
    const bool hold = may_relocate(id);
    for (auto& [wire, w] : watches_) {
      if (w.host != id) continue;
      if (auto to = route(id, wire); to != id) rehost(wire, to, after);
      else if (hold) w.held_since = m.lost_at;
    }
    // Without a head nothing is re-created any more: what waited for it fires.
    const bool headless = id == head_id && self_ != head_id;
    take_watches([id, headless](const watched& w) { return (w.host == id && !w.held()) || (headless && w.held()); }, after);
    for (auto& [wire, e] : exported_) {
      std::erase(e.watchers, id);
      if (e.owner == id && e.cell) after.orphans.push_back(e.cell);
    }
    // Calls and watches waiting for an actor the lost node was spawning here: its spawn will
    // not come.
    for (auto e = awaited_.begin(); e != awaited_.end();) {
      if ((e->first >> wire_shift) == id) {
        send_down_to(e->second.watchers, down_tuple{e->first, static_cast<std::uint8_t>(left ? exit_reason::stopped : exit_reason::node_lost),
                                                    "never made: node " + std::to_string(id) + ", which was spawning it, " +
                                                        (left ? "left" : "is lost")});
        for (auto& call : e->second.calls) after.unmade.push_back(std::move(call));
        e = awaited_.erase(e);
      } else {
        ++e;
      }
    }
    if (!after.orphans.empty())
      log().info("troupe node {}: stopping {} actor(s) that node {} spawned here (not detached)", self_, after.orphans.size(), id);
    if (self_ == head_id) {
      std::erase_if(names_, [id](const auto& kv) { return std::get<2>(kv.second) == id; });
      // Nor are they re-created elsewhere.
      std::erase_if(restartable_, [id](const auto& kv) {
        return (kv.first >> wire_shift) == id && !std::get<8>(std::get<3>(kv.second.spawn));
      });
      broadcast_members();
      asio::post(io_, [weak = weak_from_this(), id, left] {
        if (auto self = weak.lock()) self->relocate(id, !left);
      });
    }
    post(std::move(after));
  }

  static void fire(watch w, const down_notice& n) {
    if (w.st) w.st->complete_value(true, n);
    if (w.cell) send_down_notice(*w.cell, n);
  }

  // ---- envelopes in ----------------------------------------------------------------------

  void on_envelope(const std::shared_ptr<connection>& c, envelope env) {
    node_id from = 0;
    {
      std::lock_guard lock(mu_);
      if (told_lost_.contains(c->id())) return;  // a lost node's connection (see ctl::hello)
      if (auto it = conn_node_.find(c->id()); it != conn_node_.end()) {
        from = it->second;
        if (auto m = members_.find(from); m != members_.end()) {
          m->second.heard = clock_type::now();
          m->second.redials = 0;
        }
      }
    }
    // A connection that has not said which node it is (no join, no hello) may only do that, or
    // ask the head for the cluster's status (`troupe status`): the rest is between members.
    if (from == 0 && !(env.kind == envelope_kind::control &&
                       (env.method == static_cast<std::uint64_t>(ctl::join) || env.method == static_cast<std::uint64_t>(ctl::hello))) &&
        !(env.kind == envelope_kind::call && env.target == net::node_target &&
          env.method == static_cast<std::uint64_t>(op::cluster_status)))
      return c->refuse(std::string("a ") + std::string(net::to_string(env.kind)) +
                      " envelope on a connection that has not said which node it is (join or hello first)");
    decoding_scope decoding(this);  // actor_refs in the payload resolve against this node
    try {
      switch (env.kind) {
        case envelope_kind::control: return on_control(c, from, std::move(env));
        case envelope_kind::call:
        case envelope_kind::tell:
          if (env.target == net::node_target) return on_op(c, from, std::move(env));
          return on_call(c, std::move(env));
        case envelope_kind::reply:
        case envelope_kind::error: return on_reply(c, from, std::move(env));
      }
    } catch (const std::exception& e) {
      // A peer that sends what cannot be decoded is closed; the node goes on.
      c->refuse(std::string("bad ") + std::string(net::to_string(env.kind)) + " envelope: " + e.what());
    }
  }

  void on_control(const std::shared_ptr<connection>& c, node_id from, envelope env) {
    switch (static_cast<ctl>(env.method)) {
      case ctl::heartbeat: {
        auto actors = decode<std::uint64_t>(env.payload);
        std::lock_guard lock(mu_);
        if (auto m = members_.find(from); m != members_.end()) {
          m->second.actors = actors;
          m->second.placed = 0;
        }
        return;
      }
      case ctl::join: {
        auto [host, port, labels] = decode<join_tuple>(env.payload);
        std::lock_guard lock(mu_);
        if (self_ != head_id) return c->refuse("join sent to a node that is not the head");
        if (auto known = conn_node_.find(c->id()); known != conn_node_.end())
          return c->refuse("a second join on the connection of node " + std::to_string(known->second));
        if (port == 0) return c->refuse("a join without a port to reach the node at");
        if (host.size() > 255 || !made_of(host, ".-:_%"))
          return c->refuse("a join whose host is not a host name or an IP address (" + std::to_string(host.size()) +
                          " bytes)");
        if (auto why = label_problem(labels); !why.empty()) return c->refuse("a join with bad labels: " + why);
        node_id id = next_node_++;
        auto& m = members_[id];
        m.id = id;
        m.host = host.empty() ? c->remote_host() : host;
        m.port = port;
        m.labels = std::move(labels);
        m.conn = c;
        m.key = net::random_nonce();
        conn_node_[c->id()] = id;
        log().info("troupe node 1: node {} joined from {}:{}", id, m.host, m.port);
        c->send(control(ctl::welcome, encode(std::tuple<std::uint32_t, std::vector<member_tuple>>(id, member_list()))));
        broadcast_members();
        return;
      }
      case ctl::welcome: {
        auto [id, list] = decode<std::tuple<std::uint32_t, std::vector<member_tuple>>>(env.payload);
        std::lock_guard lock(mu_);
        if (self_ != 0) return;
        if (!c->outbound() || c->tag() != head_id) return c->refuse("a welcome from a node that is not the head");
        if (id <= head_id) return c->refuse("a welcome that gives this node id " + std::to_string(id));
        std::vector<std::byte> key;
        for (auto& t : list)
          if (std::get<0>(t) == id) key = std::get<5>(t);
        if (key.empty()) return c->refuse("a welcome without this node's key");
        self_ = id;
        auto& me = members_[id];
        me.id = id;
        me.key = std::move(key);
        me.host = cfg_.advertise.empty() ? (wildcard(listen_host_) ? c->local_host() : listen_host_) : cfg_.advertise;
        me.port = port_;
        on_members(list);
        members_[head_id].alive = true;
        log().info("troupe node {}: joined the head at {}", id, cfg_.head);
        joined_cv_.notify_all();
        return;
      }
      case ctl::hello: {
        auto [id, key] = decode<hello_tuple>(env.payload);
        std::lock_guard lock(mu_);
        // This node's own id comes with its own key only: a node dials itself to reach an actor
        // of another node that was re-created here (moved_tuple).
        if (id == 0 || (id == self_ && key != members_[self_].key))
          return c->refuse("hello from a peer that says it is node " + std::to_string(id) + ", which it is not");
        if (auto known = conn_node_.find(c->id()); known != conn_node_.end())
          return c->refuse("a second hello on the connection of node " + std::to_string(known->second));
        auto m = members_.find(id);
        // Ids are given in order and never again: one this node has seen given out but no
        // longer knows was lost long ago and forgotten.
        const bool forgotten = m == members_.end() && id != self_ && id < (self_ == head_id ? next_node_ : largest_id_ + 1);
        if (m != members_.end() && !m->second.key.empty() && m->second.key != key)
          return c->refuse("hello from a peer that says it is node " + std::to_string(id) + " without that node's key");
        if (m == members_.end() && !forgotten) {
          // A node this one has not heard of yet: the head's news may be on its way. Its key
          // is checked then (on_members). (Until then, a peer with the token that said hello
          // first under that id keeps the real node out: members trust the token's holders.)
          if (self_ == head_id) return c->refuse("hello from node " + std::to_string(id) + ", which never joined");
          members_[id].id = id;
          members_[id].alive = true;
          members_[id].key = key;
          members_[id].said_hello = clock_type::now();
        } else if (forgotten || !m->second.alive) {
          // Tell it, so that it stops dialling this node (it may have been only stalled). What
          // else comes on this connection (the calls it had queued) is dropped: they already
          // failed there with node_lost. It closes the connection; beat() does if it does not.
          c->send(control(ctl::lost, {}));
          told_lost_[c->id()] = {c, clock_type::now()};
          return;
        }
        attach(id, c);
        return;
      }
      case ctl::moved: {
        auto [wire, to] = decode<moved_tuple>(env.payload);
        aftermath after;
        {
          std::lock_guard lock(mu_);
          if (from != head_id) return c->refuse("a moved notice from node " + std::to_string(from) + ": only the head sends it");
          relocated_[wire] = to;
          rehost(wire, to, after);
        }
        post(std::move(after));
        return;
      }
      case ctl::relocated: {
        auto lost = decode<std::uint32_t>(env.payload);
        aftermath after;
        {
          std::lock_guard lock(mu_);
          if (from != head_id) return c->refuse("a relocated notice from node " + std::to_string(from) + ": only the head sends it");
          take_watches([lost](const watched& w) { return w.host == lost; }, after);
        }
        post(std::move(after));
        return;
      }
      case ctl::lost: {
        std::lock_guard lock(mu_);
        if (from == 0) return c->refuse("a lost notice on a connection of no node");
        lose_locked(from, "node " + std::to_string(from) + " counts this node as lost (it missed this node's heartbeats)");
        return;
      }
      case ctl::leave: {
        std::lock_guard lock(mu_);
        if (from != 0) lose_locked(from, "it left the cluster", gone::left);
        return;
      }
      case ctl::members: {
        auto list = decode<std::vector<member_tuple>>(env.payload);
        std::lock_guard lock(mu_);
        // The head keeps the list; the others take it from the head alone.
        if (self_ == head_id || from != head_id)
          return c->refuse("a member list from node " + std::to_string(from) + ": only the head sends it");
        on_members(list);
        return;
      }
      case ctl::down: {
        auto [wire, reason, what] = decode<down_tuple>(env.payload);
        if (reason > static_cast<std::uint8_t>(exit_reason::node_lost))
          throw error(errc::decode_error, "unknown exit reason");
        std::vector<watch> list;
        {
          std::lock_guard lock(mu_);
          if (self_ == head_id)  // the names of an actor that is gone (one may have been named after it went)
            std::erase_if(names_, [wire](const auto& kv) { return std::get<1>(kv.second) == wire; });
          auto it = watches_.find(wire);
          if (it == watches_.end()) return;
          list = std::move(it->second.list);
          watches_.erase(it);
        }
        down_notice n{wire, static_cast<exit_reason>(reason), what};
        for (auto& w : list) fire(std::move(w), n);
        return;
      }
      default:
        return c->refuse("unknown control code " + std::to_string(env.method));
    }
  }

  void on_reply(const std::shared_ptr<connection>& c, node_id from, envelope env) {
    std::unique_ptr<reply_sink> sink;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(env.request_id);
      if (it == pending_.end()) return;  // timed out or failed already
      // Only the node that was called answers: a reply from another is a confused or lying peer.
      if (it->second.to != from)
        return c->refuse("a reply to call " + std::to_string(env.request_id) + " from node " + std::to_string(from) +
                        ", which was made to node " + std::to_string(it->second.to));
      sink = std::move(it->second.sink);
      pending_.erase(it);
    }
    if (env.kind == envelope_kind::reply) sink->deliver(env.payload);
    else sink->fail(error_from(env));
  }

  void on_call(const std::shared_ptr<connection>& c, envelope env) {
    std::shared_ptr<responder> r;
    if (env.kind == envelope_kind::call)
      r = std::make_shared<conn_responder>(weak_from_this(), c->id(), env.request_id);
    cell_ptr target;
    const remote_type_entry* type = nullptr;
    std::string failure;
    {
      std::lock_guard lock(mu_);
      auto it = exported_.find(env.target);
      if (it != exported_.end()) {
        target = it->second.cell;
        type = it->second.type;
        failure = it->second.failure;
      } else if ((env.target >> wire_shift) != self_ && !gone_.contains(env.target) && !stopped_) {
        // An actor another node spawns here, whose spawn may still be on its way (a ref to it
        // can travel faster, on another connection): the call waits for it, forget_after at
        // most, and runs in arrival order when it comes (host_spawned).
        auto& early = awaiting(env.target);
        if (early.calls.size() < remembered_gone) {
          early.calls.emplace_back(c, std::move(env));
          return;
        }
      }
    }
    auto refuse = [&](errc code, std::string what) { refuse_call(c, env, std::make_exception_ptr(error(code, what))); };
    if (!failure.empty()) return refuse(errc::actor_dead, failure);
    if (!target) return refuse(errc::actor_dead, no_actor(env.target));
    if (!type)
      return refuse(errc::decode_error, "actor " + std::to_string(env.target) + " on node " + std::to_string(self()) +
                                            " is of a class this program does not declare remote");
    dispatch_fn fn = nullptr;
    for (auto& [id, f] : type->methods)
      if (id == env.method) fn = f;
    if (!fn)
      return refuse(errc::decode_error, std::string(type->name) + " has no remote method with id " +
                                            std::to_string(env.method) + " (do both programs list the same TROUPE_REMOTE methods?)");
    try {
      fn(*target, env.payload, r);
    } catch (...) {
      auto [code, what] = describe(std::current_exception());
      refuse(code, "arguments of a call to " + std::string(type->name) + ": " + what);
    }
  }

  /// Answers a call with `e` (a tell: a dead letter).
  void refuse_call(const std::shared_ptr<connection>& c, const envelope& env, std::exception_ptr e) {
    if (env.kind == envelope_kind::call) conn_responder(weak_from_this(), c->id(), env.request_id).error(std::move(e));
    else sys_.dead_letters.fetch_add(1, std::memory_order_relaxed);
  }

  std::string no_actor(std::uint64_t wire) const {
    return "no actor " + std::to_string(wire) + " on node " + std::to_string(self()) + " (stopped, or never spawned)";
  }

  /// Makes an actor another node spawns here (or the head re-creates here): exports it, or
  /// remembers why it failed (returned) for the calls on their way; then runs the calls and
  /// watches that came first. On the I/O thread, so no call comes in between.
  std::string host_spawned(const spawn_tuple& record) {
    const auto& [type, ctor, wire, opts, args] = record;
    cell_ptr cell;
    std::string failure;
    try {
      cell = construct_local(type, ctor, args, unpack(opts));
    } catch (...) {
      failure = "constructing " + type + " on node " + std::to_string(self()) + " failed: " +
                describe(std::current_exception()).second;
    }
    if (cell) {
      export_spawned(wire, *cell, type, opts);
    } else {
      std::lock_guard lock(mu_);
      exported_[wire].failure = failure;
      // Remembered for the calls that were on their way, as long as the gone are.
      failed_order_.push_back(wire);
      if (failed_order_.size() > remembered_gone) {
        if (auto old = exported_.find(failed_order_.front()); old != exported_.end() && !old->second.cell)
          exported_.erase(old);
        failed_order_.pop_front();
      }
    }
    awaited early;
    {
      std::lock_guard lock(mu_);
      if (auto e = awaited_.extract(wire)) early = std::move(e.mapped());
      // (A made actor's watchers were taken by export_at.)
      if (!cell) send_down_to(early.watchers, down_tuple{wire, static_cast<std::uint8_t>(exit_reason::failed), failure});
    }
    for (auto& [c, env] : early.calls) on_call(c, std::move(env));
    return failure;
  }

  void on_op(const std::shared_ptr<connection>& c, node_id from, envelope env) {
    std::shared_ptr<responder> r;
    if (env.kind == envelope_kind::call)
      r = std::make_shared<conn_responder>(weak_from_this(), c->id(), env.request_id);
    auto answer = [&](std::vector<std::byte> payload) {
      if (r) r->reply(std::move(payload));
    };
    try {
      switch (static_cast<op>(env.method)) {
        case op::spawn: {
          const auto record = decode<spawn_tuple>(env.payload);
          const auto wire = std::get<2>(record);
          {
            // The wire id is the spawner's (its node id above wire_shift), or the one a lost
            // node's actor had when the head re-creates it; and it is nobody's here yet.
            std::lock_guard lock(mu_);
            if ((wire >> wire_shift) != from && from != head_id)
              throw error(errc::decode_error, "node " + std::to_string(from) + " spawns under wire id " +
                                                  std::to_string(wire) + ", which is not of its ids");
            if (exported_.contains(wire))
              throw error(errc::decode_error, "wire id " + std::to_string(wire) + " is taken on node " +
                                                  std::to_string(self_) + " already");
          }
          if (auto failure = host_spawned(record); !failure.empty()) throw error(errc::actor_dead, failure);
          return answer({});
        }
        case op::lookup: {
          return answer(encode(find_name(decode<std::string>(env.payload))));
        }
        case op::register_name: {
          const auto t = decode<name_tuple>(env.payload);
          errc code{};
          if (auto why = add_name(t, code); !why.empty()) {
            if (r) throw error(code, why);
            log().warn("troupe node {}: {}; refused for actor {} on node {}", self(), why, std::get<1>(t), std::get<2>(t));
          }
          return answer({});
        }
        case op::forget_name: {
          auto name = decode<std::string>(env.payload);
          std::lock_guard lock(mu_);
          names_.erase(name);
          return;
        }
        case op::unregister_name: {  // every name of an actor that is gone
          auto wire = decode<std::uint64_t>(env.payload);
          std::lock_guard lock(mu_);
          std::erase_if(names_, [wire](const auto& kv) { return std::get<1>(kv.second) == wire; });
          return;
        }
        case op::stop_actor: {
          auto wire = decode<std::uint64_t>(env.payload);
          cell_ptr cell;
          {
            std::lock_guard lock(mu_);
            if (auto it = exported_.find(wire); it != exported_.end()) cell = it->second.cell;
          }
          if (cell) cell->stop(exit_reason::stopped);
          return;
        }
        case op::watch: {
          auto wire = decode<std::uint64_t>(env.payload);
          std::lock_guard lock(mu_);
          auto it = exported_.find(wire);
          if (it != exported_.end() && it->second.cell) {
            if (std::find(it->second.watchers.begin(), it->second.watchers.end(), from) == it->second.watchers.end())
              it->second.watchers.push_back(from);
          } else if (it == exported_.end() && (wire >> wire_shift) != self_ && from != 0 && !gone_.contains(wire)) {
            // Spawned here by another node, whose spawn may still be on its way (it travels on
            // another connection): the watch waits for it, forget_after at most.
            auto& early = awaiting(wire);
            if (std::find(early.watchers.begin(), early.watchers.end(), from) == early.watchers.end()) early.watchers.push_back(from);
          } else if (c) {
            // A spawn that failed says why; otherwise it is gone (or never was).
            const bool failed = it != exported_.end() && !it->second.failure.empty();
            c->send(control(ctl::down, encode(down_tuple{wire, static_cast<std::uint8_t>(failed ? exit_reason::failed : exit_reason::stopped),
                                                         failed ? it->second.failure : std::string("no such actor")})));
          }
          return;
        }
        case op::restartable: {
          auto [host, record] = decode<std::tuple<std::uint32_t, spawn_tuple>>(env.payload);
          if (self() != head_id) throw error(errc::decode_error, "restart records go to the head");
          if (host == 0) {  // stopped on purpose
            std::lock_guard lock(mu_);
            restartable_.erase(std::get<2>(record));
          } else {
            add_restartable(host, record);
          }
          return;
        }
        case op::node_stats: return answer(encode(local_status()));
        case op::cluster_status:
          if (!r) throw error(errc::decode_error, "cluster_status is a call, not a tell");
          return gather_status(r);
      }
      throw error(errc::decode_error, "unknown node operation " + std::to_string(env.method));
    } catch (...) {
      if (r) r->error(std::current_exception());
      else throw;
    }
  }

  // ---- actors here -----------------------------------------------------------------------

  cell_ptr construct_local(std::string_view type, std::uint64_t ctor, std::span<const std::byte> args,
                           const spawn_options& opts) {
    decoding_scope decoding(this);
    auto fn = find_ctor(type, ctor);
    if (!fn) {
      if (!find_type(type))
        throw std::invalid_argument("spawn_on: node " + std::to_string(self()) + " does not know the class '" +
                                    std::string(type) + "' (declare it with TROUPE_REMOTE in the program or a loaded library)");
      throw std::invalid_argument("spawn_on: node " + std::to_string(self()) + " knows no constructor of " +
                                  std::string(type) + " with these argument types (declare it with TROUPE_REMOTE_CTOR)");
    }
    if (!sys_.facade) throw error(errc::system_shutdown, "the actor system is gone");
    return fn(*sys_.facade, args, opts);
  }

  /// The wire id other nodes call `c` by: the one it was spawned or first exported under, so
  /// that every ref to it anywhere compares equal.
  std::uint64_t export_local(cell_base& c, std::string_view type) {
    {
      std::lock_guard lock(mu_);
      if (auto it = wire_of_.find(&c); it != wire_of_.end()) return it->second;
    }
    auto wire = (static_cast<std::uint64_t>(self()) << wire_shift) | c.id();
    export_at(wire, c, find_type(type));
    return wire;
  }

  void export_at(std::uint64_t wire, cell_base& c, const remote_type_entry* type) {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;  // nothing is exported by a node that is stopping
      auto [it, fresh] = exported_.try_emplace(wire);
      if (!fresh && it->second.cell) return;
      it->second.cell = cell_ptr(&c);
      it->second.type = type;
      wire_of_.try_emplace(&c, wire);
      if (auto e = awaited_.find(wire); e != awaited_.end()) it->second.watchers = std::move(e->second.watchers);
    }
    struct on_gone final : down_callback {
      std::weak_ptr<node_runtime> node;
      std::uint64_t wire;
      void notify(const down_notice& n) noexcept override {
        if (auto self = node.lock()) self->exported_down(wire, n);
      }
      bool abandoned() const noexcept override { return node.expired(); }
    };
    auto cb = std::make_unique<on_gone>();
    cb->node = weak_from_this();
    cb->wire = wire;
    c.on_down(std::move(cb));
  }

  /// Sends a down notice to each of `nodes` (under mu_).
  void send_down_to(const std::vector<node_id>& nodes, const down_tuple& d) {
    auto payload = encode(d);
    for (auto w : nodes)
      if (auto m = members_.find(w); m != members_.end() && m->second.conn) m->second.conn->send(control(ctl::down, payload));
  }

  /// Exports an actor spawned here by another node (or re-created here for a lost one's
  /// spawner), tied to the node that spawned it unless detached: stopped at once when that node
  /// is gone already.
  void export_spawned(std::uint64_t wire, cell_base& c, const std::string& type, const spawn_opts_tuple& opts) {
    export_at(wire, c, find_type(type));
    if (std::get<8>(opts)) return;
    const auto owner = static_cast<node_id>(wire >> wire_shift);
    {
      std::lock_guard lock(mu_);
      auto it = exported_.find(wire);
      if (it == exported_.end()) return;  // (this node is stopping)
      it->second.owner = owner;
      auto m = members_.find(owner);
      if (owner == self_ || (m != members_.end() && m->second.alive)) return;
    }
    c.stop(exit_reason::stopped);
  }

  void exported_down(std::uint64_t wire, const down_notice& n) {
    std::lock_guard lock(mu_);
    auto it = exported_.find(wire);
    if (it == exported_.end()) return;
    send_down_to(it->second.watchers, down_tuple{wire, static_cast<std::uint8_t>(n.reason), n.what});
    if (auto w = wire_of_.find(it->second.cell.get()); w != wire_of_.end() && w->second == wire) wire_of_.erase(w);
    exported_.erase(it);
    // Remembered a while, so that a watch arriving after it went is answered at once.
    if (gone_.insert(wire).second) gone_order_.push_back(wire);
    if (gone_order_.size() > remembered_gone) {
      gone_.erase(gone_order_.front());
      gone_order_.pop_front();
    }
    // Its cluster-wide names go too.
    if (self_ == head_id) {
      std::erase_if(names_, [wire](const auto& kv) { return std::get<1>(kv.second) == wire; });
    } else if (auto h = members_.find(head_id); h != members_.end() && h->second.conn) {
      h->second.conn->send(make_envelope(envelope_kind::tell, net::node_target, static_cast<std::uint64_t>(op::unregister_name), encode(wire)));
    }
  }

  // ---- names (head) ----------------------------------------------------------------------

  /// Head: names an actor cluster-wide; on a refusal, its reason (and the code in `code`).
  std::string add_name(name_tuple t, errc& code) {
    std::lock_guard lock(mu_);
    auto& [name, wire, where, type] = t;
    code = errc::decode_error;
    if (name.empty()) return "register_name: a name must not be empty";
    code = errc::node_lost;
    const node_id at = route(where, wire);  // where it lives now (re-created elsewhere, perhaps)
    if (auto m = members_.find(at); m == members_.end() || !m->second.alive) {
      return "register_name('" + name + "'): node " + std::to_string(at) + " of actor " + std::to_string(wire) + " is lost";
    } else if (at != self_ && m->second.conn) {
      // Its node answers with a down notice when the actor goes, or is gone already: the name
      // goes with it.
      m->second.conn->send(make_envelope(envelope_kind::tell, net::node_target, static_cast<std::uint64_t>(op::watch), encode(wire)));
    }
    code = errc::actor_dead;
    if (at == self_) {
      auto it = exported_.find(wire);
      if (it == exported_.end() || !it->second.cell)
        return "register_name('" + name + "'): actor " + std::to_string(wire) + " is gone (or never was)";
    }
    code = errc::name_taken;
    auto it = names_.find(name);
    if (it != names_.end() && std::get<1>(it->second) != wire) {
      auto m = members_.find(std::get<2>(it->second));
      if (m != members_.end() && m->second.alive)
        return "the name '" + name + "' already belongs to actor " + std::to_string(std::get<1>(it->second)) +
               " on node " + std::to_string(std::get<2>(it->second));
    }
    names_[name] = std::tuple<std::uint64_t, std::uint64_t, node_id, std::string>{0, wire, where, type};
    return {};
  }

  found_tuple find_name(const std::string& name) {
    std::lock_guard lock(mu_);
    return find_name_locked(name);
  }
  found_tuple find_name_locked(const std::string& name) {
    auto it = names_.find(name);
    if (it == names_.end()) return {false, 0, 0, {}};
    auto& [unused, wire, where, type] = it->second;
    return {true, wire, where, type};
  }

  // ---- status ----------------------------------------------------------------------------

  node_status local_status() {
    node_status s;
    std::unordered_map<actor_id, std::uint64_t> wires;
    {
      std::lock_guard lock(mu_);
      auto& me = members_[self_];
      s.info = {self_, me.host, port_, true, sys_.live_count.load(), cfg_.labels};
      for (auto& [wire, e] : exported_)
        if (e.cell) wires.emplace(e.cell->id(), wire);
    }
    s.dead_letters = sys_.dead_letters.load();
    std::unordered_map<actor_id, std::string> names;
    {
      std::lock_guard lock(sys_.names_mutex);
      for (auto& [name, c] : sys_.names) names[c->id()] = name;
    }
    auto now = clock_type::now();
    std::lock_guard lock(rates_mu_);
    std::unordered_map<actor_id, std::pair<std::uint64_t, clock_type::time_point>> next;
    for (auto& a : all_stats(sys_)) {
      actor_status x{a.id, a.type, {}, a.mailbox_depth, a.messages, 0, 0};
      if (auto n = names.find(a.id); n != names.end()) x.name = n->second;
      if (auto w = wires.find(a.id); w != wires.end()) x.wire = w->second;
      if (auto prev = rates_.find(a.id); prev != rates_.end()) {
        double dt = std::chrono::duration<double>(now - prev->second.second).count();
        if (dt > 0) x.messages_per_s = static_cast<double>(a.messages - prev->second.first) / dt;
      }
      next[a.id] = {a.messages, now};
      s.actors.push_back(std::move(x));
    }
    rates_ = std::move(next);
    return s;
  }

  void gather_status(std::shared_ptr<responder> r) {
    // Each live member is asked for its own report; one that has not answered within
    // node_timeout (2 s at most) is shown as the head knows it, with why, instead of holding up
    // the rest.
    struct gather {
      std::mutex mu;
      std::vector<node_status> nodes;
      std::map<node_id, node_info> waiting;  // asked, not answered yet
      std::map<std::pair<node_id, std::uint64_t>, std::string> names;  // the head's: (node, wire) -> name
      bool local_added = false, done = false;
      std::shared_ptr<responder> r;
      /// The report of `id` as the head knows it, with what the node said of itself.
      void add(node_id id, node_status s) {
        std::lock_guard lock(mu);
        if (done) return;
        if (id != 0) {
          auto it = waiting.find(id);
          if (it == waiting.end()) return;
          // A node speaks for its actors; who and where it is, is the head's record.
          s.info.id = it->second.id;
          s.info.host = it->second.host;
          s.info.port = it->second.port;
          s.info.labels = it->second.labels;
          waiting.erase(it);
        } else {
          local_added = true;
        }
        // An actor named by another node has its name here only (the head keeps the names).
        for (auto& a : s.actors)
          if (a.name.empty() && a.wire != 0)
            if (auto n = names.find({s.info.id, a.wire}); n != names.end()) a.name = n->second;
        nodes.push_back(std::move(s));
        if (local_added && waiting.empty()) finish();
      }
      void give_up(const std::string& why) {
        std::lock_guard lock(mu);
        if (done) return;
        for (auto& [id, info] : waiting) nodes.push_back(node_status{info, 0, {}, why});
        waiting.clear();
        finish();
      }
      void finish() {  // under mu
        done = true;
        std::sort(nodes.begin(), nodes.end(), [](auto& a, auto& b) { return a.info.id < b.info.id; });
        r->reply(encode(nodes));
      }
    };
    struct status_sink final : reply_sink {
      std::shared_ptr<gather> g;
      node_info info;
      void deliver(std::span<const std::byte> p) noexcept override {
        try {
          auto s = decode<node_status>(p);
          s.info.alive = true;
          g->add(info.id, std::move(s));
        } catch (const std::exception& e) {
          g->add(info.id, node_status{info, 0, {}, std::string("its report does not decode: ") + e.what()});
        }
      }
      void fail(std::exception_ptr e) noexcept override {
        auto [code, what] = describe(e);
        node_info shown = info;
        shown.alive = code != errc::node_lost;  // (a redialled connection: alive, its answer lost)
        g->add(info.id, node_status{shown, 0, {}, what});
      }
    };
    auto g = std::make_shared<gather>();
    g->r = std::move(r);
    std::vector<node_info> others;
    {
      std::lock_guard lock(mu_);
      for (auto& [name, entry] : names_) g->names.try_emplace({std::get<2>(entry), std::get<1>(entry)}, name);
      for (auto& [id, m] : members_) {
        if (id == self_) continue;
        if (m.alive) others.push_back({id, m.host, m.port, true, m.actors, m.labels});
        else g->nodes.push_back(node_status{{id, m.host, m.port, false, 0, m.labels}, 0, {}, {}});
      }
    }
    for (auto& info : others) g->waiting.emplace(info.id, info);
    if (!others.empty()) {
      // Well within the 5 s a status client waits by default, whatever node_timeout is.
      const auto patience = std::min<std::chrono::milliseconds>(cfg_.node_timeout, std::chrono::seconds(2));
      auto timer = std::make_shared<asio::steady_timer>(io_, patience);
      timer->async_wait([g, timer, ms = patience.count()](boost::system::error_code) {
        g->give_up("no answer within " + std::to_string(ms) + " ms");
      });
    }
    for (auto& info : others) {
      auto sink = std::make_unique<status_sink>();
      sink->g = g;
      sink->info = info;
      call(info.id, make_envelope(envelope_kind::call, net::node_target, static_cast<std::uint64_t>(op::node_stats)), std::move(sink));
    }
    g->add(0, local_status());
  }

  system_impl& sys_;
  node_config cfg_;
  std::string listen_host_, head_host_;
  std::uint16_t listen_port_ = 0, head_port_ = 0, port_ = 0;

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  asio::steady_timer heartbeat_{io_};
  std::unique_ptr<net::transport> transport_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable joined_cv_;
  std::string join_error_;
  std::string head_lost_;  // a worker's: why the head is lost ("" while it is not)
  bool stopped_ = false;
  node_id self_ = 0;
  node_id next_node_ = 2;
  node_id largest_id_ = 0;  // a worker's: the largest node id the head has listed
  /// Calls and watches of an actor another node spawns here that came before it (a ref can
  /// travel faster than the spawn, on another connection): kept forget_after at most, and handed
  /// over by host_spawned (calls, in arrival order) and export_at (watches).
  using early_call = std::pair<std::shared_ptr<connection>, envelope>;
  struct awaited {
    std::vector<early_call> calls;
    std::vector<node_id> watchers;
    clock_type::time_point since = clock_type::now();
  };
  std::unordered_map<std::uint64_t, awaited> awaited_;
  awaited& awaiting(std::uint64_t wire) { return awaited_.try_emplace(wire).first->second; }  // under mu_
  /// Connections of lost nodes that were told so (ctl::lost), by connection id.
  struct told_lost {
    std::shared_ptr<connection> conn;
    clock_type::time_point since;
  };
  std::unordered_map<std::uint64_t, told_lost> told_lost_;
  /// The latest exported actors that went (remembered_gone of them), oldest first.
  std::unordered_set<std::uint64_t> gone_;
  std::deque<std::uint64_t> gone_order_;
  std::deque<std::uint64_t> failed_order_;  // wire ids of failed spawns, oldest first
  std::uint64_t beats_ = 0;
  clock_type::time_point last_beat_ = clock_type::now();
  std::uint64_t next_request_ = 1;
  std::map<node_id, member> members_;
  std::unordered_map<std::uint64_t, node_id> conn_node_;
  std::unordered_map<std::uint64_t, std::shared_ptr<connection>> conns_;
  std::unordered_map<std::uint64_t, pending_call> pending_;
  std::unordered_map<std::uint64_t, exported> exported_;
  std::unordered_map<const cell_base*, std::uint64_t> wire_of_;  // the first wire each exported cell got
  std::unordered_map<std::uint64_t, watched> watches_;  // remote actors monitored from here
  std::unordered_map<std::uint64_t, node_id> relocated_;  // actors re-created on another node
  std::unordered_map<std::uint64_t, restartable> restartable_;  // head: how to re-create them
  std::map<std::string, std::tuple<std::uint64_t, std::uint64_t, node_id, std::string>> names_;  // head
  std::mutex rates_mu_;
  std::unordered_map<actor_id, std::pair<std::uint64_t, clock_type::time_point>> rates_;
};

}  // namespace troupe::detail

// ---- the functions behind the public templates --------------------------------------------

namespace troupe::detail {

namespace {
node_runtime& node_of(system_impl& s, const char* what) {
  if (!s.node)
    throw std::invalid_argument(std::string(what) +
                                ": this actor_system is no node (set system_config::node.listen)");
  return *s.node;
}
}  // namespace

std::shared_ptr<node_runtime> start_node(system_impl& sys, const node_config& cfg) {
  auto n = std::make_shared<node_runtime>(sys, cfg);
  n->start();
  return n;
}
void forget_cluster_name(node_runtime& n, std::string_view name, cell_base* had) { n.forget_name(std::string(name), had); }

void stop_node(node_runtime& n) noexcept { n.stop(); }

void retain(remote_actor* a) noexcept { a->refs.fetch_add(1, std::memory_order_relaxed); }
void release(remote_actor* a) noexcept {
  if (a->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) std::unique_ptr<remote_actor>{a};
}
std::uint64_t remote_wire_id(const remote_actor& a) noexcept { return a.wire; }
node_id remote_node(const remote_actor& a) noexcept { return a.node->location(a.where, a.wire); }
bool remote_alive(const remote_actor& a) noexcept {
  return a.node->member_alive(a.node->location(a.where, a.wire));
}
system_impl& remote_system(const remote_actor& a) noexcept { return *a.sys; }

void remote_call(remote_actor& a, std::uint64_t method, std::vector<std::byte> args,
                 std::unique_ptr<reply_sink> sink) {
  envelope env;
  env.kind = sink ? envelope_kind::call : envelope_kind::tell;
  env.target = a.wire;
  env.method = method;
  env.payload = std::move(args);
  a.node->call(a.where, std::move(env), std::move(sink));
}
void remote_stop(remote_actor& a) { a.node->stop_remote(a); }

ref_address address_of(cell_base* local, remote_actor* remote, std::string_view type) {
  if (remote) return {remote->node->location(remote->where, remote->wire), remote->wire};
  if (!local) return {};
  auto& sys = local->system();
  if (!sys.node)
    throw error(errc::decode_error, "an actor_ref can travel to another process only from a node "
                                    "(set system_config::node.listen)");
  return sys.node->address_of_local(*local, type);
}

spawned resolve(const ref_address& a, std::string_view type) {
  if (a.where == 0 && a.wire == 0) return {};
  if (!tls_decoding_node)
    byte_reader::fail("an actor_ref can be decoded only by the node that receives it");
  return tls_decoding_node->resolve(a, type);
}

spawned remote_spawn(system_impl& sys, node_id where, std::string_view type, std::uint64_t ctor,
                     std::vector<std::byte> args, const spawn_options& opts) {
  if (!sys.node) {
    if (where != 0)
      throw std::invalid_argument("spawn_on(" + std::to_string(where) +
                                  "): this actor_system is no node (set system_config::node.listen)");
    auto fn = find_ctor(type, ctor);
    if (!fn || !sys.facade) throw std::logic_error("spawn_on: no constructor registered for " + std::string(type));
    return {fn(*sys.facade, args, opts), {}};
  }
  return sys.node->spawn(where, type, ctor, std::move(args), opts);
}

std::optional<spawned> remote_lookup(system_impl& s, std::string_view name, std::string& type) {
  if (!s.node) return std::nullopt;
  return s.node->lookup(name, type);
}

future<void> publish_name(system_impl& s, const std::string& name, cell_base* local, remote_actor* remote,
                          std::string_view type, cell_base* added) {
  if (!s.node) {
    if (remote) node_of(s, "register_name of a remote actor");
    promise<void> named(&s);
    auto f = named.get_future();
    named.set_value();
    return f;
  }
  return s.node->publish_name(name, local, remote, type, added);
}

void await_name(system_impl& s, const std::string& name, future<void> f) {
  if (s.node) return s.node->await_name(name, std::move(f));
  // Not a node: the future is complete already.
  if (tls_current_cell() == nullptr && !tls_on_worker()) std::move(f).get();
}

future<down_notice> monitor_remote(remote_actor& a) {
  auto* st = make_state<down_notice>();
  st->set_system(a.sys);
  st->add_ref();
  future<down_notice> f{state_ptr<down_notice>(st)};
  a.node->add_watch(a, {state_ptr<down_notice>(st), {}});
  return f;
}

void watch_remote(remote_actor& a, cell_base& watcher) {
  if (!watcher.receives_down_notices())
    throw std::logic_error(std::string("this_actor::monitor: ") + watcher.type_name() +
                           " has no on_down(const troupe::down_notice&) to receive the notice");
  a.node->add_watch(a, {{}, cell_ptr(&watcher)});
}

node_id this_node(system_impl& s) noexcept { return s.node ? s.node->self() : 0; }
std::uint16_t this_node_port(system_impl& s) noexcept { return s.node ? s.node->port() : 0; }

bool register_remote_type(remote_type_entry e) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.types.try_emplace(std::string(e.name), std::move(e));
  return true;
}

bool register_remote_constructor(std::string_view type, std::uint64_t key, construct_fn f) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.ctors[std::string(type)].try_emplace(key, f);
  return true;
}

}  // namespace troupe::detail

namespace troupe {

std::vector<node_status> cluster_status(const std::string& head_address, const std::string& token,
                                        std::chrono::milliseconds timeout) {
  using namespace detail;
  auto [host, port] = split_address(head_address, "the head's address");
  std::string secret = token;
  if (secret.empty())
    if (const char* t = std::getenv("TROUPE_CLUSTER_TOKEN")) secret = t;
  if (secret.empty())
    throw std::invalid_argument("the cluster's token is needed: pass it or set TROUPE_CLUSTER_TOKEN");
  asio::io_context io;
  std::optional<std::vector<node_status>> result;
  std::string failure;
  net::transport_handlers h;
  h.on_open = [](const std::shared_ptr<connection>& c) {
    c->send(make_envelope(envelope_kind::call, net::node_target, static_cast<std::uint64_t>(op::cluster_status), {}, 1));
  };
  h.on_envelope = [&](const std::shared_ptr<connection>& c, envelope env) {
    if (env.kind == envelope_kind::reply) {
      try {
        result = decode<std::vector<node_status>>(env.payload);
      } catch (const std::exception& e) {
        failure = std::string("the head's answer does not decode: ") + e.what();
      }
    } else if (env.kind == envelope_kind::error) {
      failure = env.error_message;
    } else {
      return;  // heartbeats and news are not for us
    }
    c->close("status received");
    io.stop();
  };
  h.on_close = [&](const std::shared_ptr<connection>&, const std::string& why) {
    if (!result && failure.empty()) failure = why;
    io.stop();
  };
  net::transport_config tc;
  tc.token = secret;
  tc.tls = tls_settings({}, {}, {});
  // A handshake that cannot finish (TLS on one side only) says so before the caller gives up.
  tc.handshake_timeout = std::min(tc.handshake_timeout, timeout * 9 / 10);
  {
    net::transport t(io, tc, std::move(h));
    t.connect(host, port);
    io.run_for(timeout);
    if (!result && failure.empty()) failure = "no answer within " + std::to_string(timeout.count()) + " ms";
    t.close_all("done");
    io.restart();
    io.run_for(std::chrono::milliseconds(50));
    io.stop();
  }
  if (!result) throw error(errc::connection_lost, "status of " + head_address + ": " + failure);
  return std::move(*result);
}

void run_node(const system_config& cfg, const std::function<bool()>& stop_requested) {
  actor_system sys(cfg);
  std::printf("{\"node\":%u,\"port\":%u}\n", static_cast<unsigned>(sys.node()),
              static_cast<unsigned>(sys.node_port()));
  std::fflush(stdout);
  while (!stop_requested()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (auto* n = sys.impl().node.get())
      if (auto why = n->head_lost(); !why.empty())
        throw error(errc::node_lost, "the head is lost (" + why + "): this node is out of the cluster; start it again to rejoin");
  }
}

}  // namespace troupe
