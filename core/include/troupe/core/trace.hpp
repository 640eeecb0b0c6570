#pragma once
/// @file
/// An opt-in timeline of activity as Chrome trace JSON (open it in Perfetto or chrome://tracing).
/// Set `TROUPE_TRACE=file.json`; the file is written by `trace::flush()` and at process exit.
/// Recording is a branch on one flag when disabled, and a per-thread append when enabled.

#include <atomic>
#include <cstdint>
#include <string>

namespace troupe::trace {

namespace detail {
extern std::atomic<bool> enabled_flag;
}

/// True when `TROUPE_TRACE` names an output file. @threadsafe
inline bool enabled() noexcept { return detail::enabled_flag.load(std::memory_order_relaxed); }

/// Monotonic nanoseconds, the time base of trace events. @threadsafe
std::int64_t now_ns() noexcept;

/// Records a complete event ("ph":"X"). `name` and `category` must have static storage.
/// `id` shows up as the event's `args.id` (an actor id, a microbatch...). @threadsafe
void record(const char* name, const char* category, std::int64_t begin_ns, std::int64_t dur_ns,
            std::uint64_t id) noexcept;

/// Starts recording into `path` (what `TROUPE_TRACE=path` does at startup). @threadsafe
void start(const std::string& path);

/// Writes what was recorded, stops recording and forgets the events. @threadsafe
void stop();

/// Writes every event recorded so far to the trace file (rewriting it). @threadsafe
void flush();

}  // namespace troupe::trace
