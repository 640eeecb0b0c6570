#include "job_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

namespace troupe::kernels::jobs {
namespace {

/// One run(): its jobs, and the pool threads that helped with them.
struct batch {
  void (*fn)(void*, std::size_t, int);
  void* ctx;
  std::size_t count;
  std::atomic<std::size_t> next{0};
  int wanted;        // helpers it can use
  int joined = 0;    // helpers that took a worker index (under the pool's mutex)
  int finished = 0;  // helpers done with it (under the pool's mutex)
  std::mutex failure_mutex;
  std::exception_ptr failure;

  void work(int worker) noexcept {
    for (std::size_t j; (j = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
      try {
        fn(ctx, j, worker);
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  }
};

class pool {
public:
  void run(batch& b) {
    {
      std::lock_guard lock(mutex_);
      grow(static_cast<std::size_t>(b.wanted));
      try {
        open_.push_back(&b);
      } catch (const std::bad_alloc&) {
        // No room to queue it: no helper joins, the caller runs every job.
      }
    }
    work_.notify_all();
    b.work(0);
    std::unique_lock lock(mutex_);
    // No helper joins from here on; wait for the ones that did.
    if (auto it = std::find(open_.begin(), open_.end(), &b); it != open_.end()) open_.erase(it);
    done_.wait(lock, [&] { return b.finished == b.joined; });
  }

private:
  // Threads up to n (under the mutex). One that cannot be made leaves the jobs to the others.
  void grow(std::size_t n) noexcept {
    while (threads_ < n) {
      try {
        std::thread([this] { serve(); }).detach();
      } catch (const std::system_error&) {
        return;
      } catch (const std::bad_alloc&) {
        return;
      }
      ++threads_;
    }
  }

  [[noreturn]] void serve() noexcept {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return !open_.empty(); });
      batch* b = open_.front();
      const int worker = ++b->joined;
      if (b->joined == b->wanted) open_.pop_front();
      lock.unlock();
      b->work(worker);
      lock.lock();
      if (++b->finished == b->joined) done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<batch*> open_;  // batches that still take helpers, oldest first
  std::size_t threads_ = 0;
};

// Never destroyed: its threads wait for work until the process ends (joining them at exit
// could not be done safely from a static destructor).
pool& the_pool() {
  static pool* p = new pool;
  return *p;
}

}  // namespace

void run(std::size_t count, int threads, void (*fn)(void*, std::size_t, int), void* ctx) {
  batch b;
  b.fn = fn;
  b.ctx = ctx;
  b.count = count;
  b.wanted = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), count)) - 1;
  pool* p = nullptr;
  if (b.wanted > 0) {
    try {
      p = &the_pool();
    } catch (const std::bad_alloc&) {
      // No pool to be had: this thread runs every job.
    }
  }
  if (p != nullptr) p->run(b);
  else b.work(0);
  if (b.failure) std::rethrow_exception(b.failure);
}

}  // namespace troupe::kernels::jobs
