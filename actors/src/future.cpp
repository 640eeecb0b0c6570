#include "troupe/actors/future.hpp"

#include <thread>

#include "sync.hpp"
#include "system.hpp"
#include "troupe/core/log.hpp"

namespace troupe::detail {
namespace {

/// Carries a continuation to its actor when the state itself cannot travel (it may still
/// sit in the target's mailbox, e.g. after a timeout).
class relay final : public message {
public:
  explicit relay(state_base* st) noexcept : st_(st) { st_->add_ref(); }
  // The state keeps its request phase (it may still be queued as the ask): only the
  // continuation runs here.
  void run(cell_base& self) override { st_->continue_in(self); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override {
    st_->release();
    std::unique_ptr<relay>{this};
  }
  const char* kind() const noexcept override { return "resume"; }
  bool is_continuation() const noexcept override { return true; }

private:
  state_base* st_;
};

/// Runs `f` with no actor marked as running on this thread: an inline continuation of code
/// outside actors must not be mistaken for the actor that completed the future.
template <class F>
void outside_actor(F&& f) noexcept {
  auto& current = tls_current_cell();
  cell_base* saved = std::exchange(current, nullptr);
  f();
  current = saved;
}

}  // namespace

state_base::~state_base() {
  if (cont_cell_) cont_cell_->release();
  if (holds_system_) sys_->release();
}

void state_base::keep_system(system_impl* s) noexcept {
  if (holds_system_) sys_->release();
  s->add_ref();
  sys_ = s;
  holds_system_ = true;
}

void state_base::run_request(cell_base&) {
  log().critical("internal error: a future's state was queued as a request");
  std::abort();
}

void state_base::run(cell_base& self) {
  if (phase_ == phase_request) {
    run_request(self);
    return;
  }
  continue_in(self);
}

void state_base::continue_in(cell_base& self) noexcept {
  if (self.incarnation() != cont_incarnation_) {
    // The actor restarted since: the coroutine frame is gone and the callback's object too.
    cont_handle_ = {};
    cont_callback_.reset();
    return;
  }
  if (cont_handle_) self.reply_came();  // a coroutine resumes: it awaits nobody now
  continue_now();  // the continuation phase, in the awaiting actor's context
}

void state_base::continue_now() noexcept {
  if (cont_callback_) {
    auto cb = std::move(cont_callback_);
    cb->invoke(*this);
  } else if (auto h = std::exchange(cont_handle_, {})) {
    h.resume();
  }
}

void state_base::reject(errc why) noexcept {
  if (phase_ == phase_request) fail(std::make_exception_ptr(error(why)), true);
  // A continuation for a dead actor is dropped: its coroutine frame is already gone.
}

void state_base::publish(bool node_free) noexcept {
  auto prev = status_.fetch_or(st_ready, std::memory_order_acq_rel);
  if (prev & st_waiter) futex_wake_all(status_);
  if (prev & st_cont) dispatch_continuation(node_free);
}

void state_base::dispatch_continuation(bool node_free) noexcept {
  if (cell_base* c = std::exchange(cont_cell_, nullptr)) {
    if (node_free) {
      phase_ = cont_callback_ ? phase_callback : phase_resume;
      add_ref();  // the mailbox's reference
      c->enqueue_urgent(message_ptr(this));
    } else {
      c->enqueue_urgent(message_ptr(std::make_unique<relay>(this).release()));
    }
    c->release();
    return;
  }
  outside_actor([this] { continue_now(); });
}

bool state_base::install(cell_base* cell) noexcept {
  if (cell) {
    cell->add_ref();
    cont_cell_ = cell;
    cont_incarnation_ = cell->incarnation();
  }
  auto prev = status_.fetch_or(st_cont, std::memory_order_acq_rel);
  if ((prev & st_ready) == 0) return false;
  // The completer has come and gone without seeing us: the caller continues itself.
  if (cont_cell_) std::exchange(cont_cell_, nullptr)->release();
  return true;
}

bool state_base::set_resume(cell_base* cell, std::coroutine_handle<> h) noexcept {
  cont_handle_ = h;
  if (!install(cell)) return true;
  cont_handle_ = {};
  return false;  // do not suspend
}

void state_base::resume_later(cell_base& cell, std::coroutine_handle<> h) noexcept {
  cont_handle_ = h;
  cont_incarnation_ = cell.incarnation();
  cell.enqueue_urgent(message_ptr(std::make_unique<relay>(this).release()));
}

void state_base::set_callback(cell_base* cell, std::unique_ptr<callback_base> cb) noexcept {
  cont_callback_ = std::move(cb);
  // Already there: run it now, in the caller's context (the same actor, or none).
  if (install(cell)) continue_now();
  // Our caller's reference to this state is gone; the callback owns the consumer's share.
  release();
}

void state_base::wait() {
  if (tls_current_cell() != nullptr || tls_on_worker())
    throw error(errc::would_deadlock,
                "future::get() on an actor's worker thread would block it; use co_await or then()");
  if (ready()) return;
  if (sys_ != nullptr && sys_->manual != nullptr) {
    auto& m = *sys_->manual;
    while (!ready()) {
      if (!m.run_one() && !m.fire_next(m.now()))
        throw error(errc::would_deadlock,
                    "future::get() on a test_system that went idle before the reply "
                    "(advance() the clock if a timer should fire)");
    }
    return;
  }
  // A reply usually comes within microseconds: spin briefly before sleeping in the kernel.
  for (int i = 0; i < 2000; ++i) {
    if (ready()) return;
    cpu_relax();
    if ((i & 255) == 255) std::this_thread::yield();
  }
  auto prev = status_.fetch_or(st_waiter, std::memory_order_acq_rel);
  while ((prev & st_ready) == 0) {
    futex_wait(status_, prev | st_waiter);
    prev = status_.load(std::memory_order_acquire);
  }
}

void arm_timeout(state_base& st, std::chrono::nanoseconds d) {
  if (st.ready()) return;
  if (st.system() == nullptr) throw std::logic_error("future::timeout on a future without a system");
  st.add_ref();
  // A timeout the timers never fire (the system shut down before it was due, or before it was
  // armed) fails the future with system_shutdown when the timer drops it: never a get() that
  // waits for good.
  struct pending {
    state_base* st;
    bool fired = false;
    explicit pending(state_base* s) : st(s) {}
    pending(const pending&) = delete;
    pending& operator=(const pending&) = delete;
    ~pending() {
      if (!fired) st->fail(std::make_exception_ptr(error(errc::system_shutdown)), false);
      st->release();
    }
  };
  auto hold = std::make_shared<pending>(&st);
  add_timer(*st.system(), d, std::chrono::nanoseconds{0}, [hold] {
    hold->fired = true;
    hold->st->fail(std::make_exception_ptr(error(errc::timeout)), false);
    return false;
  });
}

void report_callback_error(std::exception_ptr e) noexcept {
  if (auto* c = tls_current_cell()) {
    // After what runs now: the callback may have run inline, inside one of the actor's methods.
    c->fail_soon(std::move(e));
    return;
  }
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    log().error("an error reached a then() callback without an error handler: {}", ex.what());
  } catch (...) {
    log().error("an error reached a then() callback without an error handler");
  }
}

}  // namespace troupe::detail
