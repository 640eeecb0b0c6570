// The threads of the multithreaded CPU steps: every job runs once, worker indexes stay below
// the thread count and are never shared by two jobs at once, errors reach the caller, and
// callers on several threads at once all finish.

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "job_pool.hpp"

namespace {

using troupe::kernels::jobs::run_jobs;

TEST(JobPool, RunsEveryJobOnceWithWorkersBelowTheThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000}}) {
      std::vector<std::atomic<int>> ran(count);
      std::vector<std::atomic<int>> busy(static_cast<std::size_t>(threads));
      std::atomic<bool> shared{false}, out_of_range{false};
      run_jobs(count, threads, [&](std::size_t j, int w) {
        if (w < 0 || w >= threads) {
          out_of_range = true;
          return;
        }
        if (busy[static_cast<std::size_t>(w)].fetch_add(1) != 0) shared = true;
        ran[j].fetch_add(1);
        if (j % 3 == 0) std::this_thread::yield();
        busy[static_cast<std::size_t>(w)].fetch_sub(1);
      });
      for (std::size_t j = 0; j < count; ++j) EXPECT_EQ(ran[j].load(), 1) << "threads " << threads << ", job " << j;
      EXPECT_FALSE(shared) << "a worker index ran two jobs at once";
      EXPECT_FALSE(out_of_range);
    }
  }
}

TEST(JobPool, AJobsErrorReachesTheCallerAndTheOtherJobsStillRun) {
  std::atomic<int> ran{0};
  try {
    run_jobs(100, 4, [&](std::size_t j, int) {
      ran.fetch_add(1);
      if (j == 17) throw std::runtime_error("job 17");
    });
    ADD_FAILURE() << "the error was lost";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "job 17");
  }
  EXPECT_EQ(ran.load(), 100);
  // The pool still works after it.
  std::atomic<int> again{0};
  run_jobs(50, 4, [&](std::size_t, int) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 50);
}

TEST(JobPool, CallersOnSeveralThreadsAtOnceAllFinish) {
  std::vector<std::thread> callers;
  std::vector<std::atomic<long>> sums(6);
  for (std::size_t c = 0; c < sums.size(); ++c)
    callers.emplace_back([&, c] {
      for (int round = 0; round < 50; ++round)
        run_jobs(64, 3, [&](std::size_t j, int) { sums[c].fetch_add(static_cast<long>(j)); });
    });
  for (auto& t : callers) t.join();
  for (auto& s : sums) EXPECT_EQ(s.load(), 50L * (63 * 64 / 2));
}

}  // namespace
