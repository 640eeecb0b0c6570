// The norm proof's fast backend (zk_group_r255.hpp) against its reference, libsodium's calls
// (zk_group_sodium.hpp): the policy's every function on random inputs, the MSM's paths against
// the sum of products, the inner-product prover's delayed folding against the plain one, and the
// whole proof: the same randomness gives the same bytes on both, and each verifies the other's.

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "support.hpp"
#include "troupe/federated/zkproof.hpp"
#include "zk_bulletproofs.hpp"
#include "zk_group_r255.hpp"
#include "zk_group_sodium.hpp"
#include "zk_norm.hpp"
#include "zk_random.hpp"

namespace troupe::federated::zk {
namespace {

using F = r255_group;
using S = sodium_group;

F::scalar to_fast(const S::scalar& s) {
  F::scalar out;
  EXPECT_TRUE(F::decode_scalar(S::encode(s), out));
  return out;
}

F::point to_fast(const S::point& p) {
  F::point out;
  EXPECT_TRUE(F::decode_point(S::encode(p), out));
  return out;
}

/// A point encoded by computation, not by the cache of a decoding.
bytes32 fresh_encoding(const F::point& p) { return F::encode(F::add(p, F::identity())); }

TEST(ZkR255Group, ScalarsAgreeWithLibsodium) {
  for (int round = 0; round < 50; ++round) {
    const S::scalar a = S::random(), b = S::random();
    const F::scalar fa = to_fast(a), fb = to_fast(b);
    EXPECT_EQ(F::encode(F::add(fa, fb)), S::encode(S::add(a, b)));
    EXPECT_EQ(F::encode(F::sub(fa, fb)), S::encode(S::sub(a, b)));
    EXPECT_EQ(F::encode(F::mul(fa, fb)), S::encode(S::mul(a, b)));
    EXPECT_EQ(F::encode(F::neg(fa)), S::encode(S::neg(a)));
    EXPECT_EQ(F::encode(F::invert(fa)), S::encode(S::invert(a)));
    const auto v = static_cast<std::int64_t>(round * 7919) - 200000;
    EXPECT_EQ(F::encode(F::from_i64(v)), S::encode(S::from_i64(v)));
    std::array<std::uint8_t, 64> wide;
    for (int i = 0; i < 64; ++i) wide[i] = static_cast<std::uint8_t>(round * 31 + i * 17);
    EXPECT_EQ(F::encode(F::from_uniform(wide)), S::encode(S::from_uniform(wide)));
  }
  EXPECT_EQ(F::encode(F::from_i64(INT64_MIN)), S::encode(S::from_i64(INT64_MIN)));
  EXPECT_EQ(F::encode(F::one()), S::encode(S::one()));
  EXPECT_TRUE(F::is_zero(F::zero()));
  test_support::expect_error<std::invalid_argument>([] { (void)F::invert(F::zero()); }, "inverse");
  // Canonical scalars only: ℓ - 1 decodes, ℓ does not (as for libsodium).
  auto ell = S::encode(S::neg(S::one()));
  F::scalar out;
  EXPECT_TRUE(F::decode_scalar(ell, out));
  ell[0] += 1;
  EXPECT_FALSE(F::decode_scalar(ell, out));
}

TEST(ZkR255Group, PointsHashesAndEncodingsAgreeWithLibsodium) {
  for (std::uint8_t i = 0; i < 20; ++i) {
    const std::uint8_t message[2] = {i, 7};
    const S::point sp = S::hash_to_point("troupe.test", message);
    const F::point fp = F::hash_to_point("troupe.test", message);
    EXPECT_EQ(fresh_encoding(fp), S::encode(sp));
    const S::scalar s = S::random();
    const F::scalar fs = to_fast(s);
    EXPECT_EQ(fresh_encoding(F::mul(fs, fp)), S::encode(S::mul(s, sp)));
    EXPECT_EQ(fresh_encoding(F::base_mul(fs)), S::encode(S::base_mul(s)));
    const S::point sq = S::hash_to_point("troupe.test.q", message);
    EXPECT_EQ(fresh_encoding(F::add(fp, to_fast(sq))), S::encode(S::add(sp, sq)));
    EXPECT_EQ(fresh_encoding(F::sub(fp, to_fast(sq))), S::encode(S::sub(sp, sq)));
    // Decoding keeps the bytes: encode() returns them.
    EXPECT_EQ(F::encode(to_fast(sp)), S::encode(sp));
  }
  EXPECT_EQ(F::encode(F::identity()), bytes32{});
  // The generators are the same elements on both backends.
  const auto fg = generators<F>::get(4);
  const auto sg = generators<S>::get(4);
  EXPECT_EQ(fresh_encoding(fg.H), S::encode(sg.H));
  EXPECT_EQ(fresh_encoding(fg.B), S::encode(sg.B));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(fresh_encoding((*fg.g)[i]), S::encode((*sg.g)[i]));
    EXPECT_EQ(fresh_encoding((*fg.h)[i]), S::encode((*sg.h)[i]));
  }
  // Only canonical encodings decode, as for libsodium.
  F::point out;
  auto odd = S::encode(sg.H);
  odd[0] |= 1;
  EXPECT_FALSE(F::decode_point(odd, out));
  bytes32 all_ones;
  all_ones.fill(0xff);
  EXPECT_FALSE(F::decode_point(all_ones, out));
  EXPECT_TRUE(F::decode_point(bytes32{}, out));
  EXPECT_EQ(out, F::identity());
  // Bit 255 set: a value above p, never canonical (RFC 9496), though libsodium 1.0.18's own
  // check accepts it; both policies refuse it.
  auto high = S::encode(sg.H);
  high[31] |= 0x80;
  S::point sout;
  EXPECT_FALSE(F::decode_point(high, out));
  EXPECT_FALSE(S::decode_point(high, sout));
}

/// Σ s_i P_i by single products: the definition msm is checked against.
F::point sum_of_products(const std::vector<F::scalar>& s, const std::vector<F::point>& p) {
  F::point acc = F::identity();
  for (std::size_t i = 0; i < s.size(); ++i) acc = F::add(acc, F::mul(s[i], p[i]));
  return acc;
}

TEST(ZkR255Group, MsmColumnsAreTheColumnsSums) {
  const auto gen = generators<F>::get(24);
  const std::vector<F::point> p(gen.g->begin(), gen.g->begin() + 24);
  std::vector<F::scalar> s = {F::random(), F::zero(), F::from_i64(-3), F::random()};
  std::vector<F::point> out(6);
  F::msm_columns(s, p, 6, out);
  for (std::size_t i = 0; i < 6; ++i) {
    F::point want = F::identity();
    for (std::size_t m = 0; m < s.size(); ++m) want = F::add(want, F::mul(s[m], p[i + 6 * m]));
    EXPECT_EQ(out[i], want) << i;
  }
  std::vector<F::point> zeros(3);
  F::msm_columns(std::vector<F::scalar>(2, F::zero()), p, 3, zeros);
  for (const auto& z : zeros) EXPECT_EQ(z, F::identity());
  test_support::expect_error<std::invalid_argument>([&] { F::msm_columns(s, p, 7, out); }, "columns");
}

TEST(ZkR255Group, MsmIsTheSumOfProductsOnEveryPath) {
  const auto gen = generators<F>::get(64);
  auto check = [&](const std::vector<F::scalar>& s, const std::vector<F::point>& p, const char* what) {
    EXPECT_EQ(F::msm(s, p), sum_of_products(s, p)) << what;
    // And libsodium's loop on the same inputs.
    std::vector<S::scalar> ss(s.size());
    std::vector<S::point> sp(p.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      ASSERT_TRUE(S::decode_scalar(F::encode(s[i]), ss[i]));
      ASSERT_TRUE(S::decode_point(F::encode(p[i]), sp[i]));
    }
    EXPECT_EQ(fresh_encoding(F::msm(s, p)), S::encode(S::msm(ss, sp))) << what;
  };
  const F::scalar small = F::from_i64(-12345), big = F::random();
  // B and H alone (their combs), with a short scalar beside them, with a long one (one chain).
  check({big, F::random()}, {gen.B, gen.H}, "B and H");
  check({small, F::random()}, {(*gen.g)[0], gen.H}, "a short scalar and H");
  check({small, F::from_u64(3), F::random()}, {(*gen.g)[0], gen.B, gen.H}, "short, B and H");
  check({big, F::random(), F::random()}, {(*gen.g)[1], gen.B, gen.H}, "long, B and H");
  // B twice (the scalars add), a zero scalar, the identity, ±1.
  check({big, big, F::zero(), F::one(), F::neg(F::one()), F::random()},
        {gen.B, gen.B, (*gen.g)[2], (*gen.g)[3], (*gen.g)[4], F::identity()}, "repeats and edge cases");
  check({}, {}, "empty");
  // Up to and past the Straus limit (Pippenger beyond).
  for (std::size_t n : {std::size_t{2}, F::straus_limit, F::straus_limit + 1, std::size_t{64}}) {
    std::vector<F::scalar> s(n);
    std::vector<F::point> p(gen.g->begin(), gen.g->begin() + static_cast<std::ptrdiff_t>(n));
    for (auto& x : s) x = F::random();
    p[0] = gen.B;
    p[1] = gen.H;
    check(s, p, "many");
  }
  test_support::expect_error<std::invalid_argument>(
      [&] { (void)F::msm(std::vector<F::scalar>(2), std::vector<F::point>(3)); }, "as many scalars");
}

class ZkR255InnerProduct : public ::testing::TestWithParam<bool> {};

// The factors random, or powers of one scalar as the range proof's y^-i (whose sums the prover
// folds with shared scalars).
TEST_P(ZkR255InnerProduct, DelayedFoldingMakesTheSameProofAsFoldingEachRound) {
  const std::size_t n = 64;
  const auto gen = generators<F>::get(n);
  std::vector<F::point> g(gen.g->begin(), gen.g->begin() + n), h(gen.h->begin(), gen.h->begin() + n);
  std::vector<F::scalar> a(n), b(n), factor(n);
  const F::scalar y = F::random();
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = F::random();
    b[i] = F::random();
    factor[i] = GetParam() ? (i == 0 ? F::one() : F::mul(factor[i - 1], y)) : F::random();
  }
  const F::point U = F::hash_to_point("troupe.test.U", {});
  auto run = [&](int delayed) {
    transcript t("ipa-test");
    return ipa_prove<F>(t, g, h, factor, U, a, b, delayed);
  };
  const auto plain = run(0);
  // P = <a, g> + <b, h'> + <a, b> U with h'_i = factor_i h_i, for the verifier.
  std::vector<F::scalar> sc;
  std::vector<F::point> pt;
  F::scalar ab = F::zero();
  for (std::size_t i = 0; i < n; ++i) {
    sc.push_back(a[i]);
    pt.push_back(g[i]);
    sc.push_back(F::mul(b[i], factor[i]));
    pt.push_back(h[i]);
    ab = F::add(ab, F::mul(a[i], b[i]));
  }
  sc.push_back(ab);
  pt.push_back(U);
  const F::point P = F::msm(sc, pt);
  std::vector<F::point> hs(n);
  for (std::size_t i = 0; i < n; ++i) hs[i] = F::mul(factor[i], h[i]);
  transcript tv("ipa-test");
  EXPECT_TRUE(ipa_verify<F>(tv, g, hs, U, P, plain));
  for (int delayed : {1, 2, 3, 4, 5, 6, 9, -1}) {
    const auto other = run(delayed);
    ASSERT_EQ(other.L.size(), plain.L.size());
    for (std::size_t j = 0; j < plain.L.size(); ++j) {
      EXPECT_EQ(other.L[j], plain.L[j]) << "delayed " << delayed << ", round " << j;
      EXPECT_EQ(other.R[j], plain.R[j]) << "delayed " << delayed << ", round " << j;
    }
    EXPECT_EQ(other.a, plain.a);
    EXPECT_EQ(other.b, plain.b);
  }
  // And libsodium's prover (folding every round) makes the same proof.
  std::vector<S::point> sg(n), sh(n);
  std::vector<S::scalar> sa(n), sb(n), sf(n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(S::decode_point(F::encode(g[i]), sg[i]));
    ASSERT_TRUE(S::decode_point(F::encode(h[i]), sh[i]));
    ASSERT_TRUE(S::decode_scalar(F::encode(a[i]), sa[i]));
    ASSERT_TRUE(S::decode_scalar(F::encode(b[i]), sb[i]));
    ASSERT_TRUE(S::decode_scalar(F::encode(factor[i]), sf[i]));
  }
  S::point sU;
  ASSERT_TRUE(S::decode_point(F::encode(U), sU));
  transcript ts("ipa-test");
  const auto reference = ipa_prove<S>(ts, sg, sh, sf, sU, sa, sb);
  for (std::size_t j = 0; j < plain.L.size(); ++j) {
    EXPECT_EQ(F::encode(plain.L[j]), S::encode(reference.L[j]));
    EXPECT_EQ(F::encode(plain.R[j]), S::encode(reference.R[j]));
  }
}

INSTANTIATE_TEST_SUITE_P(Factors, ZkR255InnerProduct, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Geometric" : "Random"; });

norm_params params(std::size_t d, int k) { return {.dim = d, .bits = k, .bound = 1.0}; }

std::vector<std::int64_t> random_update(std::size_t d, int k, std::uint64_t seed) {
  const auto p = params(d, k);
  const auto v = test_support::random_values(d, seed, 0.9 / std::sqrt(static_cast<double>(d)));
  return quantize(v, p);
}

template <class G>
std::vector<std::uint8_t> seeded_proof(const norm_params& p, std::span<const std::int64_t> x, std::uint64_t seed) {
  scoped_test_randomness same(seed);
  std::vector<typename G::scalar> xs(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xs[i] = G::from_i64(x[i]);
  return encode<G>(p, prove<G>(p, xs, x, true));
}

TEST(ZkR255Norm, TheSameRandomnessMakesTheSameProofBytesOnBothBackends) {
  // d = 20, k = 8: the inner-product argument has 256 entries, so r255's prover delays its folds.
  for (const auto& [d, k] : {std::pair<std::size_t, int>{3, 8}, {20, 8}, {5, 16}}) {
    const auto p = params(d, k);
    const auto x = random_update(d, k, 11 + d);
    const auto fast = seeded_proof<F>(p, x, 99);
    const auto reference = seeded_proof<S>(p, x, 99);
    ASSERT_EQ(fast.size(), proof_bytes(p));
    EXPECT_TRUE(fast == reference) << "d = " << d << ", k = " << k;
    EXPECT_FALSE(fast == seeded_proof<F>(p, x, 100));  // another seed, other blindings
  }
}

TEST(ZkR255Norm, EachBackendVerifiesTheOthersProofsAndRefusesTheSameTampering) {
  const auto p = params(12, 8);
  const auto x = random_update(12, 8, 5);
  const auto fast = prove_norm(x, p, group_backend::fast);
  const auto reference = prove_norm(x, p, group_backend::sodium);
  for (auto b : {group_backend::fast, group_backend::sodium}) {
    for (const auto* proof : {&fast, &reference}) {
      const auto v = verify_norm(*proof, p, x, b);
      EXPECT_TRUE(v.ok) << backend_name(b) << ": " << v.reason;
    }
  }
  // A changed byte in each part, and another update: both backends say no, for the same reason.
  auto other = x;
  other[3] += 1;
  EXPECT_FALSE(verify_norm(fast, p, other, group_backend::fast).ok);
  EXPECT_FALSE(verify_norm(fast, p, other, group_backend::sodium).ok);
  for (std::size_t at : {std::size_t{12}, std::size_t{12 + 32 * 12 + 5}, fast.size() / 2, fast.size() - 40, fast.size() - 1}) {
    auto bad = fast;
    bad[at] ^= 0x04;
    const auto vf = verify_norm(bad, p, x, group_backend::fast);
    const auto vs = verify_norm(bad, p, x, group_backend::sodium);
    EXPECT_FALSE(vf.ok) << "byte " << at;
    EXPECT_FALSE(vs.ok) << "byte " << at;
    // Same verdict, except for the verifiers' own random weights: the first failing check.
    EXPECT_EQ(vf.reason, vs.reason) << "byte " << at;
  }
  // The out-of-bound update's forged proof fails on both.
  std::vector<std::int64_t> over(12, 0);
  over[0] = 127;
  over[1] = 1;
  const auto forged = forge_norm(over, p, group_backend::fast);
  EXPECT_FALSE(verify_norm(forged, p, over, group_backend::fast).ok);
  EXPECT_FALSE(verify_norm(forged, p, over, group_backend::sodium).ok);
}

TEST(ZkR255Norm, BackendsAreNamedAndParsed) {
  EXPECT_EQ(parse_backend("r255"), group_backend::fast);
  EXPECT_EQ(parse_backend("fast"), group_backend::fast);
  EXPECT_EQ(parse_backend("sodium"), group_backend::sodium);
  EXPECT_EQ(backend_name(group_backend::fast), "r255");
  EXPECT_EQ(backend_name(group_backend::sodium), "sodium");
  test_support::expect_error<std::invalid_argument>([] { (void)parse_backend("openssl"); }, "r255 or sodium");
  EXPECT_GT(product_us(group_backend::fast, 5), 0.0);
  EXPECT_GT(product_us(group_backend::sodium, 5), 0.0);
}

}  // namespace
}  // namespace troupe::federated::zk
