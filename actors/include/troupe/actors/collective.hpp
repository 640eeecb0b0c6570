#pragma once
/// @file
/// Ring all-reduce between actors, in one process or across nodes.
///
///   auto ring = troupe::spawn_ring(sys, 4);                 // four ring_member actors here
///   // or: members spawned anywhere with troupe::ring_member_options(), then form_ring(members)
///   std::vector<troupe::future<std::vector<float>>> f;
///   for (auto& m : ring) f.push_back(m.ask(&troupe::ring_member::allreduce, my_data, troupe::reduce_op::sum));
///   auto sum = f[0].get();                                   // every member gets the same vector
///
/// The algorithm is the bandwidth-optimal ring (Patarasuk and Yuan, 2009): the vector is cut into
/// p chunks; p−1 reduce-scatter steps leave member r with the full sum of chunk r+1, p−1
/// all-gather steps pass the summed chunks around; 2(p−1) steps, and each member sends
/// N + (p−2)·N/p elements, which is 2(p−1)/p·N when p divides N. Chunks travel in messages of at
/// most `segment_elements` floats, each forwarded as soon as it is reduced, so a large vector
/// streams through the ring instead of moving as p whole chunks.
///
/// Copies: a member sends its segments as views of its own vector (troupe::shared_span), never
/// copied into messages: in process the successor reads them where they are; across nodes the
/// transport writes them from there (on plain TCP; TLS encrypts from them into records of its
/// own) and the successor reduces straight from the frame it read. The sums overwrite the
/// member's vector in place, which becomes the result; it is handed back once no message in
/// flight refers to it any more, or, when views are still out at the ring's timeout or when the
/// ring breaks (a peer that stopped reading, a dial that hangs), as a copy: a member that has
/// every segment of its call completes it.
///
/// Summation order: chunk c is summed along the ring starting at member c, i.e.
/// ((x_c + x_{c+1}) + x_{c+2}) + ... + x_{c−1} (indices mod p), in float32; every member gets the
/// same bits. Integers stored in floats (|sum| < 2^24) come out exactly equal to the plain sum.
/// reduce_op::mean divides the sum by p on every member.
///
/// Failure: every member monitors the others from form_ring on. When a member is gone (stopped,
/// failed, its node lost) or a call runs past the ring's timeout, the call in progress fails on
/// every member with troupe::error(errc::broken_promise) whose message starts "ring all-reduce"
/// and names the member and the reason (a caller on another node than its member sees
/// errc::remote_exception with that message), and the ring stays broken: later calls fail at once. A ring is formed once; all its members
/// call allreduce the same number of times, with vectors of the same length.

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/actor_system.hpp"
#include "troupe/actors/remote.hpp"
#include "troupe/core/shared_span.hpp"

namespace troupe {

/// What an all-reduce computes from the members' vectors.
enum class reduce_op : std::uint8_t { sum = 0, mean = 1 };

/// Counters of one ring member since it was spawned.
struct ring_counters {
  std::uint64_t calls = 0;              ///< all-reduce calls completed here
  std::uint64_t elements_sent = 0;      ///< floats this member sent to its successor
  std::uint64_t messages_sent = 0;      ///< chunk messages it sent
  std::uint64_t largest_message = 0;    ///< the most floats in one of its messages
};

template <>
struct enum_bounds<reduce_op> {
  static constexpr reduce_op last = reduce_op::mean;
};

template <>
struct codec<ring_counters> {
  static void encode(byte_writer& w, const ring_counters& c) {
    w.write_raw(c.calls);
    w.write_raw(c.elements_sent);
    w.write_raw(c.messages_sent);
    w.write_raw(c.largest_message);
  }
  static ring_counters decode(byte_reader& r) {
    ring_counters c;
    c.calls = r.read_raw<std::uint64_t>();
    c.elements_sent = r.read_raw<std::uint64_t>();
    c.messages_sent = r.read_raw<std::uint64_t>();
    c.largest_message = r.read_raw<std::uint64_t>();
    return c;
  }
};

/// One member of a ring all-reduce group: an actor (spawn it reentrant: ring_member_options()).
/// Its methods are the protocol; users call allreduce and counters.
class ring_member {
public:
  ring_member() = default;

  /// Makes this actor member `rank` of `ring` (in ring order), forwarding at most
  /// `segment_elements` floats per message, and failing a call that takes longer than
  /// `timeout_ms` (0: no limit besides the monitors). Throws std::invalid_argument for an empty
  /// ring, a rank outside it, a zero segment size, or a second join.
  void join(std::vector<actor_ref<ring_member>> ring, std::uint32_t rank, std::uint64_t segment_elements,
            std::uint64_t timeout_ms);

  /// Reduces `data` with the other members' vectors of this call; the result on every member.
  /// Throws troupe::error(errc::broken_promise) when the ring is broken or breaks meanwhile,
  /// std::invalid_argument when the lengths of the members' vectors differ (on every member),
  /// std::logic_error before join or when the actor is not reentrant.
  task<std::vector<float>> allreduce(std::vector<float> data, reduce_op op);

  /// A chunk segment from the predecessor: call number, step (0..2p−3), segment index, values
  /// (a view of the predecessor's vector, or of the frame it came in).
  void receive(std::uint64_t call, std::uint32_t step, std::uint32_t segment, std::uint64_t length,
               shared_span<float> values);
  /// Another member gave up: the ring is broken for `why`.
  void abort(std::uint32_t from, std::string why);
  /// The call `call` ran past the timeout (a timer's message to itself).
  void expire(std::uint64_t call);

  /// This member's counters.
  ring_counters counters() const { return counters_; }

  void on_down(const down_notice& n);

private:
  struct pending_segment {
    std::uint64_t call;
    std::uint32_t step;
    std::uint32_t segment;
    std::uint64_t length;
    shared_span<float> values;
  };
  void handle(pending_segment m);
  void send(std::uint32_t step, std::uint32_t segment, std::size_t from, std::size_t to);
  /// The vector of call `call`, back from the last message that referred to it.
  void returned(std::uint64_t call, std::vector<float> result);
  std::size_t chunk_begin(std::uint32_t chunk) const;
  std::size_t chunk_end(std::uint32_t chunk) const;
  void fail_call(const std::string& why, bool tell_others);
  void finish_if_done();
  /// Completes a finishing call now, with a copy of the vector while views of it are still out.
  void finish_with_copy();
  void complete(std::vector<float> result);

  std::vector<actor_ref<ring_member>> ring_;
  std::uint32_t rank_ = 0;
  std::uint64_t segment_ = 0;
  std::uint64_t timeout_ms_ = 0;
  bool joined_ = false;
  std::optional<std::string> broken_;

  // The call in progress (calls_started_ is its number, from 1), when active_.
  std::uint64_t calls_started_ = 0;
  bool active_ = false;
  reduce_op op_ = reduce_op::sum;
  // This member's vector, overwritten by the sums; `lease_` owns it and is what the views sent
  // share. When the last of them is gone the vector comes back by `returned`.
  float* data_ = nullptr;
  std::size_t size_ = 0;
  const std::vector<float>* vector_ = nullptr;  // the vector `lease_` owns
  std::shared_ptr<const void> lease_;
  bool finishing_ = false;  // every segment is in; the vector is on its way back
  std::weak_ptr<const void> held_;  // while finishing: the vector, to copy if views never go
  std::uint64_t segments_left_ = 0;
  std::optional<promise<std::vector<float>>> done_;
  std::deque<pending_segment> early_;  // segments of a call not started here yet

  ring_counters counters_;
};

/// Spawn options a ring member needs (reentrant: its allreduce waits while segments come in).
inline spawn_options ring_member_options() {
  spawn_options o;
  o.reentrant = true;
  return o;
}

/// Settings of a ring.
struct ring_options {
  std::uint64_t segment_elements = 1u << 16;  ///< floats per message at most (256 KiB)
  /// Per call; 0: only the monitors end a stuck call, and a member with every segment in waits
  /// until no message refers to its vector any more.
  std::chrono::milliseconds timeout{0};
};

/// Makes `members` (spawned with ring_member_options(), on any nodes) one ring, in this order,
/// and waits until each has joined. Throws std::invalid_argument for an empty group or a
/// zero segment size; not from inside an actor.
void form_ring(const std::vector<actor_ref<ring_member>>& members, const ring_options& opts = {});

/// Spawns `p` ring members in `sys` and forms them into a ring.
std::vector<actor_ref<ring_member>> spawn_ring(actor_system& sys, std::size_t p, const ring_options& opts = {});

/// Floats member `rank` of `p` sends for one all-reduce of `n` floats: n + (p−2)·(chunk sizes),
/// exactly 2(p−1)/p·n when p divides n.
std::uint64_t ring_elements_sent(std::size_t n, std::size_t p, std::size_t rank);

/// The plain reference: the ring's sum computed in one place, in the ring's summation order
/// (chunk c from member c onward), so that it equals the all-reduce bit for bit.
std::vector<float> ring_sum_reference(const std::vector<std::vector<float>>& inputs);

}  // namespace troupe

TROUPE_REMOTE(troupe::ring_member, join, allreduce, receive, abort, expire, counters)
