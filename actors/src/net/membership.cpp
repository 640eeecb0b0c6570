// Membership and failure detection (membership.hpp): joining, the member lists, the dials
// between members, heartbeats, redials, and losing a node, which reaches every other unit.

#include <algorithm>
#include <unordered_set>

#include <boost/asio/post.hpp>

#include "net/node_runtime.hpp"
#include "troupe/core/log.hpp"

namespace troupe::detail {

bool node_runtime::member_alive(node_id id) const {
  std::lock_guard lock(mu_);
  auto it = members_.find(id);
  return !stopped_ && it != members_.end() && it->second.alive;
}

// ---- joining and the member lists ----------------------------------------------------------

void node_runtime::join() {
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

void node_runtime::on_open(const std::shared_ptr<connection>& c) {
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
void node_runtime::attach(node_id to, const std::shared_ptr<connection>& c) {
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
    if (env.kind == envelope_kind::call) replies_.mark_written(env.request_id);
    c->send(std::move(env));
  }
  m.backlog.clear();
}

void node_runtime::dial(member& m) {
  m.dialing = true;
  auto weak = weak_from_this();
  node_id id = m.id;
  transport_->connect(m.host, m.port, id, [weak, id](const std::string& why) {
    if (auto self = weak.lock()) self->lose(id, why);
  });
}

std::vector<member_tuple> node_runtime::member_list() const {
  std::vector<member_tuple> out;
  for (auto& [id, m] : members_) out.emplace_back(id, m.host, m.port, m.alive, m.actors, m.key);
  return out;
}

void node_runtime::broadcast_members() {  // head, under mu_
  auto payload = encode(member_list());
  for (auto& [id, m] : members_)
    if (id != self_ && m.alive && m.conn) m.conn->send(control(ctl::members, payload));
}

void node_runtime::on_members(const std::vector<member_tuple>& list) {  // worker, under mu_
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
        auto sinks = std::make_shared<std::vector<std::unique_ptr<reply_sink>>>(replies_.take_calls_to(id, true));
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

// ---- envelopes of membership --------------------------------------------------------------

void node_runtime::on_heartbeat(node_id from, const envelope& env) {
  auto actors = decode<std::uint64_t>(env.payload);
  std::lock_guard lock(mu_);
  if (auto m = members_.find(from); m != members_.end()) {
    m->second.actors = actors;
    m->second.placed = 0;
  }
}

void node_runtime::on_join(const std::shared_ptr<connection>& c, const envelope& env) {
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
}

void node_runtime::on_welcome(const std::shared_ptr<connection>& c, const envelope& env) {
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
}

void node_runtime::on_hello(const std::shared_ptr<connection>& c, const envelope& env) {
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
}

void node_runtime::on_lost_notice(const std::shared_ptr<connection>& c, node_id from) {
  std::lock_guard lock(mu_);
  if (from == 0) return c->refuse("a lost notice on a connection of no node");
  lose_locked(from, "node " + std::to_string(from) + " counts this node as lost (it missed this node's heartbeats)");
}

void node_runtime::on_leave(node_id from) {
  std::lock_guard lock(mu_);
  if (from != 0) lose_locked(from, "it left the cluster", gone::left);
}

void node_runtime::on_member_list(const std::shared_ptr<connection>& c, node_id from, const envelope& env) {
  auto list = decode<std::vector<member_tuple>>(env.payload);
  std::lock_guard lock(mu_);
  // The head keeps the list; the others take it from the head alone.
  if (self_ == head_id || from != head_id)
    return c->refuse("a member list from node " + std::to_string(from) + ": only the head sends it");
  on_members(list);
}

// ---- failure detection ---------------------------------------------------------------------

void node_runtime::arm_heartbeat() {
  heartbeat_.expires_after(cfg_.heartbeat);
  heartbeat_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
    if (ec) return;
    if (auto self = weak.lock()) self->beat();
  });
}

void node_runtime::beat() {
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
    exports_.take_awaited_if([now](std::uint64_t, const awaited& a) { return now - a.since > forget_after; },
                             [&](std::uint64_t wire, awaited& a) {
                               send_down_to(a.watchers, down_tuple{wire, static_cast<std::uint8_t>(exit_reason::stopped), "no such actor"});
                               never_came.emplace_back(wire, std::move(a.calls));
                             });
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
    watches_.take_if([&](const watched& w) { return w.held() && now - w.held_since > hold_limit(); }, after.fired);
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

void node_runtime::on_close(const std::shared_ptr<connection>& c, const std::string& why) {
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
  for (auto& s : replies_.take_calls_to(id, true)) m->second.in_doubt.push_back(std::move(s));
  dial(m->second);
}

void node_runtime::lose(node_id id, const std::string& why) {
  std::lock_guard lock(mu_);
  lose_locked(id, why);
}

void node_runtime::lose_locked(node_id id, const std::string& why, gone how) {
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
  for (auto& s : replies_.take_calls_to(id, false)) after.failed.push_back(std::move(s));
  // Watches of its actors: those the head re-created already go to their new host; the
  // others wait for the head's word when it may still re-create them (see watched).
  const bool hold = may_relocate(id);
  watches_.each([&](std::uint64_t wire, watched& w) {
    if (w.host != id) return;
    if (auto to = route(id, wire); to != id) rehost(wire, to, after);
    else if (hold) w.held_since = m.lost_at;
  });
  // Without a head nothing is re-created any more: what waited for it fires.
  const bool headless = id == head_id && self_ != head_id;
  watches_.take_if([id, headless](const watched& w) { return (w.host == id && !w.held()) || (headless && w.held()); },
                   after.fired);
  exports_.forget_node(id, after.orphans);
  // Calls and watches waiting for an actor the lost node was spawning here: its spawn will
  // not come.
  exports_.take_awaited_if([id](std::uint64_t wire, const awaited&) { return (wire >> wire_shift) == id; },
                           [&](std::uint64_t wire, awaited& a) {
                             send_down_to(a.watchers,
                                          down_tuple{wire, static_cast<std::uint8_t>(left ? exit_reason::stopped : exit_reason::node_lost),
                                                     "never made: node " + std::to_string(id) + ", which was spawning it, " +
                                                         (left ? "left" : "is lost")});
                             for (auto& call : a.calls) after.unmade.push_back(std::move(call));
                           });
  if (!after.orphans.empty())
    log().info("troupe node {}: stopping {} actor(s) that node {} spawned here (not detached)", self_, after.orphans.size(), id);
  if (self_ == head_id) {
    names_.forget_node(id);
    // Nor are they re-created elsewhere.
    restarts_.forget_spawned_by(id);
    broadcast_members();
    asio::post(io_, [weak = weak_from_this(), id, left] {
      if (auto self = weak.lock()) self->relocate(id, !left);
    });
  }
  post(std::move(after));
}

void node_runtime::post(aftermath a) {
  if (a.failed.empty() && a.fired.empty() && a.rewatch.empty() && a.orphans.empty() && a.unmade.empty()) return;
  asio::post(io_, [weak = weak_from_this(), a = std::make_shared<aftermath>(std::move(a))] {
    for (auto& s : a->failed) s->fail(a->failure);
    if (auto self = weak.lock())
      for (auto& [host, wire] : a->rewatch)
        self->call(host, node_op(envelope_kind::tell, op::watch, encode(wire)), nullptr);
    for (auto& [w, n] : a->fired) fire(std::move(w), n);
    for (auto& c : a->orphans) c->stop(exit_reason::stopped);
    if (auto self = weak.lock())
      for (auto& [c, env] : a->unmade)
        self->refuse_call(c, env, a->failure);
  });
}

}  // namespace troupe::detail
