// The status report (status.hpp): this node's own report, the head's gathering of every
// member's, and the client behind troupe::cluster_status (`troupe status`).

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>

#include "failure_log.hpp"
#include "net/node_runtime.hpp"
#include "net/status_codec.hpp"

namespace troupe::detail {

std::vector<actor_status> actor_rates::sample(system_impl& sys, const std::unordered_map<actor_id, std::uint64_t>& wires) {
  std::vector<actor_status> out;
  std::unordered_map<actor_id, std::string> names;
  {
    std::lock_guard lock(sys.names_mutex);
    for (auto& [name, c] : sys.names) names[c->id()] = name;
  }
  auto now = clock::now();
  std::lock_guard lock(mu_);
  std::unordered_map<actor_id, std::pair<std::uint64_t, clock::time_point>> next;
  for (auto& a : all_stats(sys)) {
    actor_status x{a.id, a.type, {}, a.mailbox_depth, a.messages, 0, 0, a.restarts};
    if (auto n = names.find(a.id); n != names.end()) x.name = n->second;
    if (auto w = wires.find(a.id); w != wires.end()) x.wire = w->second;
    if (auto prev = last_.find(a.id); prev != last_.end()) {
      double dt = std::chrono::duration<double>(now - prev->second.second).count();
      if (dt > 0) x.messages_per_s = static_cast<double>(a.messages - prev->second.first) / dt;
    }
    next[a.id] = {a.messages, now};
    out.push_back(std::move(x));
  }
  last_ = std::move(next);
  return out;
}

node_status node_runtime::local_status() {
  node_status s;
  std::unordered_map<actor_id, std::uint64_t> wires;
  {
    std::lock_guard lock(mu_);
    auto& me = members_[self_];
    s.info = {self_, me.host, port_, true, sys_.live_count.load(), cfg_.labels};
    wires = exports_.wires_by_actor();
  }
  s.dead_letters = sys_.dead_letters.load();
  s.actors = rates_.sample(sys_, wires);
  s.failures_by_type = sys_.failures->by_type();
  s.recent_failures = sys_.failures->recent();
  return s;
}

void node_runtime::op_node_stats(const std::shared_ptr<responder>& r) {
  auto report = encode(local_status());
  if (r) r->reply({std::move(report), {}});
}

void node_runtime::gather_status(std::shared_ptr<responder> r) {
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
      for (auto& [id, info] : waiting) nodes.push_back(node_status{info, 0, {}, why, {}, {}});
      waiting.clear();
      finish();
    }
    void finish() {  // under mu
      done = true;
      std::sort(nodes.begin(), nodes.end(), [](auto& a, auto& b) { return a.info.id < b.info.id; });
      r->reply({encode(nodes), {}});
    }
  };
  struct status_sink final : reply_sink {
    std::shared_ptr<gather> g;
    node_info info;
    void deliver(std::span<const std::byte> p, const std::shared_ptr<const void>&) noexcept override {
      try {
        auto s = decode<node_status>(p);
        s.info.alive = true;
        g->add(info.id, std::move(s));
      } catch (const std::exception& e) {
        g->add(info.id, node_status{info, 0, {}, std::string("its report does not decode: ") + e.what(), {}, {}});
      }
    }
    void fail(std::exception_ptr e) noexcept override {
      auto [code, what] = describe(e);
      node_info shown = info;
      shown.alive = code != errc::node_lost;  // (a redialled connection: alive, its answer lost)
      g->add(info.id, node_status{shown, 0, {}, what, {}, {}});
    }
  };
  auto g = std::make_shared<gather>();
  g->r = std::move(r);
  std::vector<node_info> others;
  {
    std::lock_guard lock(mu_);
    names_.each([&](const std::string& name, const name_registry::entry& e) { g->names.try_emplace({e.where, e.wire}, name); });
    for (auto& [id, m] : members_) {
      if (id == self_) continue;
      if (m.alive) others.push_back({id, m.host, m.port, true, m.actors, m.labels});
      else g->nodes.push_back(node_status{{id, m.host, m.port, false, 0, m.labels}, 0, {}, {}, {}, {}});
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
    call(info.id, node_op(envelope_kind::call, op::node_stats), std::move(sink));
  }
  g->add(0, local_status());
}

}  // namespace troupe::detail

// ---- the client: the cluster's status from its head ---------------------------------------

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

}  // namespace troupe
