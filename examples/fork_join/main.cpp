// fork_join: a parallel sum.
//
// A coordinator actor splits a vector into chunks, asks one worker actor per chunk for its
// sum (fork), awaits all the replies (join) and returns the total. main checks the answer
// against std::accumulate.
//
// Two things make this safe and parallel without a single lock:
//   - each chunk is moved into its message: the worker owns its chunk, nothing is shared;
//   - the coordinator sends every ask before it awaits any reply, so the workers run at
//     the same time (awaiting each reply before sending the next ask would run them one
//     after the other).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>

namespace {

class summer {
public:
  // Takes its chunk by value: the vector moved into the message is moved on into here.
  long long sum(std::vector<long long> chunk) {
    return std::accumulate(chunk.begin(), chunk.end(), 0LL);
  }
};

class coordinator {
public:
  explicit coordinator(std::vector<troupe::actor_ref<summer>> workers)
      : workers_(std::move(workers)) {}

  troupe::task<long long> total(std::vector<long long> data) {
    const std::size_t n = workers_.size();
    const std::size_t per_chunk = (data.size() + n - 1) / n;

    // Fork: one ask per worker, all in flight at once.
    std::vector<troupe::future<long long>> parts;
    std::vector<std::size_t> sizes;
    parts.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t first = std::min(data.size(), i * per_chunk);
      const std::size_t last = std::min(data.size(), first + per_chunk);
      std::vector<long long> chunk(data.begin() + static_cast<std::ptrdiff_t>(first),
                                   data.begin() + static_cast<std::ptrdiff_t>(last));
      sizes.push_back(chunk.size());
      parts.push_back(workers_[i].ask(&summer::sum, std::move(chunk)));
    }

    // Join: each co_await suspends this method (not the thread) until that reply is in.
    // The order of the awaits does not matter: replies that came early are simply ready.
    long long total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      long long part = co_await std::move(parts[i]);
      std::printf("  [coordinator] chunk %zu (%zu numbers): %lld\n", i, sizes[i], part);
      total += part;
    }
    co_return total;
  }

private:
  std::vector<troupe::actor_ref<summer>> workers_;
};

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

int run() {
  troupe::actor_system sys{{.threads = 2}};

  // Actors are cheap and are not threads: four workers on two threads is fine, and so
  // would be four thousand.
  const int worker_count = 4;
  std::vector<troupe::actor_ref<summer>> workers;
  for (int i = 0; i < worker_count; ++i) workers.push_back(sys.spawn<summer>());
  auto coord = sys.spawn<coordinator>(workers);

  // Some numbers, with a fixed seed so every run sums the same thing.
  std::vector<long long> data(2'000'000);
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<long long> dist(-1'000'000, 1'000'000);
  for (auto& x : data) x = dist(rng);
  const long long expected = std::accumulate(data.begin(), data.end(), 0LL);

  std::printf("summing %zu numbers with %d workers\n", data.size(), worker_count);
  auto t0 = std::chrono::steady_clock::now();
  // The whole vector is moved into the coordinator's message: main gives it away.
  long long total = coord.ask(&coordinator::total, std::move(data)).get();
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  std::printf("total from the actors: %lld (%.1f ms)\n", total, ms);
  std::printf("std::accumulate:       %lld\n", expected);
  check(total == expected, "parallel sum equals std::accumulate");

  std::printf("fork_join: all checks passed\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fork_join: FAILED: %s\n", e.what());
    return 1;
  }
}
