// The ring all-reduce in one process: its result against the plain sum, the elements each
// member sends, bounded messages, and the failures that must end a call on every member.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collective_support.hpp"
#include "troupe/actors/collective.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::reduce_op;
using troupe::ring_member;

using vec = std::vector<float>;

using troupe::collective_support::random_integers;

std::vector<vec> random_floats(std::size_t p, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<vec> x(p, vec(n));
  for (auto& v : x)
    for (auto& e : v) e = d(rng);
  return x;
}

std::vector<vec> run_allreduce(const std::vector<troupe::actor_ref<ring_member>>& ring, const std::vector<vec>& x,
                               reduce_op op = reduce_op::sum) {
  std::vector<troupe::future<vec>> f;
  for (std::size_t i = 0; i < ring.size(); ++i) f.push_back(ring[i].ask(&ring_member::allreduce, x[i], op));
  std::vector<vec> out;
  for (auto& r : f) out.push_back(r.get());
  return out;
}

bool same_bits(const vec& a, const vec& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(RingAllreduce, EqualsThePlainSumExactlyForIntegersStoredInFloats) {
  for (std::size_t p : {1u, 2u, 3u, 4u, 5u, 7u})
    for (std::size_t n : {0u, 1u, 6u, 100u, 1031u}) {
      troupe::test_system sys;
      auto ring = troupe::spawn_ring(sys, p, {.segment_elements = 16});
      auto x = random_integers(p, n, static_cast<std::uint32_t>(p * 1000 + n));
      vec plain(n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) {
        double s = 0;
        for (auto& v : x) s += v[i];
        plain[i] = static_cast<float>(s);
      }
      auto out = run_allreduce(ring, x);
      for (std::size_t r = 0; r < p; ++r) EXPECT_EQ(out[r], plain) << "p=" << p << " n=" << n << " member " << r;
    }
}

TEST(RingAllreduce, MatchesTheRingOrderReferenceBitForBitOnFloatsOnEveryMember) {
  troupe::test_system sys;
  const std::size_t p = 5, n = 2003;
  auto ring = troupe::spawn_ring(sys, p, {.segment_elements = 37});
  auto x = random_floats(p, n, 7);
  auto ref = troupe::ring_sum_reference(x);
  auto out = run_allreduce(ring, x);
  for (std::size_t r = 0; r < p; ++r) EXPECT_TRUE(same_bits(out[r], ref)) << "member " << r;
  // The order matters: the reference differs from a left-to-right sum somewhere, so the
  // comparison above is of the ring's order, not of any order.
  vec left(n, 0.0f);
  for (auto& v : x)
    for (std::size_t i = 0; i < n; ++i) left[i] += v[i];
  EXPECT_FALSE(same_bits(left, ref));
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(out[0][i], left[i], 1e-4f * (1.0f + std::fabs(left[i])));
}

TEST(RingAllreduce, EachMemberSendsTwoTimesPMinusOneOverPTimesNElementsInBoundedMessages) {
  troupe::test_system sys;
  const std::size_t p = 4, n = 4096, segment = 100;
  auto ring = troupe::spawn_ring(sys, p, {.segment_elements = segment});
  run_allreduce(ring, random_floats(p, n, 3));
  for (std::size_t r = 0; r < p; ++r) {
    auto c = ring[r].ask(&ring_member::counters).get();
    EXPECT_EQ(c.elements_sent, 2 * (p - 1) * n / p) << "member " << r;  // 6144
    EXPECT_EQ(c.elements_sent, troupe::ring_elements_sent(n, p, r));
    EXPECT_LE(c.largest_message, segment);
    EXPECT_EQ(c.messages_sent, 2 * (p - 1) * ((n / p + segment - 1) / segment));
    EXPECT_EQ(c.calls, 1u);
  }
  // A length p does not divide: member r sends every chunk once and p−2 of them twice.
  troupe::test_system sys2;
  const std::size_t m = 1001;
  auto ring2 = troupe::spawn_ring(sys2, p, {.segment_elements = segment});
  run_allreduce(ring2, random_floats(p, m, 4));
  std::uint64_t total = 0;
  for (std::size_t r = 0; r < p; ++r) {
    auto sent = ring2[r].ask(&ring_member::counters).get().elements_sent;
    EXPECT_EQ(sent, troupe::ring_elements_sent(m, p, r));
    EXPECT_GE(sent, m + (p - 2) * (m / p));
    EXPECT_LE(sent, m + (p - 2) * (m / p + 1));
    total += sent;
  }
  EXPECT_EQ(total, 2 * (p - 1) * m);
}

TEST(RingAllreduce, MeanIsTheSumDividedByTheMembers) {
  troupe::test_system sys;
  const std::size_t p = 3;
  auto ring = troupe::spawn_ring(sys, p, {.segment_elements = 8});
  auto x = random_integers(p, 50, 11);
  auto ref = troupe::ring_sum_reference(x);
  auto out = run_allreduce(ring, x, reduce_op::mean);
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(out[1][i], ref[i] / 3.0f);
}

TEST(RingAllreduce, RepeatedCallsKeepSegmentsThatArriveBeforeTheirCall) {
  troupe::test_system sys;
  const std::size_t p = 3, n = 90;
  auto ring = troupe::spawn_ring(sys, p, {.segment_elements = 7});
  for (int call = 0; call < 3; ++call) {
    auto x = random_integers(p, n, 100 + call);
    // Member 0 starts first and runs alone: its segments wait at member 1 for its call.
    auto f0 = ring[0].ask(&ring_member::allreduce, x[0], reduce_op::sum);
    sys.run_until_idle();
    auto f1 = ring[1].ask(&ring_member::allreduce, x[1], reduce_op::sum);
    auto f2 = ring[2].ask(&ring_member::allreduce, x[2], reduce_op::sum);
    auto ref = troupe::ring_sum_reference(x);
    EXPECT_TRUE(same_bits(f0.get(), ref));
    EXPECT_TRUE(same_bits(f1.get(), ref));
    EXPECT_TRUE(same_bits(f2.get(), ref));
  }
  EXPECT_EQ(ring[2].ask(&ring_member::counters).get().calls, 3u);
}

TEST(RingAllreduce, AStoppedMemberFailsTheCallOnEveryOtherMemberAndTheRingStaysBroken) {
  troupe::test_system sys;
  const std::size_t p = 4;
  auto ring = troupe::spawn_ring(sys, p, {.segment_elements = 4});
  auto x = random_integers(p, 400, 5);
  // Members 0, 1 and 2 call; member 3 has not yet, so the call is under way (segments have
  // gone round as far as they can) when member 2 stops.
  std::vector<troupe::future<vec>> f;
  for (std::size_t i = 0; i < 3; ++i) f.push_back(ring[i].ask(&ring_member::allreduce, x[i], reduce_op::sum));
  sys.run_until_idle();
  ASSERT_GT(ring[1].ask(&ring_member::counters).get().messages_sent, 0u);
  ASSERT_FALSE(f[0].ready());
  ring[2].stop();
  for (std::size_t i = 0; i < 3; ++i) {
    try {
      f[i].get();
      ADD_FAILURE() << "member " << i << " completed an all-reduce whose member 2 stopped";
    } catch (const troupe::error& e) {
      if (i == 2) {
        EXPECT_EQ(e.code_value(), troupe::errc::actor_dead);
        continue;
      }
      EXPECT_EQ(e.code_value(), troupe::errc::broken_promise);
      EXPECT_NE(std::string(e.what()).find("member 2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("stopped"), std::string::npos) << e.what();
    }
  }
  for (std::size_t i : {0u, 3u}) {
    try {
      (void)ring[i].ask(&ring_member::allreduce, x[i], reduce_op::sum).get();
      ADD_FAILURE() << "a broken ring ran another call on member " << i;
    } catch (const troupe::error& e) {
      EXPECT_NE(std::string(e.what()).find("the ring is broken"), std::string::npos) << e.what();
    }
  }
}

TEST(RingAllreduce, AMemberThatNeverCallsFailsTheOthersAtTheTimeout) {
  troupe::test_system sys;
  auto ring = troupe::spawn_ring(sys, 3, {.segment_elements = 8, .timeout = 100ms});
  auto x = random_integers(3, 30, 9);
  auto f0 = ring[0].ask(&ring_member::allreduce, x[0], reduce_op::sum);
  auto f1 = ring[1].ask(&ring_member::allreduce, x[1], reduce_op::sum);
  sys.run_until_idle();
  EXPECT_FALSE(f0.ready());
  sys.advance(150ms);
  for (auto* f : {&f0, &f1}) {
    try {
      f->get();
      ADD_FAILURE() << "the call completed without member 2";
    } catch (const troupe::error& e) {
      EXPECT_NE(std::string(e.what()).find("took longer than 100 ms"), std::string::npos) << e.what();
    }
  }
}

// A ring of two whose member 1 never calls: the views member 0 sends it wait among its early
// segments for good, as they would in the queue of a connection whose peer stops reading. The
// test plays member 1's part towards member 0, telling it the segments member 1 would send, so
// that member 0 has every segment of its call while its own views are still out.
struct held_views_ring {
  static constexpr std::size_t n = 40, segment = 8;
  troupe::test_system sys;
  std::vector<troupe::actor_ref<ring_member>> ring;
  explicit held_views_ring(std::chrono::milliseconds timeout)
      : ring(troupe::spawn_ring(sys, 2, {.segment_elements = segment, .timeout = timeout})) {}

  // Starts call `call` on member 0 and tells it all of member 1's segments; the sum it must get.
  vec play(std::uint64_t call, troupe::future<vec>& result) {
    auto x = random_integers(2, n, static_cast<std::uint32_t>(30 + call));
    vec sum(n);
    for (std::size_t i = 0; i < n; ++i) sum[i] = x[0][i] + x[1][i];  // exact: small integers
    result = ring[0].ask(&ring_member::allreduce, x[0], reduce_op::sum);
    sys.run_until_idle();
    auto tell = [&](std::uint32_t step, std::size_t b, std::size_t e, const vec& v) {
      for (std::uint32_t j = 0; b + j * segment < e; ++j) {
        const auto from = b + j * segment, to = std::min(e, from + segment);
        ring[0].tell(&ring_member::receive, call, step, j, std::uint64_t{n},
                     troupe::shared_span<float>::copy_of(std::span<const float>(v).subspan(from, to - from)));
      }
    };
    tell(0, n / 2, n, x[1]);  // step 0: member 1's own values of chunk 1
    tell(1, 0, n / 2, sum);   // step 1: the final sums of chunk 0
    sys.run_until_idle();
    // Member 0 sent all of its segments (3 per step), and they wait at member 1.
    EXPECT_EQ(ring[0].ask(&ring_member::counters).get().messages_sent, 6 * call);
    return sum;
  }
};

TEST(RingAllreduce, ACallWhoseViewsAreNeverReleasedCompletesAtTheTimeoutWithItsResult) {
  held_views_ring r(100ms);
  for (std::uint64_t call = 1; call <= 2; ++call) {
    troupe::future<vec> f;
    auto sum = r.play(call, f);
    // The vector is not handed back while member 1 holds views of it ...
    EXPECT_FALSE(f.ready()) << "call " << call;
    // ... but the timer completes the call with a copy, and the next call is accepted.
    r.sys.advance(150ms);
    ASSERT_TRUE(f.ready()) << "call " << call << " still waits for views its successor never releases";
    EXPECT_EQ(f.get(), sum) << "call " << call;
  }
  EXPECT_EQ(r.ring[0].ask(&ring_member::counters).get().calls, 2u);
  // The views go at last (member 1 stops): their vectors come back to calls completed already.
  r.ring[1].stop();
  r.sys.run_until_idle();
  EXPECT_EQ(r.ring[0].ask(&ring_member::counters).get().calls, 2u);
}

TEST(RingAllreduce, ACallWithEverySegmentInCompletesWhenTheRingBreaksThoughViewsAreOut) {
  held_views_ring r(0ms);  // no timer: only the break ends the wait
  troupe::future<vec> f;
  auto sum = r.play(1, f);
  r.sys.advance(10s);
  EXPECT_FALSE(f.ready());
  r.ring[0].tell(&ring_member::abort, std::uint32_t{1}, std::string("member 1 gave up"));
  r.sys.run_until_idle();
  ASSERT_TRUE(f.ready()) << "a call with its result waits for views a broken ring may never release";
  EXPECT_EQ(f.get(), sum);
  try {
    (void)r.ring[0].ask(&ring_member::allreduce, vec(held_views_ring::n), reduce_op::sum).get();
    ADD_FAILURE() << "a broken ring ran another call";
  } catch (const troupe::error& e) {
    EXPECT_NE(std::string(e.what()).find("the ring is broken"), std::string::npos) << e.what();
  }
}

TEST(RingAllreduce, VectorsOfDifferentLengthsFailOnEveryMember) {
  troupe::test_system sys;
  auto ring = troupe::spawn_ring(sys, 3, {.segment_elements = 8});
  std::vector<vec> x{vec(30, 1.0f), vec(31, 1.0f), vec(30, 1.0f)};
  std::vector<troupe::future<vec>> f;
  for (std::size_t i = 0; i < 3; ++i) f.push_back(ring[i].ask(&ring_member::allreduce, x[i], reduce_op::sum));
  for (auto& r : f) {
    try {
      r.get();
      ADD_FAILURE() << "vectors of 30 and 31 floats were reduced";
    } catch (const troupe::error& e) {
      EXPECT_NE(std::string(e.what()).find("same length"), std::string::npos) << e.what();
    }
  }
}

TEST(RingAllreduce, RefusesBadGroupsAndMembersThatAreNotReentrant) {
  troupe::test_system sys;
  EXPECT_THROW(troupe::spawn_ring(sys, 0), std::invalid_argument);
  EXPECT_THROW(troupe::spawn_ring(sys, 2, {.segment_elements = 0}), std::invalid_argument);
  EXPECT_THROW(troupe::form_ring({}), std::invalid_argument);
  auto plain = sys.spawn<ring_member>();
  troupe::form_ring({plain});
  EXPECT_THROW((void)plain.ask(&ring_member::allreduce, vec{1.0f}, reduce_op::sum).get(), std::logic_error);
  auto lone = sys.spawn<ring_member>(troupe::ring_member_options());
  EXPECT_THROW((void)lone.ask(&ring_member::allreduce, vec{1.0f}, reduce_op::sum).get(), std::logic_error);
  troupe::form_ring({lone});
  EXPECT_THROW(troupe::form_ring({lone}), std::invalid_argument);  // joined already
}

TEST(RingAllreduce, StreamsAMillionFloatsOnTheThreadPool) {
  troupe::actor_system sys{{.threads = 2}};
  const std::size_t p = 4, n = 1 << 20;
  auto ring = troupe::spawn_ring(sys, p, {.segment_elements = 1 << 14});
  auto x = random_floats(p, n, 21);
  auto ref = troupe::ring_sum_reference(x);
  auto out = run_allreduce(ring, x);
  for (std::size_t r = 0; r < p; ++r) EXPECT_TRUE(same_bits(out[r], ref)) << "member " << r;
}

}  // namespace
