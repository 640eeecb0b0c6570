#pragma once
// Small synchronization primitives of the runtime (Linux futex, a spinlock, cpu_relax).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace troupe::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// `timeout` from now; time_point::max() (no limit) when that is past the clock's range.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::nanoseconds timeout) noexcept {
  const auto now = std::chrono::steady_clock::now();
  if (timeout >= std::chrono::steady_clock::time_point::max() - now) return std::chrono::steady_clock::time_point::max();
  return now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
}

/// Sleeps while `*word == expected` (spurious wake-ups possible: callers loop).
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
          nullptr, nullptr, 0);
}
/// As futex_wait, for at most `ns` nanoseconds.
inline void futex_wait_for(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                           std::int64_t ns) noexcept {
  timespec t{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &t,
          nullptr, 0);
}
inline void futex_wake_one(std::atomic<std::uint32_t>& word) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr,
          nullptr, 0);
}
inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 0x7fffffff,
          nullptr, nullptr, 0);
}

/// For short critical sections on rare paths.
class spinlock {
public:
  void lock() noexcept {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) cpu_relax();
    }
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

private:
  std::atomic<bool> flag_{false};
};

/// Locks a std::atomic_flag used as a spinlock.
class flag_guard {
public:
  explicit flag_guard(std::atomic_flag& f) noexcept : f_(f) {
    while (f_.test_and_set(std::memory_order_acquire)) {
      while (f_.test(std::memory_order_relaxed)) cpu_relax();
    }
  }
  ~flag_guard() { f_.clear(std::memory_order_release); }
  flag_guard(const flag_guard&) = delete;
  flag_guard& operator=(const flag_guard&) = delete;

private:
  std::atomic_flag& f_;
};

}  // namespace troupe::detail
