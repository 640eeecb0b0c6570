// The life of an actor: start, failure, restart, stop, its suspended coroutines, its children
// and the down notices it sends and receives, driven by urgent system messages.
//
// Stop. A stop is an urgent message. Handling it destroys suspended coroutines (their asks
// fail with actor_dead), runs on_stop, destroys the object, refuses everything still queued
// (dead letters), releases throttled senders, sends down notices and forgets names. The cell
// itself lives on while references exist, refusing whatever still arrives.

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cell_bounded.hpp"
#include "failure_log.hpp"
#include "sync.hpp"
#include "system.hpp"
#include "troupe/core/log.hpp"

namespace troupe::detail {
namespace {

class start_message final : public message {
public:
  void run(cell_base& self) override { self.handle_start(); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<start_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }
};

class restart_message final : public message {
public:
  void run(cell_base& self) override { self.handle_restart(); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<restart_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }
};

class stop_message final : public message {
public:
  explicit stop_message(exit_reason why) : why_(why) {}
  void run(cell_base& self) override { self.handle_stop(why_, {}); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<stop_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }  // stopped twice: nothing lost

private:
  exit_reason why_;
};

/// A failure found inside a method (an error without handler in a then() callback that ran
/// inline): the actor fails once that method is done, unless it restarted meanwhile.
class fail_message final : public message {
public:
  fail_message(std::exception_ptr e, std::uint32_t incarnation) : error_(std::move(e)), incarnation_(incarnation) {}
  void run(cell_base& self) override {
    if (self.incarnation() == incarnation_) self.fail(error_);
  }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<fail_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }

private:
  std::exception_ptr error_;
  std::uint32_t incarnation_;
};

class down_message final : public message {
public:
  explicit down_message(down_notice n) : notice_(std::move(n)) {}
  void run(cell_base& self) override { self.handle_down(notice_); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<down_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }

private:
  down_notice notice_;
};

std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

}  // namespace

message_ptr make_start_message() { return message_ptr(std::make_unique<start_message>().release()); }

void install_restart_factory(cell_base& c, std::unique_ptr<restart_factory> f) {
  system_access::extras(c).factory = std::move(f);
}

const restart_factory* find_restart_factory(cell_base& c) noexcept {
  return system_access::extras(c).factory.get();
}

void mark_named(cell_base& c) {
  flag_guard g(system_access::lock(c));
  system_access::extras(c).named = true;
}

// ---- coroutines -------------------------------------------------------------------

void cell_base::coroutine_suspended(void* frame) noexcept {
  ++suspended_;
  flag_guard g(lock_);
  extras().frames.push_back(frame);
}

void cell_base::coroutine_finished(void* frame) noexcept {
  std::vector<down_notice> deferred;
  {
    flag_guard g(lock_);
    auto& f = extras().frames;
    f.erase(std::remove(f.begin(), f.end(), frame), f.end());
    if (--suspended_ == 0) deferred.swap(extras_->deferred);
  }
  for (auto& n : deferred) handle_down(n);
}

void cell_base::destroy_frames() noexcept {
  reply_came();  // an await of theirs is over
  cell_extras* ex = extras_if_any();
  if (!ex) return;
  std::vector<void*> frames;
  {
    flag_guard g(lock_);
    frames.swap(ex->frames);
  }
  suspended_ = 0;
  for (void* f : frames) std::coroutine_handle<>::from_address(f).destroy();
}

// ---- lifecycle --------------------------------------------------------------------

void cell_base::stop(exit_reason why) noexcept {
  if (!alive()) return;
  stop_requested_.store(true, std::memory_order_seq_cst);
  enqueue_urgent(message_ptr(std::make_unique<stop_message>(why).release()));
}

void cell_base::fail_soon(std::exception_ptr e) noexcept {
  enqueue_urgent(message_ptr(std::make_unique<fail_message>(std::move(e), incarnation()).release()));
}

void cell_base::handle_start() noexcept {
  if (life_.load(std::memory_order_relaxed) != life_running) return;
  try {
    call_on_start();
  } catch (...) {
    fail(std::current_exception());
  }
}

void cell_base::on_stop_threw(std::exception_ptr e) noexcept {
  log().error("actor {} ({}): on_stop threw (ignored, the actor stops anyway): {}", id_, type_name(), describe(e));
}

void cell_base::fail(std::exception_ptr e) noexcept {
  const auto life = life_.load(std::memory_order_relaxed);
  if (life == life_dead) return;
  std::string what = describe(e);
  cell_extras* ex = extras_if_any();
  const bool may_restart =
      ex && ex->factory && (ex->restart.max_restarts < 0 || ex->restarts < ex->restart.max_restarts);
  if (!may_restart) {
    log().error("actor {} ({}) failed: {}", id_, type_name(), what);
    system_->failures->record(id_, type_name(), false, ex ? static_cast<std::uint32_t>(ex->restarts.load()) : 0, what);
    handle_stop(exit_reason::failed, what);
    return;
  }
  const int restarts = ++ex->restarts;
  system_->failures->record(id_, type_name(), true, static_cast<std::uint32_t>(restarts), what);
  ex->failure = what;
  auto delay = ex->next_backoff;
  ex->next_backoff = std::min<std::chrono::nanoseconds>(
      std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(delay.count()) *
                                                         ex->restart.backoff_multiplier)),
      ex->restart.max_backoff);
  // A restart loop must not flood the log: the first few restarts, then every 1,000th.
  if (restarts <= 10 || restarts % 1000 == 0)
    log().warn("actor {} ({}) failed: {}; restart {} in {} ms", id_, type_name(), what, restarts,
               std::chrono::duration_cast<std::chrono::milliseconds>(delay).count());
  // Continuations that still point into this incarnation (a coroutine about to be destroyed, a
  // callback on the old object) are dropped when they arrive.
  incarnation_.fetch_add(1, std::memory_order_relaxed);
  if (life == life_running) {
    destroy_frames();
    call_on_stop();
  }
  destroy_object();
  stop_children();  // the new object makes its own
  life_.store(life_restarting, std::memory_order_release);
  if (delay.count() <= 0) {
    enqueue_urgent(message_ptr(std::make_unique<restart_message>().release()));
  } else {
    add_timer(*system_, delay, std::chrono::nanoseconds{0}, [self = cell_ptr(this)] {
      self->enqueue_urgent(message_ptr(std::make_unique<restart_message>().release()));
      return false;
    });
  }
}

void cell_base::handle_restart() noexcept {
  if (life_.load(std::memory_order_relaxed) != life_restarting) return;
  try {
    recreate_object();
  } catch (...) {
    // The constructor failed: count it as another failure (restart policy applies).
    fail(std::current_exception());
    return;
  }
  life_.store(life_running, std::memory_order_release);
  handle_start();
  // Down notices held while the old incarnation was suspended: the monitors belong to the
  // actor, so the new incarnation hears of them.
  if (life_.load(std::memory_order_relaxed) != life_running) return;  // on_start failed
  std::vector<down_notice> deferred;
  {
    flag_guard g(lock_);
    if (extras_ && suspended_ == 0) deferred.swap(extras_->deferred);
  }
  for (auto& n : deferred) handle_down(n);
}

void cell_base::handle_stop(exit_reason why, const std::string& what) noexcept {
  const auto life = life_.load(std::memory_order_relaxed);
  if (life == life_dead) return;
  if (life == life_running) destroy_frames();
  life_.store(life_dead, std::memory_order_release);
  if (life == life_running) call_on_stop();
  destroy_object();
  reject_all(errc::actor_dead);
  stop_children();

  std::vector<cell_extras::waiter> waiters;
  std::vector<cell_extras::watcher> watchers;
  bool named = false;
  {
    flag_guard g(lock_);
    if (extras_) {
      waiters.swap(extras_->waiters);
      watchers.swap(extras_->watchers);
      extras_->deferred.clear();
      extras_->down_sent = true;
      named = extras_->named;
    }
    // (Kept for a monitor set later, with or without extras until now.)
    if (why == exit_reason::failed) extras().failure = what;
    exit_reason_ = why;
    down_sent_ = true;
  }
  has_waiters_.store(false, std::memory_order_relaxed);
  // Gone from the names and the live count before anyone hears of it: a monitor that fires
  // sees live_actors() without it and may register its name again.
  if (named) system_->forget_names_of(this);
  system_->remove_live(this);
  release_waiters(*system_, waiters);
  if (!watchers.empty()) {
    down_notice n{id_, why, why == exit_reason::failed ? what : std::string()};
    for (auto& w : watchers) {
      if (w.cell) w.cell->enqueue_urgent(message_ptr(std::make_unique<down_message>(n).release()));
      else w.callback->notify(n);
    }
  }
  system_->left_live();
  release();  // the system's reference (the scheduler still holds one while we run)
}

void cell_base::handle_down(const down_notice& n) noexcept {
  const auto life = life_.load(std::memory_order_relaxed);
  if (life == life_dead) return;
  // Held for later while a method is suspended, or while the actor restarts: the monitors
  // belong to the actor, and the next incarnation hears of them (handle_restart).
  if (life == life_restarting || (suspended_ != 0 && !reentrant_)) {
    flag_guard g(lock_);
    extras().deferred.push_back(n);
    return;
  }
  try {
    call_on_down(n);
  } catch (...) {
    fail(std::current_exception());
  }
}

namespace {
/// Watchers that are gone (a stopped actor, a dropped monitor future) leave the list when it
/// has doubled since it was last pruned: an actor watched by many short-lived ones keeps a list
/// as long as its live watchers, not as long as its history. Called under the cell's lock;
/// what is pruned is destroyed by the caller, after the lock.
std::vector<cell_extras::watcher> prune_watchers(cell_extras& ex) {
  std::vector<cell_extras::watcher> gone;
  if (ex.watchers.size() < ex.prune_watchers_at) return gone;
  auto keep = std::partition(ex.watchers.begin(), ex.watchers.end(), [](const cell_extras::watcher& w) {
    return w.cell ? w.cell->alive() : !w.callback->abandoned();
  });
  gone.assign(std::make_move_iterator(keep), std::make_move_iterator(ex.watchers.end()));
  ex.watchers.erase(keep, ex.watchers.end());
  ex.prune_watchers_at = std::max<std::size_t>(16, 2 * ex.watchers.size());
  return gone;
}
}  // namespace

void cell_base::add_watcher(cell_base* watcher) {
  if (!watcher->has_on_down())
    throw std::invalid_argument(std::string("monitor: ") + watcher->type_name() +
                                " has no on_down(const troupe::down_notice&) to receive the notice");
  down_notice late;
  std::vector<cell_extras::watcher> gone;
  {
    flag_guard g(lock_);
    if (!down_sent_) {
      gone = prune_watchers(extras());
      extras().watchers.push_back({cell_ptr(watcher), nullptr});
      return;
    }
    late = {id_, exit_reason_, extras_ ? extras_->failure : std::string()};
  }
  watcher->enqueue_urgent(message_ptr(std::make_unique<down_message>(std::move(late)).release()));
}

void send_down_notice(cell_base& watcher, const down_notice& n) {
  watcher.enqueue_urgent(message_ptr(std::make_unique<down_message>(n).release()));
}

void cell_base::adopt_child(cell_base& child) {
  std::vector<cell_ptr> gone;
  {
    flag_guard g(lock_);
    if (!down_sent_) {
      auto& ex = extras();
      if (ex.children.size() >= ex.prune_children_at) {  // children that ended leave the list
        auto keep = std::partition(ex.children.begin(), ex.children.end(), [](const cell_ptr& c) { return c->alive(); });
        gone.assign(std::make_move_iterator(keep), std::make_move_iterator(ex.children.end()));
        ex.children.erase(keep, ex.children.end());
        ex.prune_children_at = std::max<std::size_t>(16, 2 * ex.children.size());
      }
      ex.children.emplace_back(&child);
      return;
    }
  }
  child.stop(exit_reason::stopped);
}

void cell_base::stop_children() noexcept {
  std::vector<cell_ptr> children;
  {
    flag_guard g(lock_);
    if (extras_) children.swap(extras_->children);
  }
  for (auto& c : children) c->stop(exit_reason::stopped);
}

void cell_base::on_down(std::unique_ptr<down_callback> f) {
  down_notice late;
  std::vector<cell_extras::watcher> gone;
  {
    flag_guard g(lock_);
    if (!down_sent_) {
      gone = prune_watchers(extras());
      extras().watchers.push_back({cell_ptr(), std::move(f)});
      return;
    }
    late = {id_, exit_reason_, extras_ ? extras_->failure : std::string()};
  }
  f->notify(late);
}

}  // namespace troupe::detail
