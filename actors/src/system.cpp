#include "system.hpp"
#include "failure_log.hpp"
#include "net/node.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "troupe/core/log.hpp"

namespace troupe::detail {

// ---- system_impl ------------------------------------------------------------------

system_impl::system_impl(actor_system* f, const system_config& cfg, bool is_manual)
    : facade(f), throughput(cfg.throughput == 0 ? 1 : cfg.throughput), failures(std::make_unique<failure_log>()) {
  if (is_manual) {
    auto m = std::make_unique<manual_runtime>();
    m->throughput = throughput;
    manual = m.get();
    sched_ = std::move(m);
  } else {
    if (cfg.threads > system_config::max_threads)
      throw std::invalid_argument("system_config::threads is " + std::to_string(cfg.threads) + ", more than " +
                                  std::to_string(system_config::max_threads) + " worker threads");
    unsigned threads = cfg.threads != 0 ? cfg.threads : std::thread::hardware_concurrency();
    if (threads == 0) threads = 1;
    sched_ = make_thread_pool(*this, threads, throughput);
    timers_ = make_timer_thread();
  }
}

system_impl::~system_impl() = default;


void system_impl::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) std::unique_ptr<system_impl>{this};
}

void system_impl::add_live(cell_base* c) {
  std::lock_guard lock(live_lock);
  if (shutting_down.load(std::memory_order_relaxed))
    throw error(errc::system_shutdown, "spawn after the actor system began to shut down");
  if (draining.load(std::memory_order_relaxed))
    throw error(errc::system_shutdown,
                "spawn while stop_all_actors() stops every actor (spawning works again once they are gone)");
  c->live_prev_ = nullptr;
  c->live_next_ = live_head;
  if (live_head) live_head->live_prev_ = c;
  live_head = c;
  live_count.fetch_add(1, std::memory_order_relaxed);
}

void system_impl::remove_live(cell_base* c) noexcept {
  leaving.fetch_add(1, std::memory_order_relaxed);
  bool last = false;
  {
    std::lock_guard lock(live_lock);
    if (c->live_prev_) c->live_prev_->live_next_ = c->live_next_;
    else live_head = c->live_next_;
    if (c->live_next_) c->live_next_->live_prev_ = c->live_prev_;
    c->live_prev_ = c->live_next_ = nullptr;
    last = live_count.fetch_sub(1, std::memory_order_seq_cst) == 1;
    if (last) draining.store(false, std::memory_order_relaxed);
  }
  // (seq_cst with await_all_actors_done's: it sees the 0, or this sees it waiting.)
  if (last && (shutting_down.load(std::memory_order_acquire) || idle_waiters.load(std::memory_order_seq_cst) != 0))
    futex_wake_all(live_count);
}

void system_impl::dead_letter(const cell_base& target, const char* kind, errc why) noexcept {
  dead_letter(target.id(), target.type_name(), kind, why);
}

void system_impl::dead_letter(actor_id target, const char* type, const char* kind, errc why) noexcept {
  auto n = dead_letters.fetch_add(1, std::memory_order_relaxed) + 1;
  // Log the first few and then every 10,000th, so a storm cannot flood the log.
  if (n <= 10 || n % 10'000 == 0) {
    log().warn("dead letter #{}: {} to actor {} ({}) not handled: {}", n, kind, target, type,
               make_error_code(why).message());
  }
}

void system_impl::forget_names_of(cell_base* c) noexcept {
  std::lock_guard lock(names_mutex);
  std::erase_if(names, [c](const auto& kv) { return kv.second.get() == c; });
}

void system_impl::stop_all(bool drain) noexcept {
  // Each removes itself from the list when its stop has run.
  std::vector<cell_ptr> live;
  {
    std::lock_guard lock(live_lock);
    if (drain && live_head) draining.store(true, std::memory_order_relaxed);
    for (auto* c = live_head; c; c = c->live_next_) live.emplace_back(c);
  }
  for (auto& c : live) c->stop(exit_reason::shutdown);
}

void system_impl::shutdown() noexcept {
  if (tls_on_worker()) {
    log().critical("actor_system::shutdown() (or its destructor) called on a worker thread: "
                   "a worker cannot join itself");
    std::abort();
  }
  std::lock_guard guard(shutdown_mutex_);
  if (shut_down_) return;
  // Leave the cluster first: no call from another node arrives while the actors stop.
  if (node) stop_node(*node);
  shutting_down.store(true);
  stop_all(false);
  if (manual) {
    manual->run_until_idle();
  } else {
    for (std::uint32_t n; (n = live_count.load(std::memory_order_acquire)) != 0;)
      futex_wait(live_count, n);
    // The last ones may still be telling their watchers (a few instructions' worth).
    while (leaving.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }
  if (timers_) timers_->stop();
  if (manual) manual->stop();
  sched_->stop();
  {
    std::lock_guard lock(names_mutex);
    names.clear();
  }
  shut_down_ = true;
}

// ---- manual_runtime (test_system) -------------------------------------------------------

bool manual_runtime::run_one() noexcept {
  if (queue_.empty()) return false;
  cell_base* c = queue_.front();
  queue_.pop_front();
  c->run_slice(throughput);
  return true;
}

std::size_t manual_runtime::run_until_idle() noexcept {
  std::size_t n = 0;
  for (;;) {
    while (run_one()) ++n;
    // Timers due now (zero delays, timeouts already reached) fire before "idle".
    if (!fire_next(now_)) break;
  }
  return n;
}

void manual_runtime::stop() noexcept {
  stopped_ = true;
  timers_.clear();
  while (run_one()) {
  }
}

namespace {
/// t + d on the virtual clock, no later than its end (a delay too long for it: never).
std::chrono::nanoseconds later(std::chrono::nanoseconds t, std::chrono::nanoseconds d) noexcept {
  return d >= std::chrono::nanoseconds::max() - t ? std::chrono::nanoseconds::max() : t + d;
}
}  // namespace

void manual_runtime::add(std::chrono::nanoseconds delay, std::chrono::nanoseconds period,
                         std::function<bool()> fire, std::shared_ptr<std::atomic<bool>> cancelled) {
  if (stopped_) return;
  timers_.emplace(std::make_pair(later(now_, delay), seq_++),
                  entry{period, std::move(fire), std::move(cancelled)});
}

bool manual_runtime::fire_next(std::chrono::nanoseconds limit) {
  while (!timers_.empty()) {
    auto it = timers_.begin();
    if (it->first.first > limit) return false;
    auto when = it->first.first;
    entry e = std::move(it->second);
    timers_.erase(it);
    if (e.cancelled && e.cancelled->load()) continue;
    now_ = std::max(now_, when);
    firing_ = true;
    bool again = false;
    try {
      again = e.fire();
    } catch (...) {
      firing_ = false;
      throw;
    }
    firing_ = false;
    if (again && e.period.count() > 0)
      timers_.emplace(std::make_pair(later(when, e.period), seq_++), std::move(e));
    return true;
  }
  return false;
}

void manual_runtime::advance(std::chrono::nanoseconds d) {
  auto target = later(now_, d);
  run_until_idle();
  while (fire_next(target)) run_until_idle();
  now_ = target;
  run_until_idle();
}

// ---- the functions actor_system's templates call ---------------------------------------

system_impl* make_system(actor_system* facade, const system_config& cfg, bool manual) {
  auto* s = std::make_unique<system_impl>(facade, cfg, manual).release();
  if (!cfg.node.listen.empty()) {
    if (manual) {
      destroy_system(s);
      throw std::invalid_argument("a test_system cannot be a node of a cluster");
    }
    try {
      s->node = start_node(*s, cfg.node);
    } catch (...) {
      destroy_system(s);
      throw;
    }
  }
  return s;
}

void destroy_system(system_impl* s) noexcept {
  s->shutdown();
  s->facade = nullptr;
  s->release();
}

actor_id next_actor_id(system_impl& sys) { return sys.next_id(); }

void activate(system_impl& sys, cell_base* c, bool has_on_start) {
  sys.add_live(c);
  c->add_ref();  // the system's reference while the actor is alive
  if (has_on_start) c->enqueue_urgent(make_start_message());
}

bool register_name(system_impl& s, std::string name, cell_base* c) {
  if (!c) throw std::invalid_argument("register_name: the actor_ref is empty");
  if (name.empty()) throw std::invalid_argument("register_name: a name must not be empty");
  if (!c->alive()) throw error(errc::actor_dead, "register_name: actor is dead");
  {
    std::lock_guard lock(s.names_mutex);
    auto [it, inserted] = s.names.try_emplace(name, c);
    if (!inserted) {
      if (it->second.get() == c) return false;
      if (it->second->alive())
        throw error(errc::name_taken, "the name '" + name + "' belongs to actor " +
                                          std::to_string(it->second->id()));
      it->second = cell_ptr(c);
    }
  }
  mark_named(*c);
  // The actor may have died meanwhile and already forgotten its names.
  if (!c->alive()) s.forget_names_of(c);
  return true;
}

bool unregister_name(system_impl& s, std::string_view name) {
  cell_ptr had;
  {
    std::lock_guard lock(s.names_mutex);
    auto it = s.names.find(std::string(name));
    if (it != s.names.end()) {
      had = std::move(it->second);
      s.names.erase(it);
    }
  }
  if (s.node) forget_cluster_name(*s.node, name, had.get());
  return had.get() != nullptr;
}

cell_ptr lookup_name(system_impl& s, std::string_view name) {
  std::lock_guard lock(s.names_mutex);
  auto it = s.names.find(std::string(name));
  if (it == s.names.end() || !it->second->alive()) return {};
  return it->second;
}

timer add_timer(system_impl& s, std::chrono::nanoseconds delay, std::chrono::nanoseconds period,
                std::function<bool()> fire) {
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  if (s.manual) s.manual->add(delay, period, std::move(fire), cancelled);
  else s.timers().add(delay, period, std::move(fire), cancelled);
  return timer(cancelled);
}

actor_stats stats_of(cell_base& c) {
  const cell_extras* ex = system_access::extras_if_any(c);
  return actor_stats{c.id(), c.type_name(), c.messages_handled(), c.mailbox_depth(),
                     std::chrono::nanoseconds(c.busy_ns()),
                     ex ? static_cast<std::uint32_t>(ex->restarts.load(std::memory_order_relaxed)) : 0u};
}

std::vector<actor_stats> all_stats(system_impl& s) {
  std::vector<actor_stats> out;
  std::lock_guard lock(s.live_lock);
  out.reserve(s.live_count.load());
  for (auto* c = s.live_head; c; c = c->live_next_) out.push_back(stats_of(*c));
  return out;
}

std::uint64_t dead_letters(system_impl& s) { return s.dead_letters.load(); }

std::size_t live_actors(system_impl& s) { return s.live_count.load(std::memory_order_acquire); }

void shutdown(system_impl& s) noexcept { s.shutdown(); }

void stop_all_actors(system_impl& s) noexcept { s.stop_all(true); }

bool await_all_actors_done(system_impl& s, std::optional<std::chrono::nanoseconds> timeout) {
  if (tls_on_worker())
    throw std::logic_error("await_all_actors_done() on a thread of the actor system: it would wait for itself");
  if (s.manual) {
    s.manual->run_until_idle();
    const auto left = s.live_count.load(std::memory_order_acquire);
    if (left != 0 && !timeout)
      throw std::logic_error("await_all_actors_done(): " + std::to_string(left) +
                             " actor(s) still live with nothing left to run (a test_system runs only when told)");
    return left == 0;
  }
  const auto deadline = deadline_after(timeout.value_or(std::chrono::nanoseconds::max()));
  if (deadline == std::chrono::steady_clock::time_point::max()) timeout.reset();  // no limit
  s.idle_waiters.fetch_add(1, std::memory_order_seq_cst);
  bool done = false;
  for (std::uint32_t n;;) {
    if ((n = s.live_count.load(std::memory_order_seq_cst)) == 0) {
      done = true;
      break;
    }
    if (!timeout) {
      futex_wait(s.live_count, n);
      continue;
    }
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) break;
    futex_wait_for(s.live_count, n, left.count());
  }
  s.idle_waiters.fetch_sub(1, std::memory_order_relaxed);
  return done;
}

actor_system& facade_of(system_impl& s) {
  if (!s.facade) throw error(errc::system_shutdown, "the actor system is gone");
  return *s.facade;
}

bool manual_run_one(system_impl& s) { return s.manual->run_one(); }
std::size_t manual_run_until_idle(system_impl& s) { return s.manual->run_until_idle(); }
void manual_advance(system_impl& s, std::chrono::nanoseconds d) { s.manual->advance(d); }
std::chrono::nanoseconds manual_now(system_impl& s) { return s.manual->now(); }

void bind_child(cell_base& parent, cell_base& child) { parent.adopt_child(child); }

cell_base& current_cell_or_throw(const char* what) {
  auto* c = tls_current_cell();
  if (!c) throw std::logic_error(std::string(what) + " called outside an actor");
  return *c;
}

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> p(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                &std::free);
  return status == 0 && p ? std::string(p.get()) : std::string(mangled);
}

}  // namespace troupe::detail

namespace troupe {

future<down_notice> actor_system::monitor_cell(detail::cell_base& target) {
  struct sink final : detail::down_callback {
    explicit sink(detail::state<down_notice>* s) : st(s) {}
    ~sink() override {
      // Never notified (the system went away first): the future must not hang.
      if (st) st->fail(std::make_exception_ptr(error(errc::system_shutdown)), true);
    }
    void notify(const down_notice& n) noexcept override {
      st->complete_value(true, n);
      st.reset();
    }
    // The future was dropped, and no then() consumed it (which gives its reference up).
    bool abandoned() const noexcept override { return !st || (st->sole_owner() && !st->has_continuation()); }
    detail::state_ptr<down_notice> st;
  };
  auto st = detail::make_state<down_notice>();
  st->set_system(&target.system());
  st->add_ref();
  future<down_notice> f{detail::state_ptr<down_notice>(st)};
  target.on_down(std::make_unique<sink>(st));
  return f;
}

}  // namespace troupe
