// The ring all-reduce across processes: members on the head and on worker node processes
// (remote_test_node), the result against the plain sum, and a node killed mid-call.

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "remote_support.hpp"
#include "collective_support.hpp"
#include "troupe/actors/collective.hpp"

namespace {

using namespace std::chrono_literals;
using namespace remote_support;
using troupe::reduce_op;
using troupe::ring_member;
using vec = std::vector<float>;

using troupe::collective_support::random_integers;

TEST(RingAllreduceRemote, MembersOnThreeProcessesGetThePlainSumAndSendTheirShare) {
  troupe::actor_system head(head_config());
  child_node w1({"--head", head_of(head), "--token", token});
  child_node w2({"--head", head_of(head), "--token", token});
  const auto n1 = w1.joined(), n2 = w2.joined();
  ASSERT_NE(n1, 0u);
  ASSERT_NE(n2, 0u);
  std::vector<troupe::actor_ref<ring_member>> ring{
      head.spawn<ring_member>(troupe::ring_member_options()),
      head.spawn_on<ring_member>(n1, troupe::ring_member_options()),
      head.spawn<ring_member>(troupe::ring_member_options()),
      head.spawn_on<ring_member>(n2, troupe::ring_member_options())};
  ASSERT_TRUE(ring[1].is_remote() && ring[3].is_remote());
  troupe::form_ring(ring, {.segment_elements = 4096, .timeout = 20s});
  const std::size_t p = 4, n = 100'000;
  auto x = random_integers(p, n, 17);
  vec plain(n);
  for (std::size_t i = 0; i < n; ++i) plain[i] = x[0][i] + x[1][i] + x[2][i] + x[3][i];  // exact: small integers
  for (int call = 0; call < 2; ++call) {
    std::vector<troupe::future<vec>> f;
    for (std::size_t i = 0; i < p; ++i) f.push_back(ring[i].ask(&ring_member::allreduce, x[i], reduce_op::sum));
    for (std::size_t i = 0; i < p; ++i) EXPECT_EQ(f[i].get(), plain) << "member " << i << " call " << call;
  }
  for (std::size_t i = 0; i < p; ++i) {
    auto c = ring[i].ask(&ring_member::counters).get();
    EXPECT_EQ(c.elements_sent, 2 * 2 * (p - 1) * n / p) << "member " << i;  // two calls of 2(p-1)/p·N
    EXPECT_LE(c.largest_message, 4096u);
  }
}

TEST(RingAllreduceRemote, AKilledNodeFailsTheCallOnEveryOtherMemberInsteadOfHanging) {
  troupe::actor_system head(head_config());
  child_node w1({"--head", head_of(head), "--token", token});
  child_node w2({"--head", head_of(head), "--token", token});
  const auto n1 = w1.joined(), n2 = w2.joined();
  ASSERT_NE(n1, 0u);
  ASSERT_NE(n2, 0u);
  std::vector<troupe::actor_ref<ring_member>> ring{
      head.spawn<ring_member>(troupe::ring_member_options()),
      head.spawn_on<ring_member>(n1, troupe::ring_member_options()),
      head.spawn_on<ring_member>(n2, troupe::ring_member_options()),
      head.spawn<ring_member>(troupe::ring_member_options())};
  troupe::form_ring(ring, {.segment_elements = 1000, .timeout = 60s});
  auto x = random_integers(4, 40'000, 3);
  // Members 0, 1 and 2 start; member 3 has not called yet, so the ring cannot finish: the call
  // is under way (segments have flowed from 0 to 1 to 2) when member 1's node dies.
  std::vector<troupe::future<vec>> f;
  for (std::size_t i = 0; i < 3; ++i) f.push_back(ring[i].ask(&ring_member::allreduce, x[i], reduce_op::sum));
  for (auto deadline = clock_type::now() + 5s; clock_type::now() < deadline;) {
    if (ring[2].ask(&ring_member::counters).get().messages_sent > 0) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GT(ring[2].ask(&ring_member::counters).get().messages_sent, 0u);
  const auto t0 = clock_type::now();
  w1.kill9();
  for (std::size_t i : {0u, 2u}) {
    try {
      f[i].get();
      ADD_FAILURE() << "member " << i << " completed a call whose member 1 died";
    } catch (const troupe::error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("ring all-reduce call 1 failed on member " + std::to_string(i)), std::string::npos) << what;
      EXPECT_NE(what.find("member 1"), std::string::npos) << what;
    }
  }
  EXPECT_LT(clock_type::now() - t0, 10s) << "the failure took as long as a timeout";
  EXPECT_THROW(f[1].get(), troupe::error);  // its node is gone
  // The member that had not called yet finds the ring broken at once.
  try {
    (void)ring[3].ask(&ring_member::allreduce, x[3], reduce_op::sum).get();
    ADD_FAILURE() << "a broken ring ran a call";
  } catch (const troupe::error& e) {
    EXPECT_NE(std::string(e.what()).find("the ring is broken"), std::string::npos) << e.what();
  }
}

}  // namespace
