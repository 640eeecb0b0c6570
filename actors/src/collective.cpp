#include "troupe/actors/collective.hpp"

#include <algorithm>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe {

namespace {

const char* reason_name(exit_reason r) {
  switch (r) {
    case exit_reason::stopped: return "stopped";
    case exit_reason::failed: return "failed";
    case exit_reason::shutdown: return "shut down";
    case exit_reason::node_lost: return "its node was lost";
  }
  return "gone";
}

std::size_t segments_of(std::size_t len, std::uint64_t seg) { return (len + seg - 1) / seg; }

// The vector whose lease this thread is dropping now, and where the lease's deleter puts it when
// that drop was the last reference: then the member completes its call at once, with its own
// vector. The last reference dropped on any other thread (or later) sends the vector back by
// `returned` instead. Per thread, so a deleter running elsewhere never sees it.
struct lease_catch {
  const std::vector<float>* vector = nullptr;
  std::unique_ptr<std::vector<float>> caught;
};
thread_local lease_catch* t_catch = nullptr;

// Drops `lease` (which owns `v`); the vector when that was the last reference, else nullptr.
std::unique_ptr<std::vector<float>> drop_lease(std::shared_ptr<const void>& lease, const std::vector<float>* v) {
  lease_catch c{v, nullptr};
  t_catch = &c;
  lease.reset();
  t_catch = nullptr;
  return std::move(c.caught);
}

}  // namespace

// The protocol. Member r, at step s (0..2p−3), sends chunk (r − s) mod p to member r+1, cut
// into segments; so the segment (s, j) that member r receives is of chunk (r − 1 − s) mod p.
// Reduce-scatter (s ≤ p−2): the receiver adds its own values and forwards the sums as (s+1, j);
// at s = p−2 the sums are final and go into the result. All-gather (s ≥ p−1): the receiver
// stores the values and forwards them until s = 2p−3. Segments are independent, so each is
// forwarded when it arrives: the ring is a pipeline of segments. A member that has not yet
// been called keeps the segments of its next call (`early_`) and handles them when it is.
//
// Views instead of copies. What a member sends is a view of its own vector (`send`): the sums
// are written into the vector first, in place, and the view shares `lease_`, which owns it. A
// region the member has sent is written again only after a message that depends on the
// successor having read it (a partial sum of chunk c sent at reduce-scatter comes back as c's
// final sum at all-gather only after it went round the ring), so nobody reads a region while
// it changes. When every segment is in, nobody writes the vector any more. The member drops its
// lease: when that was the last reference the call completes at once; otherwise the last view
// to go (in a successor's mailbox, or in a connection's queue until written) hands the vector
// back by `returned`, which completes the call. Views may never go (a peer that stops reading
// without closing, a dial that hangs), so the member keeps a weak reference: at the timeout, or
// when the ring breaks, it completes with a copy of the vector made through it. A failed call
// drops its lease too: its vector is freed when the last view goes, and its `returned` finds
// nothing to complete.

void ring_member::join(std::vector<actor_ref<ring_member>> ring, std::uint32_t rank, std::uint64_t segment_elements,
                       std::uint64_t timeout_ms) {
  if (joined_) throw std::invalid_argument("ring_member::join: this member already belongs to a ring");
  if (ring.empty()) throw std::invalid_argument("ring_member::join: the ring has no members");
  if (rank >= ring.size())
    throw std::invalid_argument("ring_member::join: rank " + std::to_string(rank) + " is outside a ring of " +
                                std::to_string(ring.size()));
  if (segment_elements == 0) throw std::invalid_argument("ring_member::join: segment_elements must be at least 1");
  for (const auto& m : ring)
    if (!m) throw std::invalid_argument("ring_member::join: a member's actor_ref is empty");
  ring_ = std::move(ring);
  rank_ = rank;
  segment_ = segment_elements;
  timeout_ms_ = timeout_ms;
  joined_ = true;
  for (std::uint32_t i = 0; i < ring_.size(); ++i)
    if (i != rank_) this_actor::monitor(ring_[i]);
}

std::size_t ring_member::chunk_begin(std::uint32_t chunk) const {
  return static_cast<std::size_t>(static_cast<unsigned __int128>(size_) * chunk / ring_.size());
}
std::size_t ring_member::chunk_end(std::uint32_t chunk) const { return chunk_begin(chunk + 1); }

task<std::vector<float>> ring_member::allreduce(std::vector<float> data, reduce_op op) {
  auto& self = detail::current_cell_or_throw("ring_member::allreduce");
  if (self.awaits_itself(&self))
    throw std::logic_error("ring_member::allreduce: spawn ring members with troupe::ring_member_options() "
                           "(reentrant), or their segments cannot arrive while a call waits");
  if (!joined_) throw std::logic_error("ring_member::allreduce before join (use form_ring or spawn_ring)");
  if (active_ || done_)
    throw std::logic_error("ring_member::allreduce: a call is already in progress on this member");
  ++calls_started_;
  if (broken_)
    throw error(errc::broken_promise, "ring all-reduce call " + std::to_string(calls_started_) + " on member " +
                                          std::to_string(rank_) + ": the ring is broken: " + *broken_);
  const auto p = static_cast<std::uint32_t>(ring_.size());
  op_ = op;
  {
    auto owned = std::make_unique<std::vector<float>>(std::move(data));
    data_ = owned->data();
    size_ = owned->size();
    vector_ = owned.get();
    lease_ = std::shared_ptr<const void>(
        owned.release(), [self = this_actor::self<ring_member>(), call = calls_started_](std::vector<float>* v) {
          std::unique_ptr<std::vector<float>> back(v);
          if (t_catch && t_catch->vector == v) {  // the member dropped the last reference itself
            t_catch->caught = std::move(back);
            return;
          }
          try {
            self.tell(&ring_member::returned, call, std::move(*back));
          } catch (const std::exception&) {
            // The member is gone: nobody waits for the vector.
          }
        });
  }
  segments_left_ = 0;
  if (p > 1)
    for (std::uint32_t s = 0; s + 2 < 2 * p; ++s) {
      const auto c = (rank_ + p - 1 - s % p) % p;
      segments_left_ += segments_of(chunk_end(c) - chunk_begin(c), segment_);
    }
  active_ = true;
  done_.emplace();
  auto result = done_->get_future();
  if (p > 1) {
    const auto b = chunk_begin(rank_), e = chunk_end(rank_);
    for (std::uint32_t j = 0; b + j * segment_ < e; ++j) {
      const auto from = b + j * segment_, to = std::min<std::size_t>(e, from + segment_);
      send(0, j, from, to);
    }
    std::deque<pending_segment> early;
    early.swap(early_);
    for (auto& m : early) {
      if (m.call == calls_started_) handle(std::move(m));
      else if (m.call > calls_started_) early_.push_back(std::move(m));
    }
    if (active_ && timeout_ms_ > 0)
      this_actor::system().tell_after(std::chrono::milliseconds(timeout_ms_), this_actor::self<ring_member>(),
                                      &ring_member::expire, calls_started_);
  }
  finish_if_done();
  co_return co_await std::move(result);
}

void ring_member::send(std::uint32_t step, std::uint32_t segment, std::size_t from, std::size_t to) {
  counters_.elements_sent += to - from;
  counters_.messages_sent += 1;
  counters_.largest_message = std::max<std::uint64_t>(counters_.largest_message, to - from);
  ring_[(rank_ + 1) % ring_.size()].tell(&ring_member::receive, calls_started_, step, segment,
                                         static_cast<std::uint64_t>(size_),
                                         shared_span<float>({data_ + from, to - from}, lease_));
}

void ring_member::receive(std::uint64_t call, std::uint32_t step, std::uint32_t segment, std::uint64_t length,
                          shared_span<float> values) {
  if (!joined_ || broken_) return;
  pending_segment m{call, step, segment, length, std::move(values)};
  if (!active_ || call > calls_started_) {
    if (call > calls_started_) early_.push_back(std::move(m));
    return;  // a segment of a call that failed here is dropped
  }
  if (call < calls_started_) return;
  handle(std::move(m));
  finish_if_done();
}

void ring_member::handle(pending_segment m) {
  const auto p = static_cast<std::uint32_t>(ring_.size());
  if (m.length != size_) {
    fail_call("member " + std::to_string((rank_ + p - 1) % p) + " reduces " + std::to_string(m.length) +
                  " floats, member " + std::to_string(rank_) + " " + std::to_string(size_) +
                  ": every member must pass a vector of the same length",
              true);
    return;
  }
  const auto c = (rank_ + p - 1 - m.step % p) % p;
  const auto len = chunk_end(c) - chunk_begin(c);
  const bool in_range = m.step + 2 < 2 * p && m.segment < segments_of(len, segment_);
  const auto from = in_range ? chunk_begin(c) + m.segment * segment_ : 0;
  const auto to = in_range ? std::min<std::size_t>(chunk_end(c), from + segment_) : 0;
  if (!in_range || m.values.size() != to - from) {
    fail_call("member " + std::to_string(rank_) + " received a malformed segment (step " + std::to_string(m.step) +
                  ", segment " + std::to_string(m.segment) + ", " + std::to_string(m.values.size()) + " floats)",
              true);
    return;
  }
  // The sums overwrite this member's own values in place: its own value of an element is added
  // (or sent, for its own chunk) once, before any sum of it exists, so nothing reads it again,
  // and neither the result nor the messages need a buffer of their own.
  const float* __restrict in = m.values.data();
  float* __restrict out = data_ + from;
  const std::size_t n = to - from;
  if (m.step + 2 <= p) {  // reduce-scatter: the sum so far plus this member's value
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] + out[i];
  } else {  // all-gather: the final sums
    std::copy(in, in + n, out);
  }
  m.values = {};  // done with the predecessor's memory (its frame's buffer goes back for reuse)
  if (m.step + 3 < 2 * p) send(m.step + 1, m.segment, from, to);
  --segments_left_;
}

void ring_member::finish_if_done() {
  if (!active_ || segments_left_ != 0) return;
  active_ = false;
  finishing_ = true;
  data_ = nullptr;
  held_ = lease_;
  if (auto mine = drop_lease(lease_, vector_)) {  // no message refers to it: complete now
    complete(std::move(*mine));
    return;
  }
  // Else it comes back by `returned` when no message refers to it any more, or the timer's
  // `expire` (still armed) completes the call with a copy.
}

void ring_member::finish_with_copy() {
  if (!finishing_) return;
  auto lease = held_.lock();
  if (!lease) return;  // the last view is gone: `returned` is on its way
  // Only this member holds a weak reference, so a count of 1 cannot grow: the views went
  // meanwhile, and dropping `lease` hands the vector over here.
  if (lease.use_count() == 1)
    if (auto mine = drop_lease(lease, vector_)) {
      complete(std::move(*mine));
      return;
    }
  // Safe to read while views are out: nobody writes the vector any more. `lease` is dropped
  // only after the copy; the vector's own `returned` then finds nothing to complete.
  std::vector<float> copy(*vector_);
  if (auto mine = drop_lease(lease, vector_)) copy = std::move(*mine);  // the views went meanwhile
  complete(std::move(copy));
}

void ring_member::returned(std::uint64_t call, std::vector<float> result) {
  if (!finishing_ || call != calls_started_ || !done_) return;  // a failed or completed call's vector
  complete(std::move(result));
}

void ring_member::complete(std::vector<float> result) {
  finishing_ = false;
  held_.reset();
  vector_ = nullptr;
  if (op_ == reduce_op::mean) {
    const float p = static_cast<float>(ring_.size());
    for (auto& x : result) x /= p;
  }
  counters_.calls += 1;
  auto done = std::move(*done_);
  done_.reset();
  done.set_value(std::move(result));
}

void ring_member::fail_call(const std::string& why, bool tell_others) {
  const bool first = !broken_;
  if (first) broken_ = why;
  if (first && tell_others)
    for (std::uint32_t i = 0; i < ring_.size(); ++i) {
      if (i == rank_) continue;
      try {
        ring_[i].tell(&ring_member::abort, rank_, why);
      } catch (const std::exception&) {
        // A member that cannot be told is gone; its own monitors report it.
      }
    }
  early_.clear();
  // A call whose every segment is in has its result: it completes now rather than wait for
  // views that a broken ring may never release.
  if (finishing_) finish_with_copy();
  if (!active_) return;
  active_ = false;
  vector_ = nullptr;
  data_ = nullptr;
  lease_.reset();  // freed when the last message that refers to it is gone
  auto done = std::move(*done_);
  done_.reset();
  done.set_exception(std::make_exception_ptr(error(
      errc::broken_promise, "ring all-reduce call " + std::to_string(calls_started_) + " failed on member " +
                                std::to_string(rank_) + ": " + why)));
}

void ring_member::abort(std::uint32_t from, std::string why) {
  if (!joined_) return;
  fail_call(why + " (reported by member " + std::to_string(from) + ")", false);
}

void ring_member::expire(std::uint64_t call) {
  if (call != calls_started_) return;
  if (finishing_) {  // every segment is in, but views of the vector are still out
    finish_with_copy();
    return;
  }
  if (!active_) return;
  fail_call("call " + std::to_string(call) + " on member " + std::to_string(rank_) + " took longer than " +
                std::to_string(timeout_ms_) + " ms",
            true);
}

void ring_member::on_down(const down_notice& n) {
  if (!joined_) return;
  for (std::uint32_t i = 0; i < ring_.size(); ++i) {
    if (ring_[i].id() != n.id) continue;
    std::string why = "member " + std::to_string(i) + " (actor " + std::to_string(n.id) + ") is gone: " +
                      reason_name(n.reason);
    if (!n.what.empty()) why += " (" + n.what + ")";
    fail_call(why, true);
    return;
  }
}

void form_ring(const std::vector<actor_ref<ring_member>>& members, const ring_options& opts) {
  if (members.empty()) throw std::invalid_argument("form_ring: the group has no members");
  if (opts.segment_elements == 0) throw std::invalid_argument("form_ring: segment_elements must be at least 1");
  if (opts.timeout.count() < 0) throw std::invalid_argument("form_ring: a negative timeout");
  std::vector<future<void>> joined;
  for (std::uint32_t i = 0; i < members.size(); ++i)
    joined.push_back(members[i].ask(&ring_member::join, members, i, opts.segment_elements,
                                    static_cast<std::uint64_t>(opts.timeout.count())));
  for (auto& f : joined) f.get();
}

std::vector<actor_ref<ring_member>> spawn_ring(actor_system& sys, std::size_t p, const ring_options& opts) {
  if (p == 0) throw std::invalid_argument("spawn_ring: a ring needs at least one member");
  std::vector<actor_ref<ring_member>> ring;
  for (std::size_t i = 0; i < p; ++i) ring.push_back(sys.spawn<ring_member>(ring_member_options()));
  form_ring(ring, opts);
  return ring;
}

std::uint64_t ring_elements_sent(std::size_t n, std::size_t p, std::size_t rank) {
  if (p < 2) return 0;
  std::uint64_t total = 0;
  for (std::size_t s = 0; s + 2 < 2 * p; ++s) {
    const auto c = (rank + p * 2 - s) % p;  // member `rank` sends chunk (rank − s) mod p at step s
    total += (n * (c + 1)) / p - (n * c) / p;
  }
  return total;
}

std::vector<float> ring_sum_reference(const std::vector<std::vector<float>>& inputs) {
  if (inputs.empty()) return {};
  const std::size_t p = inputs.size(), n = inputs[0].size();
  for (const auto& x : inputs)
    if (x.size() != n) throw std::invalid_argument("ring_sum_reference: inputs of different lengths");
  std::vector<float> out(n);
  for (std::size_t c = 0; c < p; ++c)
    for (std::size_t i = (n * c) / p; i < (n * (c + 1)) / p; ++i) {
      float acc = inputs[c][i];
      for (std::size_t k = 1; k < p; ++k) acc += inputs[(c + k) % p][i];
      out[i] = acc;
    }
  return out;
}

}  // namespace troupe
