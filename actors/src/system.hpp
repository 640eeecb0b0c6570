#pragma once
// The runtime behind actor_system (private to the actors module).

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/actors/actor_system.hpp"
#include "troupe/actors/detail/cell.hpp"
#include "sync.hpp"

namespace troupe::detail {

/// Runs cells. A cell handed to schedule() was idle and comes with one reference, which the
/// cell gives back when it goes idle again; reschedule() is for a cell that is still
/// scheduled (its slice ended with work left, or a throttled sender was released).
class scheduler {
public:
  virtual ~scheduler() = default;
  virtual void schedule(cell_base* c) noexcept = 0;
  virtual void reschedule(cell_base* c) noexcept = 0;
  /// Joins the workers; afterwards schedule() runs slices on the calling thread.
  virtual void stop() noexcept = 0;
};

/// Fires callbacks after a delay (once or periodically). A callback returns false to end a
/// periodic timer.
class timer_service {
public:
  virtual ~timer_service() = default;
  virtual void add(std::chrono::nanoseconds delay, std::chrono::nanoseconds period,
                   std::function<bool()> fire, std::shared_ptr<std::atomic<bool>> cancelled) = 0;
  virtual void stop() noexcept = 0;
};

class manual_runtime;
class node_runtime;
class failure_log;

std::unique_ptr<scheduler> make_thread_pool(system_impl& sys, unsigned threads,
                                            unsigned throughput);
std::unique_ptr<timer_service> make_timer_thread();

/// Extra state of a cell that most actors never need; allocated on first use.
struct cell_extras {
  struct waiter {
    cell_ptr sender;                            // a throttled actor, or
    std::atomic<std::uint32_t>* word = nullptr;  // a blocked thread's futex word
  };
  struct watcher {
    cell_ptr cell;                          // an actor with on_down, or
    std::unique_ptr<down_callback> callback;  // a callback (system::monitor)
  };
  std::vector<waiter> waiters;
  std::vector<watcher> watchers;
  std::size_t prune_watchers_at = 16;   // prune the gone ones when watchers reaches this
  std::vector<cell_ptr> children;       // this_actor::spawn_child: stopped with this actor
  std::size_t prune_children_at = 16;
  std::vector<void*> frames;            // suspended root coroutines (actor context)
  std::vector<down_notice> deferred;    // down notices held while suspended
  std::unique_ptr<restart_factory> factory;
  restart_policy restart;
  std::atomic<int> restarts{0};  // written by the actor's worker, read by status reports
  std::chrono::nanoseconds next_backoff{0};
  std::string failure;  // what the last failure said
  bool down_sent = false;
  bool named = false;
};

class system_impl {
public:
  system_impl(actor_system* facade, const system_config& cfg, bool manual);
  ~system_impl();

  void schedule(cell_base* c) noexcept { sched_->schedule(c); }
  void reschedule(cell_base* c) noexcept { sched_->reschedule(c); }
  timer_service& timers() noexcept { return *timers_; }

  actor_id next_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  void add_live(cell_base* c);
  /// A stopping actor leaves the live list (and count), then tells its watchers, then calls
  /// left_live(): shutdown waits for both.
  void remove_live(cell_base* c) noexcept;
  void left_live() noexcept { leaving.fetch_sub(1, std::memory_order_release); }
  void dead_letter(const cell_base& target, const char* kind, errc why) noexcept;
  void dead_letter(actor_id target, const char* type, const char* kind, errc why) noexcept;
  void forget_names_of(cell_base* c) noexcept;
  void shutdown() noexcept;
  /// Stops every live actor (exit_reason::shutdown) without waiting; with `drain`, refuses
  /// spawns until none is left (stop_all_actors).
  void stop_all(bool drain) noexcept;

  // Keeps the runtime alive while cells exist: the facade holds one, every cell one.
  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept;

  actor_system* facade;
  manual_runtime* manual = nullptr;  // set for test_system
  unsigned throughput;

  std::mutex names_mutex;
  /// Guards every cell's parked_on_ (actors paused by a full mailbox) and `waits`: parking,
  /// the cycle check, and the unparking of an actor that an urgent message reached.
  std::mutex park_mutex;
  /// What an actor waits for before it drains its mailbox or replies: the receiver it is
  /// parked on (which it holds a reference to), and the actor whose reply its suspended,
  /// non-reentrant method awaits (an identity, never dereferenced; recorded only once the
  /// system has a bounded mailbox, the only thing that pauses). A pause that would close a
  /// loop of such waits is not taken, or released when an await closes it.
  struct waits_for {
    cell_base* parked_on = nullptr;
    const cell_base* awaits = nullptr;
  };
  std::unordered_map<const cell_base*, waits_for> waits;
  std::atomic<bool> has_bounded{false};  // a bounded mailbox was ever spawned
  std::unordered_map<std::string, cell_ptr> names;

  spinlock live_lock;  // guards the list; short sections on the spawn/stop paths
  cell_base* live_head = nullptr;
  std::atomic<std::uint32_t> live_count{0};  // a futex word: shutdown sleeps until it is 0
  std::atomic<std::uint32_t> leaving{0};  // actors between remove_live and left_live
  std::atomic<std::uint32_t> idle_waiters{0};  // threads in await_all_actors_done (woken at 0)
  /// Set by stop_all_actors() until no actor is left: spawns are refused meanwhile, so that
  /// an actor cannot outlive it by spawning one as it stops.
  std::atomic<bool> draining{false};
  std::atomic<bool> shutting_down{false};
  std::atomic<std::uint64_t> dead_letters{0};
  /// The actors' failures and restarts, for the node's status report (failure_log.hpp).
  std::unique_ptr<failure_log> failures;
  /// The node part when the system is a node of a cluster (net/node_runtime.hpp).
  std::shared_ptr<node_runtime> node;

private:
  std::unique_ptr<scheduler> sched_;
  std::unique_ptr<timer_service> timers_;
  std::atomic<actor_id> next_id_{1};
  std::atomic<std::size_t> refs_{1};
  std::mutex shutdown_mutex_;
  bool shut_down_ = false;
};

/// The test_system's scheduler and clock: runs only when told, on the calling thread.
class manual_runtime final : public scheduler, public timer_service {
public:
  void schedule(cell_base* c) noexcept override { queue_.push_back(c); }
  void reschedule(cell_base* c) noexcept override { queue_.push_back(c); }
  void stop() noexcept override;
  /// Runs one slice, or else fires one timer due at the current virtual time; false when
  /// neither was there (what a sender waiting for room in a mailbox does on this runtime).
  bool run_something() { return run_one() || fire_next(now_); }
  /// True while a timer's callback runs (its tells never wait for room, as on the timer thread).
  bool firing() const noexcept { return firing_; }
  void add(std::chrono::nanoseconds delay, std::chrono::nanoseconds period,
           std::function<bool()> fire, std::shared_ptr<std::atomic<bool>> cancelled) override;

  bool run_one() noexcept;
  std::size_t run_until_idle() noexcept;
  /// Fires the earliest timer due at or before `limit`; false when there is none.
  bool fire_next(std::chrono::nanoseconds limit);
  void advance(std::chrono::nanoseconds d);
  std::chrono::nanoseconds now() const noexcept { return now_; }
  bool has_timers() const noexcept { return !timers_.empty(); }

  unsigned throughput = 64;

private:
  struct entry {
    std::chrono::nanoseconds period;
    std::function<bool()> fire;
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  std::deque<cell_base*> queue_;
  std::multimap<std::pair<std::chrono::nanoseconds, std::uint64_t>, entry> timers_;
  std::uint64_t seq_ = 0;
  std::chrono::nanoseconds now_{0};
  bool firing_ = false;
  bool stopped_ = false;
};

}  // namespace troupe::detail

namespace troupe::detail {
message_ptr make_start_message();
/// Delivers a down notice to an actor with on_down.
void send_down_notice(cell_base& watcher, const down_notice& n);
void mark_named(cell_base& c);
}  // namespace troupe::detail
