#include "troupe/core/trace.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/core/log.hpp"

namespace troupe::trace {
namespace detail {
std::atomic<bool> enabled_flag{false};
}

namespace {

struct event {
  const char* name;
  const char* category;
  std::int64_t begin_ns;
  std::int64_t dur_ns;
  std::uint64_t id;
};

struct thread_buffer {
  int tid;
  std::mutex mutex;  // uncontended: only flush() takes it from another thread
  std::vector<event> events;
};

struct recorder {
  std::string path;
  bool exit_hook = false;
  std::mutex mutex;
  std::vector<std::shared_ptr<thread_buffer>> buffers;

  recorder() {
    if (const char* env = std::getenv("TROUPE_TRACE"); env && *env) enable(env);
  }

  void enable(const std::string& p) {
    std::lock_guard lock(mutex);
    if (!exit_hook) {
      exit_hook = true;
      std::atexit([] { flush(); });
    }
    path = p;
    detail::enabled_flag.store(true, std::memory_order_relaxed);
  }

  std::shared_ptr<thread_buffer> add_thread() {
    std::lock_guard lock(mutex);
    auto b = std::make_shared<thread_buffer>();
    b->tid = static_cast<int>(buffers.size()) + 1;
    buffers.push_back(b);
    return b;
  }
};

/// `s` as a JSON string (a type's name may hold quotes or backslashes).
void put_json_string(std::FILE* f, const char* s) {
  std::fputc('"', f);
  for (; *s; ++s) {
    const auto c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') std::fprintf(f, "\\%c", c);
    else if (c < 0x20) std::fprintf(f, "\\u%04x", c);
    else std::fputc(c, f);
  }
  std::fputc('"', f);
}

recorder& the_recorder() {
  // Never destroyed: the exit hook that flushes is registered while it is being constructed
  // (TROUPE_TRACE), so it would run after a static recorder's destructor.
  static recorder& r = *new recorder;
  return r;
}

// Reads TROUPE_TRACE before main() so that enabled() is right from the start.
[[maybe_unused]] const bool initialized = (the_recorder(), true);

thread_buffer& local_buffer() {
  thread_local std::shared_ptr<thread_buffer> buffer = the_recorder().add_thread();
  return *buffer;
}

}  // namespace

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(const char* name, const char* category, std::int64_t begin_ns, std::int64_t dur_ns,
            std::uint64_t id) noexcept {
  if (!enabled()) return;
  try {
    auto& b = local_buffer();
    std::lock_guard lock(b.mutex);
    b.events.push_back({name, category, begin_ns, dur_ns, id});
  } catch (...) {
    // Out of memory while tracing: drop the event rather than disturb the program.
  }
}

void start(const std::string& path) { the_recorder().enable(path); }

void stop() {
  flush();
  auto& r = the_recorder();
  std::lock_guard lock(r.mutex);
  detail::enabled_flag.store(false, std::memory_order_relaxed);
  r.path.clear();
  for (auto& b : r.buffers) {
    std::lock_guard block(b->mutex);
    b->events.clear();
  }
}

void flush() {
  auto& r = the_recorder();
  if (r.path.empty()) return;
  std::lock_guard lock(r.mutex);
  std::FILE* f = std::fopen(r.path.c_str(), "w");
  if (!f) {
    log().error("TROUPE_TRACE: cannot write '{}'", r.path);
    return;
  }
  std::fputs("{\"traceEvents\":[\n", f);
  bool first = true;
  for (auto& b : r.buffers) {
    std::lock_guard block(b->mutex);
    for (const auto& e : b->events) {
      std::fputs(first ? "{\"name\":" : ",\n{\"name\":", f);
      put_json_string(f, e.name);
      std::fputs(",\"cat\":", f);
      put_json_string(f, e.category);
      std::fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d,\"args\":{\"id\":%llu}}",
                   e.begin_ns / 1000.0, e.dur_ns / 1000.0, b->tid, static_cast<unsigned long long>(e.id));
      first = false;
    }
  }
  std::fputs("\n],\"displayTimeUnit\":\"ns\"}\n", f);
  std::fclose(f);
}

}  // namespace troupe::trace
