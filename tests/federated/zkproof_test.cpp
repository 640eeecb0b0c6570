// The zero-knowledge norm proof and its pieces, each against its definition: the group policy on
// libsodium, the transcript, the inner-product argument alone, the range proof (one value and
// aggregated), the squares' Σ-protocol, the whole proof (completeness, the bound, tampering, the
// wrap-around coordinate) and the decoder.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support.hpp"
#include "troupe/federated/zkproof.hpp"
#include "zk_bulletproofs.hpp"
#include "zk_group_sodium.hpp"
#include "zk_norm.hpp"

namespace troupe::federated::zk {
namespace {

using G = sodium_group;
using test_support::expect_error;

std::vector<G::scalar> random_scalars(std::size_t n) {
  std::vector<G::scalar> v(n);
  for (auto& s : v) s = G::random();
  return v;
}

G::scalar inner(const std::vector<G::scalar>& a, const std::vector<G::scalar>& b) {
  auto acc = G::zero();
  for (std::size_t i = 0; i < a.size(); ++i) acc = G::add(acc, G::mul(a[i], b[i]));
  return acc;
}

/// Σ s_i P_i by products and sums one at a time: the definition msm is checked against.
G::point sum_of_products(const std::vector<G::scalar>& s, const std::vector<G::point>& p) {
  auto acc = G::identity();
  for (std::size_t i = 0; i < s.size(); ++i) acc = G::add(acc, G::mul(s[i], p[i]));
  return acc;
}

// ---- the group policy ------------------------------------------------------------------------------

TEST(ZkGroup, ScalarArithmeticIsThatOfTheIntegersModTheGroupOrder) {
  const auto a = G::random(), b = G::random();
  EXPECT_EQ(G::mul(a, G::invert(a)), G::one());
  EXPECT_EQ(G::sub(G::add(a, b), b), a);
  EXPECT_EQ(G::add(a, G::neg(a)), G::zero());
  EXPECT_EQ(G::add(G::from_i64(-5), G::from_u64(5)), G::zero());
  EXPECT_EQ(G::mul(G::from_u64(6), G::from_u64(7)), G::from_u64(42));
  EXPECT_EQ(G::from_i64(INT64_MIN), G::neg(G::mul(G::from_u64(std::uint64_t{1} << 63), G::one())));
  // ℓ = 2^252 + 27742317777372353535851937790883648493: ℓ - 1 = -1 decodes, ℓ does not.
  const auto minus_one = G::encode(G::neg(G::one()));
  G::scalar out;
  EXPECT_TRUE(G::decode_scalar(minus_one, out));
  EXPECT_EQ(out, G::neg(G::one()));
  auto ell = minus_one;
  ell[0] += 1;  // ℓ - 1 ends in 0xec: no carry
  EXPECT_FALSE(G::decode_scalar(ell, out));
  bytes32 high{};
  high[31] = 0x80;
  EXPECT_FALSE(G::decode_scalar(high, out));
  expect_error<std::invalid_argument>([] { (void)G::invert(G::zero()); }, "inverse");
}

TEST(ZkGroup, MsmIsTheSumOfTheProductsWhateverItsScalars) {
  const auto gen = generators<G>::get(8);
  std::vector<G::point> p(gen.g->begin(), gen.g->begin() + 8);
  p[5] = G::identity();
  auto s = random_scalars(8);
  s[1] = G::zero();
  s[2] = G::one();
  s[3] = G::neg(G::one());
  EXPECT_EQ(G::msm(s, p), sum_of_products(s, p));
  EXPECT_EQ(G::mul(G::zero(), p[0]), G::identity());
  EXPECT_EQ(G::add(G::identity(), p[0]), p[0]);
  EXPECT_EQ(G::sub(p[0], p[0]), G::identity());
  EXPECT_EQ(G::add(G::mul(s[0], p[0]), G::mul(s[4], p[0])), G::mul(G::add(s[0], s[4]), p[0]));
}

TEST(ZkGroup, PointsDecodeOnlyFromCanonicalEncodings) {
  const auto gen = generators<G>::get(1);
  G::point out;
  EXPECT_TRUE(G::decode_point(G::encode(gen.H), out));
  EXPECT_EQ(out, gen.H);
  EXPECT_TRUE(G::decode_point(bytes32{}, out));  // the identity
  auto odd = G::encode(gen.H);
  odd[0] |= 1;  // a negative field element: never canonical
  EXPECT_FALSE(G::decode_point(odd, out));
  bytes32 all_ones;
  all_ones.fill(0xff);
  EXPECT_FALSE(G::decode_point(all_ones, out));
  // The generators are distinct, and none is B.
  EXPECT_NE(gen.H, gen.B);
  EXPECT_NE((*gen.g)[0], (*gen.h)[0]);
  EXPECT_NE((*gen.g)[0], gen.H);
}

// ---- the transcript --------------------------------------------------------------------------------

TEST(ZkTranscript, ChallengesDependOnEveryValueLabelAndEarlierChallenge) {
  auto draw = [](std::string_view protocol, std::string_view label, std::uint64_t v) {
    transcript t(protocol);
    t.append_u64(label, v);
    return t.challenge<G>("c");
  };
  const auto base = draw("p", "x", 1);
  EXPECT_EQ(base, draw("p", "x", 1));
  EXPECT_NE(base, draw("q", "x", 1));
  EXPECT_NE(base, draw("p", "y", 1));
  EXPECT_NE(base, draw("p", "x", 2));
  transcript t("p");
  t.append_u64("x", 1);
  const auto first = t.challenge<G>("c");
  EXPECT_EQ(first, base);
  EXPECT_NE(t.challenge<G>("c"), first);  // the first draw was appended
  // (label, value) pairs are framed: "ab" + "c" differs from "a" + "bc".
  transcript u("p"), w("p");
  const std::uint8_t c[1] = {'c'}, bc[2] = {'b', 'c'};
  u.append("ab", c);
  w.append("a", bc);
  EXPECT_NE(u.challenge<G>("c"), w.challenge<G>("c"));
}

// ---- the inner-product argument --------------------------------------------------------------------

TEST(ZkInnerProduct, ProvesKnowledgeOfVectorsBehindPWithTheirInnerProduct) {
  const std::size_t n = 16;
  const auto gen = generators<G>::get(n);
  const std::vector<G::point> g(gen.g->begin(), gen.g->begin() + n), h(gen.h->begin(), gen.h->begin() + n);
  const auto a = random_scalars(n), b = random_scalars(n);
  const auto U = G::mul(G::random(), gen.B);
  // P = <a, g> + <b, h> + <a, b> U: the argument's statement.
  const auto P = G::add(G::add(sum_of_products(a, g), sum_of_products(b, h)), G::mul(inner(a, b), U));
  transcript tp("ipa-test");
  const auto proof = ipa_prove<G>(tp, g, h, {}, U, a, b);
  EXPECT_EQ(proof.L.size(), 4u);
  transcript tv("ipa-test");
  EXPECT_TRUE(ipa_verify<G>(tv, g, h, U, P, proof));
  transcript t2("ipa-test");
  EXPECT_FALSE(ipa_verify<G>(t2, g, h, U, G::add(P, gen.B), proof));  // another statement
  auto bad = proof;
  bad.a = G::add(bad.a, G::one());
  transcript t3("ipa-test");
  EXPECT_FALSE(ipa_verify<G>(t3, g, h, U, P, bad));
  bad = proof;
  std::swap(bad.L[1], bad.R[1]);
  transcript t4("ipa-test");
  EXPECT_FALSE(ipa_verify<G>(t4, g, h, U, P, bad));
  transcript t5("another protocol");
  EXPECT_FALSE(ipa_verify<G>(t5, g, h, U, P, proof));
  // A P of other vectors with the same inner product does not verify the proof.
  auto a2 = a;
  a2[0] = G::add(a2[0], G::one());
  const auto P2 = G::add(G::add(sum_of_products(a2, g), sum_of_products(b, h)), G::mul(inner(a, b), U));
  transcript t6("ipa-test");
  EXPECT_FALSE(ipa_verify<G>(t6, g, h, U, P2, proof));
}

TEST(ZkInnerProduct, ScaledHGeneratorsAreThoseOfTheStatement) {
  const std::size_t n = 8;
  const auto gen = generators<G>::get(n);
  const std::vector<G::point> g(gen.g->begin(), gen.g->begin() + n), h(gen.h->begin(), gen.h->begin() + n);
  const auto a = random_scalars(n), b = random_scalars(n), f = random_scalars(n);
  std::vector<G::point> h_scaled(n);
  for (std::size_t i = 0; i < n; ++i) h_scaled[i] = G::mul(f[i], h[i]);
  const auto U = G::mul(G::random(), gen.B);
  const auto P = G::add(G::add(sum_of_products(a, g), sum_of_products(b, h_scaled)), G::mul(inner(a, b), U));
  transcript tp("ipa-test");
  const auto proof = ipa_prove<G>(tp, g, h, f, U, a, b);
  transcript tv("ipa-test");
  EXPECT_TRUE(ipa_verify<G>(tv, g, h_scaled, U, P, proof));
  transcript t2("ipa-test");
  EXPECT_FALSE(ipa_verify<G>(t2, g, h, U, P, proof));
}

// ---- range proofs ----------------------------------------------------------------------------------

/// V = v B + γ H.
G::point commit(const G::scalar& v, const G::scalar& gamma) {
  const auto gen = generators<G>::get(1);
  return G::add(G::mul(v, gen.B), G::mul(gamma, gen.H));
}

bool prove_and_verify(std::size_t n, const std::vector<std::uint64_t>& values, bool check) {
  std::vector<G::scalar> v, gamma = random_scalars(values.size());
  std::vector<G::point> V;
  for (std::size_t j = 0; j < values.size(); ++j) {
    v.push_back(G::from_u64(values[j]));
    V.push_back(commit(v.back(), gamma[j]));
  }
  transcript tp("range-test");
  const auto proof = range_prove<G>(tp, n, V, G::zero(), v, gamma, check);
  transcript tv("range-test");
  return range_verify<G>(tv, n, V, G::zero(), proof);
}

TEST(ZkRangeProof, OneValueVerifiesExactlyInsideZeroToTwoToTheN) {
  EXPECT_TRUE(prove_and_verify(8, {0}, true));
  EXPECT_TRUE(prove_and_verify(8, {255}, true));
  EXPECT_TRUE(prove_and_verify(8, {170}, true));
  expect_error<std::invalid_argument>([] { (void)prove_and_verify(8, {256}, true); }, "not below 2^8");
  // A cheating prover proves 256's low bits (zero): the commitment is to 256, and it fails.
  EXPECT_FALSE(prove_and_verify(8, {256}, false));
  EXPECT_FALSE(prove_and_verify(8, {1000}, false));
}

TEST(ZkRangeProof, AggregatedValuesArePaddedAndEachIsChecked) {
  EXPECT_TRUE(prove_and_verify(16, {0, 65535, 12345}, true));  // m = 3, padded to 4
  EXPECT_TRUE(prove_and_verify(8, {1, 2, 3, 4, 5}, true));      // m = 5, padded to 8
  EXPECT_FALSE(prove_and_verify(8, {1, 2, 300, 4, 5}, false));  // the third is out of range
  EXPECT_FALSE(prove_and_verify(8, {1, 2, 3, 4, 256}, false));  // the last real one
}

TEST(ZkRangeProof, TheOffsetShiftsTheCommittedValueAndTheStatementIsBound) {
  // C commits to x = -3; with offset 2^7 the proof is of x + 128 ∈ [0, 256).
  const auto gamma = G::random();
  const auto x = G::from_i64(-3), offset = G::from_u64(128);
  const std::vector<G::point> V = {commit(x, gamma)};
  const std::vector<G::scalar> v = {G::add(x, offset)}, g = {gamma};
  transcript tp("range-test");
  const auto proof = range_prove<G>(tp, 8, V, offset, v, g);
  transcript tv("range-test");
  EXPECT_TRUE(range_verify<G>(tv, 8, V, offset, proof));
  transcript t2("range-test");
  EXPECT_FALSE(range_verify<G>(t2, 8, V, G::from_u64(127), proof));  // another offset
  const std::vector<G::point> other = {commit(G::from_i64(-2), gamma)};
  transcript t3("range-test");
  EXPECT_FALSE(range_verify<G>(t3, 8, other, offset, proof));  // another commitment
  auto bad = proof;
  bad.t_hat = G::add(bad.t_hat, G::one());
  transcript t4("range-test");
  EXPECT_FALSE(range_verify<G>(t4, 8, V, offset, bad));
  bad = proof;
  bad.tau_x = G::add(bad.tau_x, G::one());
  transcript t5("range-test");
  EXPECT_FALSE(range_verify<G>(t5, 8, V, offset, bad));
  bad = proof;
  bad.T1 = G::add(bad.T1, V[0]);
  transcript t6("range-test");
  EXPECT_FALSE(range_verify<G>(t6, 8, V, offset, bad));
  bad = proof;
  bad.ipa.L.pop_back();
  transcript t7("range-test");
  expect_error<std::invalid_argument>([&] { (void)range_verify<G>(t7, 8, V, offset, bad); }, "rounds");
}

// ---- the norm proof --------------------------------------------------------------------------------

norm_params params(std::size_t d, int k = 8, double bound = 1.0) { return {.dim = d, .bits = k, .bound = bound}; }

TEST(ZkNorm, AnUpdateWithinTheBoundIsProvedAndVerified) {
  const auto p = params(5);
  const std::vector<std::int64_t> x = {127, 0, 0, 0, 0};  // exactly the bound: B_q = 127
  const auto proof = prove_norm(x, p);
  EXPECT_EQ(proof.size(), proof_bytes(p));
  const auto v = verify_norm(proof, p, x);
  EXPECT_TRUE(v.ok) << v.reason;
  EXPECT_TRUE(verify_norm(proof, p).ok);  // without the opening
  const std::vector<std::int64_t> y = {-64, 63, -60, 50, -1};  // 64² + 63² + 60² + 50² + 1 = 14366 <= 16129
  const auto w = verify_norm(prove_norm(y, p), p, y);
  EXPECT_TRUE(w.ok) << w.reason;
}

TEST(ZkNorm, SixteenBitCoordinatesOfARandomUpdateVerify) {
  const auto p = params(6, 16, 2.0);
  const auto update = test_support::random_values(6, 7, 0.8);  // norm <= 0.8 sqrt(6) < 2
  const auto x = quantize(update, p);
  const auto v = verify_norm(prove_norm(x, p), p, x);
  EXPECT_TRUE(v.ok) << v.reason;
}

TEST(ZkNorm, TheProverRefusesTheBoundPlusOneQuantum) {
  const auto p = params(3);
  const std::vector<std::int64_t> over = {127, 1, 0};  // squared norm B_q² + 1
  expect_error<std::invalid_argument>([&] { (void)prove_norm(over, p); }, "above the bound");
  // In floats: an update of norm B + q (the float at or above it) has a coordinate of 2^(k-1)
  // quanta.
  const double q = quantum(p);
  float plus = static_cast<float>(1.0 + q);
  if (static_cast<double>(plus) < 1.0 + q) plus = std::nextafter(plus, 2.0f);
  const std::vector<float> update = {plus, 0.0f, 0.0f};
  const auto x = quantize(update, p);
  EXPECT_EQ(x[0], 128);
  expect_error<std::invalid_argument>([&] { (void)prove_norm(x, p); }, "outside [-2^7, 2^7)");
  // And what a cheating client sends instead fails at the norm's range proof.
  const auto forged = forge_norm(over, p);
  const auto v = verify_norm(forged, p, over);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.reason.find("norm"), std::string::npos) << v.reason;
  const auto w = verify_norm(forge_norm(x, p), p, x);
  EXPECT_FALSE(w.ok);
}

TEST(ZkNorm, ACoordinateAtHalfTheGroupOrderIsCaught) {
  // (ℓ + 1) / 2 = 2^-1 mod ℓ: its square is 1/4 mod ℓ, not a small number; the range proof of the
  // coordinates is what refuses it.
  const auto p = params(2);
  const auto half_order = G::invert(G::from_u64(2));
  EXPECT_EQ(G::add(half_order, half_order), G::one());
  const std::vector<G::scalar> x = {half_order, G::from_u64(3)};
  const std::vector<std::int64_t> opened = {0, 3};
  expect_error<std::invalid_argument>([&] { (void)prove<G>(p, x, opened, true); }, "not below 2^8");
  const auto proof = prove<G>(p, x, opened, false);
  const auto why = verify<G>(p, proof, {});
  EXPECT_NE(why.find("coordinates' range proof"), std::string::npos) << why;
  // Near -(ℓ+1)/2 too: ℓ - (ℓ+1)/2 = (ℓ-1)/2.
  const std::vector<G::scalar> y = {G::neg(half_order), G::from_u64(3)};
  EXPECT_NE(verify<G>(p, prove<G>(p, y, opened, false), {}).find("range"), std::string::npos);
}

TEST(ZkNorm, TheSquaresSigmaProtocolBindsC2ToTheSquareOfCsValue) {
  // The relation: knowledge of (x, r, s) with C = x B + r H and C2 = x C + s H (so C2 commits to
  // x² with blinding x r + s).
  const auto p = params(3);
  std::vector<G::scalar> x = {G::from_u64(5), G::from_i64(-7), G::from_u64(2)};
  const std::vector<std::int64_t> opened = {5, -7, 2};
  const auto proof = prove<G>(p, x, opened, true);
  EXPECT_EQ(verify<G>(p, proof, opened), "");
  const auto gen = generators<G>::get(1);
  auto bad = proof;
  bad.C2[1] = G::add(bad.C2[1], gen.B);  // a commitment to x² + 1
  EXPECT_NE(verify<G>(p, bad, opened).find("squares"), std::string::npos);
  bad = proof;
  bad.squares.z3[2] = G::add(bad.squares.z3[2], G::one());
  EXPECT_NE(verify<G>(p, bad, opened).find("squares"), std::string::npos);
  bad = proof;
  bad.squares.T1[0] = bad.squares.T2[0];
  EXPECT_NE(verify<G>(p, bad, opened).find("squares"), std::string::npos);
}

TEST(ZkNorm, AChangedCommitmentOrResponseFails) {
  const auto p = params(4);
  const std::vector<std::int64_t> x = {10, -20, 30, -40};
  std::vector<G::scalar> xs;
  for (auto v : x) xs.push_back(G::from_i64(v));
  const auto proof = prove<G>(p, xs, x, true);
  ASSERT_EQ(verify<G>(p, proof, x), "");
  const auto gen = generators<G>::get(1);
  auto bad = proof;
  bad.C[2] = G::add(bad.C[2], gen.H);
  EXPECT_NE(verify<G>(p, bad, x), "");
  bad = proof;
  bad.squares.z1[0] = G::add(bad.squares.z1[0], G::one());
  EXPECT_NE(verify<G>(p, bad, x), "");
  bad = proof;
  bad.z = G::add(bad.z, G::one());
  EXPECT_NE(verify<G>(p, bad, x).find("open"), std::string::npos);
  bad = proof;
  bad.norm.mu = G::add(bad.norm.mu, G::one());
  EXPECT_NE(verify<G>(p, bad, x).find("norm"), std::string::npos);
  bad = proof;
  bad.coordinates.ipa.b = G::add(bad.coordinates.ipa.b, G::one());
  EXPECT_NE(verify<G>(p, bad, x).find("coordinates"), std::string::npos);
  // The opening binds the update: one quantum more in one coordinate fails.
  auto other = x;
  other[3] += 1;
  EXPECT_NE(verify<G>(p, proof, other).find("open"), std::string::npos);
}

TEST(ZkNorm, AnyChangedProofByteFails) {
  const auto p = params(1);
  const std::vector<std::int64_t> x = {-100};
  const auto proof = prove_norm(x, p);
  ASSERT_TRUE(verify_norm(proof, p, x).ok);
  for (std::size_t i = 0; i < proof.size(); ++i) {
    auto bad = proof;
    bad[i] ^= static_cast<std::uint8_t>(1u << (i % 7 + 1));  // bits 1..7: the low bit alone makes most points invalid
    const auto v = verify_norm(bad, p, x);
    ASSERT_FALSE(v.ok) << "byte " << i << " changed, still verifies";
  }
}

TEST(ZkNorm, TheDecoderRefusesMalformedProofsSayingWhy) {
  const auto p = params(2);
  const std::vector<std::int64_t> x = {1, 2};
  const auto proof = prove_norm(x, p);
  check_proof_encoding(proof, p);
  auto refuse = [&](std::vector<std::uint8_t> bytes, const norm_params& q, const std::string& words) {
    expect_error<std::invalid_argument>([&] { check_proof_encoding(bytes, q); }, words);
    const auto v = verify_norm(bytes, q, x);
    EXPECT_FALSE(v.ok);
    EXPECT_NE(v.reason.find(words), std::string::npos) << v.reason;
  };
  refuse({}, p, "shorter than the 12-byte header");
  refuse(std::vector<std::uint8_t>(proof.begin(), proof.end() - 1), p, "bytes, a proof for d = 2 and k = 8 has");
  auto longer = proof;
  longer.push_back(0);
  refuse(longer, p, "bytes, a proof for d = 2 and k = 8 has");
  auto bad = proof;
  bad[0] = 'X';
  refuse(bad, p, "magic");
  bad = proof;
  bad[4] = 2;
  refuse(bad, p, "version 2");
  refuse(proof, params(2, 16), "8 bits per coordinate, the verifier expects 16");
  refuse(proof, params(3), "for 2 coordinates, the verifier expects 3");
  bad = proof;
  bad[7] = 1;
  refuse(bad, p, "reserved");
  bad = proof;
  std::fill(bad.end() - 32, bad.end(), 0xff);
  refuse(bad, p, "z[0] at byte");
  bad = proof;
  std::fill(bad.begin() + 12, bad.begin() + 44, 0xff);
  refuse(bad, p, "C[0] at byte 12 is not a canonical ristretto255 point");
}

TEST(ZkNorm, SizesFollowTheFormula) {
  for (const auto& p : {params(1), params(5, 16), params(1000, 16), params(79510, 16), params(7, 32)}) {
    const std::size_t r1 = static_cast<std::size_t>(std::log2(p.bits * std::bit_ceil(p.dim)));
    const std::size_t r2 = static_cast<std::size_t>(std::log2(2 * p.bits));
    EXPECT_EQ(proof_bytes(p), 12 + 32 * (7 * p.dim + 18 + 2 * (r1 + r2) + 2)) << p.dim;
  }
  const auto p = params(5, 16);
  EXPECT_EQ(prove_norm(std::vector<std::int64_t>(5, 0), p).size(), proof_bytes(p));
}

TEST(ZkNorm, QuantizationTruncatesTowardZeroSoTheNormNeverGrows) {
  const auto p = params(4, 8, 1.27);  // q = 0.01
  EXPECT_DOUBLE_EQ(quantum(p), 0.01);
  EXPECT_EQ(bound_quanta(p), 127);
  const auto x = quantize(std::vector<float>{0.0299f, -0.0299f, 0.555f, -0.005f}, p);
  EXPECT_EQ(x, (std::vector<std::int64_t>{2, -2, 55, 0}));
  auto random_update = test_support::random_values(50, 3, 1.0);
  const auto big = params(50, 16, 3.0);
  double norm = 0, qnorm = 0;
  const auto xs = quantize(random_update, big);
  for (std::size_t i = 0; i < 50; ++i) {
    norm += static_cast<double>(random_update[i]) * random_update[i];
    qnorm += static_cast<double>(xs[i]) * static_cast<double>(xs[i]) * quantum(big) * quantum(big);
  }
  EXPECT_LE(qnorm, norm);
  expect_error<std::invalid_argument>([&] { (void)quantize(std::vector<float>{NAN, 0, 0, 0}, p); }, "not finite");
  expect_error<std::invalid_argument>([&] { (void)quantize(std::vector<float>{0}, p); }, "1 values for dimension 4");
}

TEST(ZkNorm, ParametersOutsideTheirRangesAreRefused) {
  expect_error<std::invalid_argument>([] { check_params(params(0)); }, "dimension");
  expect_error<std::invalid_argument>([] { check_params(params(4, 12)); }, "8, 16 or 32");
  expect_error<std::invalid_argument>([] { check_params(params(4, 8, 0.0)); }, "bound");
  expect_error<std::invalid_argument>([] { check_params(params(4, 8, INFINITY)); }, "bound");
  expect_error<std::invalid_argument>([] { (void)prove_norm(std::vector<std::int64_t>{1}, params(2)); }, "1 coordinates");
}

}  // namespace
}  // namespace troupe::federated::zk
