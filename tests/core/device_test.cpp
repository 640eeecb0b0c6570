#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include <troupe/core/device.hpp>

namespace {

TEST(Device, CountsZeroOrMoreCudaDevices) {
  const int n = troupe::cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(troupe::cuda_device_count(), n) << "the count changed between two calls";
}

TEST(Device, CountsNoCudaDeviceWhenBuiltWithoutCuda) {
  if (troupe::built_with_cuda())
    GTEST_SKIP() << "troupe was built with CUDA (TROUPE_WITH_CUDA=ON); only a build without it "
                    "must report 0 devices unconditionally";
  EXPECT_EQ(troupe::cuda_device_count(), 0);
}

TEST(Device, CountsTheSameFromManyThreads) {
  const int expected = troupe::cuda_device_count();
  std::vector<int> seen(8, -1);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < seen.size(); ++i)
    threads.emplace_back([&seen, i] { seen[i] = troupe::cuda_device_count(); });
  for (auto& t : threads) t.join();
  for (int s : seen) EXPECT_EQ(s, expected);
}

TEST(Device, ReportsADeviceOnlyWhenBuiltWithCuda) {
  const int n = troupe::cuda_device_count();
  if (n == 0)
    GTEST_SKIP() << "no usable CUDA device here (built_with_cuda()="
                 << (troupe::built_with_cuda() ? "true" : "false")
                 << "); this check needs one";
  EXPECT_GT(n, 0);
  EXPECT_TRUE(troupe::built_with_cuda()) << n << " devices reported by a build without CUDA";
}

TEST(Device, CountsNoDeviceWhenCudaVisibleDevicesIsEmpty) {
  // The child of the death test below re-executes this binary and runs this test again; it
  // must not touch CUDA before it has hidden the devices, so it skips the device check.
  constexpr const char* child_marker = "TROUPE_DEVICE_TEST_HIDING_CHILD";
  const bool in_child = std::getenv(child_marker) != nullptr;
  if (!in_child && troupe::cuda_device_count() == 0)
    GTEST_SKIP() << "no usable CUDA device here, so hiding devices cannot change the count";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: CUDA not yet initialized
  setenv(child_marker, "1", 1);
  EXPECT_EXIT(
      {
        setenv("CUDA_VISIBLE_DEVICES", "", 1);
        std::exit(troupe::cuda_device_count() == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  unsetenv(child_marker);
}

}  // namespace
