// The node's lifecycle: its configuration, start (listening, the I/O thread, the heartbeats,
// joining the head), stop (leaving the cluster), and the routing of each incoming envelope to the
// unit it is for (node_runtime.hpp lists them). Also the functions of node.hpp and run_node.

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include <boost/asio/post.hpp>

#include "net/node_runtime.hpp"
#include "troupe/core/log.hpp"

namespace troupe::detail {

thread_local node_runtime* tls_decoding_node = nullptr;

// ---- start and stop ------------------------------------------------------------------------

node_runtime::node_runtime(system_impl& sys, const node_config& cfg) : sys_(sys), cfg_(cfg) {
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

void node_runtime::start() {
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

void node_runtime::stop() noexcept {
  std::vector<std::unique_ptr<reply_sink>> sinks;
  std::vector<watch> watches;
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    sinks = replies_.take_all();
    watches = watches_.take_all();
    exports_.clear();
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

node_id node_runtime::self() const {
  std::lock_guard lock(mu_);
  return self_;
}

std::string node_runtime::head_lost() const {
  std::lock_guard lock(mu_);
  return head_lost_;
}

// ---- envelopes in --------------------------------------------------------------------------

void node_runtime::on_envelope(const std::shared_ptr<connection>& c, envelope env) {
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

void node_runtime::on_control(const std::shared_ptr<connection>& c, node_id from, envelope env) {
  switch (static_cast<ctl>(env.method)) {
    case ctl::heartbeat: return on_heartbeat(from, env);
    case ctl::join: return on_join(c, env);
    case ctl::welcome: return on_welcome(c, env);
    case ctl::hello: return on_hello(c, env);
    case ctl::moved: return on_moved(c, from, env);
    case ctl::relocated: return on_relocated(c, from, env);
    case ctl::lost: return on_lost_notice(c, from);
    case ctl::leave: return on_leave(from);
    case ctl::members: return on_member_list(c, from, env);
    case ctl::down: return on_down_notice(env);
    default:
      return c->refuse("unknown control code " + std::to_string(env.method));
  }
}

void node_runtime::on_op(const std::shared_ptr<connection>& c, node_id from, envelope env) {
  auto r = responder_for(c, env);
  try {
    switch (static_cast<op>(env.method)) {
      case op::spawn: return op_spawn(from, env, r);
      case op::lookup: return op_lookup(env, r);
      case op::register_name: return op_register_name(env, r);
      case op::forget_name: return op_forget_name(env);
      case op::unregister_name: return op_unregister_name(env);
      case op::stop_actor: return op_stop_actor(env);
      case op::watch: return op_watch(c, from, env);
      case op::restartable: return op_restartable(env);
      case op::node_stats: return op_node_stats(r);
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

}  // namespace troupe::detail

// ---- the functions behind node.hpp and run_node ------------------------------------------

namespace troupe::detail {

std::shared_ptr<node_runtime> start_node(system_impl& sys, const node_config& cfg) {
  auto n = std::make_shared<node_runtime>(sys, cfg);
  n->start();
  return n;
}

void stop_node(node_runtime& n) noexcept { n.stop(); }

node_id this_node(system_impl& s) noexcept { return s.node ? s.node->self() : 0; }
std::uint16_t this_node_port(system_impl& s) noexcept { return s.node ? s.node->port() : 0; }

}  // namespace troupe::detail

namespace troupe {

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
