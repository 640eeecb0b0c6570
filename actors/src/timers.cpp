// Timers: a dedicated thread for actor_system (started on first use), a virtual clock for
// test_system (manual_runtime, in system.cpp).

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "sync.hpp"
#include "system.hpp"
#include "troupe/core/log.hpp"

namespace troupe::detail {
namespace {

class timer_thread final : public timer_service {
public:
  ~timer_thread() override { stop(); }

  void add(std::chrono::nanoseconds delay, std::chrono::nanoseconds period,
           std::function<bool()> fire, std::shared_ptr<std::atomic<bool>> cancelled) override {
    std::unique_lock lock(mutex_);
    if (stopped_) return;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    const auto when = deadline_after(delay);  // a delay too long for the clock: never
    bool earliest = entries_.empty() || when < entries_.begin()->first.first;
    entries_.emplace(std::make_pair(when, seq_++),
                     entry{period, std::move(fire), std::move(cancelled)});
    if (earliest) cv_.notify_one();
  }

  void stop() noexcept override {
    {
      std::lock_guard lock(mutex_);
      if (stopped_) return;
      stopped_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
    entries_.clear();
  }

private:
  using clock = std::chrono::steady_clock;
  struct entry {
    std::chrono::nanoseconds period;
    std::function<bool()> fire;
    std::shared_ptr<std::atomic<bool>> cancelled;
  };

  void run() {
    // A callback must not block this thread (every timer and timeout would wait): a tell to a
    // full mailbox gets in past its capacity, a get() is refused.
    tls_on_worker() = true;
    std::unique_lock lock(mutex_);
    while (!stopped_) {
      if (entries_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto it = entries_.begin();
      auto when = it->first.first;
      if (when == clock::time_point::max()) {  // only timers that never fire are left
        cv_.wait(lock);
        continue;
      }
      if (clock::now() < when) {
        cv_.wait_until(lock, when);
        continue;
      }
      entry e = std::move(it->second);
      entries_.erase(it);
      if (e.cancelled && e.cancelled->load(std::memory_order_relaxed)) continue;
      lock.unlock();
      bool again = false;
      try {
        again = e.fire();
      } catch (const std::exception& ex) {
        log().error("a timer callback threw: {}", ex.what());
      }
      lock.lock();
      if (again && e.period.count() > 0 && !stopped_) {
        const auto next = e.period >= clock::time_point::max() - when ? clock::time_point::max() : when + e.period;
        entries_.emplace(std::make_pair(next, seq_++), std::move(e));
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::multimap<std::pair<clock::time_point, std::uint64_t>, entry> entries_;
  std::uint64_t seq_ = 0;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<timer_service> make_timer_thread() { return std::make_unique<timer_thread>(); }

}  // namespace troupe::detail
