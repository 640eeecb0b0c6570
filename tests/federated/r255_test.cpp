// ristretto255 in the project's own code (r255.hpp): RFC 9496's test vectors, and libsodium's
// ristretto255 as the reference on fresh random inputs for every operation both have.

#include <gtest/gtest.h>

#include <sodium.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "r255_point.hpp"
#include "troupe/federated/r255.hpp"

namespace troupe::federated::r255 {
namespace {

bytes32 hex32(const std::string& h) {
  bytes32 out{};
  for (std::size_t i = 0; i < 32; ++i) out[i] = static_cast<std::uint8_t>(std::stoul(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

bytes64 hex64(const std::string& h) {
  bytes64 out{};
  for (std::size_t i = 0; i < 64; ++i) out[i] = static_cast<std::uint8_t>(std::stoul(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

struct sodium_ready {
  sodium_ready() { EXPECT_GE(sodium_init(), 0); }
};

template <std::size_t N>
std::array<std::uint8_t, N> random_bytes() {
  static sodium_ready ready;
  std::array<std::uint8_t, N> b;
  randombytes_buf(b.data(), N);
  return b;
}

point random_point() { return from_uniform_bytes(random_bytes<64>()); }

/// libsodium's canonical scalar (randombytes into crypto_core_ristretto255_scalar_reduce).
bytes32 sodium_scalar() {
  const auto wide = random_bytes<64>();
  bytes32 s;
  crypto_core_ristretto255_scalar_reduce(s.data(), wide.data());
  return s;
}

scalar from_sodium(const bytes32& b) {
  bool ok = false;
  const scalar s = scalar_from_canonical(b, ok);
  EXPECT_TRUE(ok);
  return s;
}

// RFC 9496 appendix A.1: the encodings of 0B, 1B, ..., 15B.
const char* const multiples_of_b[16] = {
    "0000000000000000000000000000000000000000000000000000000000000000",
    "e2f2ae0a6abc4e71a884a961c500515f58e30b6aa582dd8db6a65945e08d2d76",
    "6a493210f7499cd17fecb510ae0cea23a110e8d5b901f8acadd3095c73a3b919",
    "94741f5d5d52755ece4f23f044ee27d5d1ea1e2bd196b462166b16152a9d0259",
    "da80862773358b466ffadfe0b3293ab3d9fd53c5ea6c955358f568322daf6a57",
    "e882b131016b52c1d3337080187cf768423efccbb517bb495ab812c4160ff44e",
    "f64746d3c92b13050ed8d80236a7f0007c3b3f962f5ba793d19a601ebb1df403",
    "44f53520926ec81fbd5a387845beb7df85a96a24ece18738bdcfa6a7822a176d",
    "903293d8f2287ebe10e2374dc1a53e0bc887e592699f02d077d5263cdd55601c",
    "02622ace8f7303a31cafc63f8fc48fdc16e1c8c8d234b2f0d6685282a9076031",
    "20706fd788b2720a1ed2a5dad4952b01f413bcf0e7564de8cdc816689e2db95f",
    "bce83f8ba5dd2fa572864c24ba1810f9522bc6004afe95877ac73241cafdab42",
    "e4549ee16b9aa03099ca208c67adafcafa4c3f3e4e5303de6026e3ca8ff84460",
    "aa52e000df2e16f55fb1032fc33bc42742dad6bd5a8fc0be0167436c5948501f",
    "46376b80f409b29dc2b5f6f0c52591990896e5716f41477cd30085ab7f10301e",
    "e0c418f7c8d9c4cdd7395b93ea124f3ad99021bb681dfc3302a9d99a2e53e64e",
};

TEST(R255, EncodesTheSmallMultiplesOfTheGeneratorAsRfc9496ListsThem) {
  point sum = identity();
  for (std::uint64_t k = 0; k < 16; ++k) {
    const auto want = hex32(multiples_of_b[k]);
    EXPECT_EQ(encode(sum), want) << "repeated addition, k = " << k;
    EXPECT_EQ(encode(base_mul(scalar_from_u64(k))), want) << "base_mul, k = " << k;
    EXPECT_EQ(encode(scalar_from_u64(k) * generator()), want) << "windowed product, k = " << k;
    EXPECT_EQ(encode(vartime_double_mul(scalar{}, random_point(), scalar_from_u64(k))), want) << "double product";
    point decoded;
    ASSERT_TRUE(decode(want, decoded)) << k;
    EXPECT_TRUE(decoded == sum) << k;
    EXPECT_EQ(encode(decoded), want);
    sum = sum + generator();
  }
}

TEST(R255, RejectsTheInvalidEncodingsOfRfc9496) {
  // RFC 9496 appendix A.2: non-canonical field encodings, negative s, non-square x^2, negative
  // xy, and s = -1 (which gives y = 0).
  const char* const bad[] = {
      "00ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
      "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
      "f3ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
      "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
      "0100000000000000000000000000000000000000000000000000000000000080",
      "0100000000000000000000000000000000000000000000000000000000000000",
      "01ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
      "ed57ffd8c914fb201471d1c3d245ce3c746fcbe63a3679d51b6a516ebebe0e20",
      "c34c4e1826e5d403b78e246e88aa051c36ccf0aafebffe137d148a2bf9104562",
      "c940e5a4404157cfb1628b108db051a8d439e1a421394ec4ebccb9ec92a8ac78",
      "47cfc5497c53dc8e61c91d17fd626ffb1c49e2bca94eed052281b510b1117a24",
      "f1c6165d33367351b0da8f6e4511010c68174a03b6581212c71c0e1d026c3c72",
      "87260f7a2f12495118360f02c26a470f450dadf34a413d21042b43b9d93e1309",
      "26948d35ca62e643e26a83177332e6b6afeb9d08e4268b650f1f5bbd8d81d371",
      "4eac077a713c57b4f4397629a4145982c661f48044dd3f96427d40b147d9742f",
      "de6a7b00deadc788eb6b6c8d20c0ae96c2f2019078fa604fee5b87d6e989ad7b",
      "bcab477be20861e01e4a0e295284146a510150d9817763caf1a6f4b422d67042",
      "2a292df7e32cababbd9de088d1d1abec9fc0440f637ed2fba145094dc14bea08",
      "f4a9e534fc0d216c44b218fa0c42d99635a0127ee2e53c712f70609649fdff22",
      "8268436f8c4126196cf64b3c7ddbda90746a378625f9813dd9b8457077256731",
      "2810e5cbc2cc4d4eece54f61c6f69758e289aa7ab440b3cbeaa21995c2f4232b",
      "3eb858e78f5a7254d8c9731174a94f76755fd3941c0ac93735c07ba14579630e",
      "a45fdc55c76448c049a1ab33f17023edfb2be3581e9c7aade8a6125215e04220",
      "d483fe813c6ba647ebbfd3ec41adca1c6130c2beeee9d9bf065c8d151c5f396e",
      "8a2e1d30050198c65a54483123960ccc38aef6848e1ec8f5f780e8523769ba32",
      "32888462f8b486c68ad7dd9610be5192bbeaf3b443951ac1a8118419d9fa097b",
      "227142501b9d4355ccba290404bde41575b037693cef1f438c47f8fbf35d1165",
      "5c37cc491da847cfeb9281d407efc41e15144c876e0170b499a96a22ed31e01e",
      "445425117cb8c90edcbc7c1cc0e74f747f2c1efa5630a967c64f287792a48a4b",
      "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
  };
  for (const char* h : bad) {
    point p = generator();
    EXPECT_FALSE(decode(hex32(h), p)) << h;
    EXPECT_TRUE(p == generator()) << "a refused decoding left its output alone";
  }
}

TEST(R255, DerivesTheElementsOfRfc9496FromUniformBytes) {
  // RFC 9496 appendix A.3: 64 uniform bytes (SHA-512 of the RFC's labels) and their elements.
  const char* const input[7] = {
      "5d1be09e3d0c82fc538112490e35701979d99e06ca3e2b5b54bffe8b4dc772c14d98b696a1bbfb5ca32c436cc61c16563790306c79eaca7705668b47dffe5bb6",
      "f116b34b8f17ceb56e8732a60d913dd10cce47a6d53bee9204be8b44f6678b270102a56902e2488c46120e9276cfe54638286b9e4b3cdb470b542d46c2068d38",
      "8422e1bbdaab52938b81fd602effb6f89110e1e57208ad12d9ad767e2e25510c27140775f9337088b982d83d7fcf0b2fa1edffe51952cbe7365e95c86eaf325c",
      "ac22415129b61427bf464e17baee8db65940c233b98afce8d17c57beeb7876c2150d15af1cb1fb824bbd14955f2b57d08d388aab431a391cfc33d5bafb5dbbaf",
      "165d697a1ef3d5cf3c38565beefcf88c0f282b8e7dbd28544c483432f1cec7675debea8ebb4e5fe7d6f6e5db15f15587ac4d4d4a1de7191e0c1ca6664abcc413",
      "a836e6c9a9ca9f1e8d486273ad56a78c70cf18f0ce10abb1c7172ddd605d7fd2979854f47ae1ccf204a33102095b4200e5befc0465accc263175485f0e17ea5c",
      "2cdc11eaeb95daf01189417cdddbf95952993aa9cb9c640eb5058d09702c74622c9965a697a3b345ec24ee56335b556e677b30e6f90ac77d781064f866a3c982",
  };
  const char* const output[7] = {
      "3066f82a1a747d45120d1740f14358531a8f04bbffe6a819f86dfe50f44a0a46",
      "f26e5b6f7d362d2d2a94c5d0e7602cb4773c95a2e5c31a64f133189fa76ed61b",
      "006ccd2a9e6867e6a2c5cea83d3302cc9de128dd2a9a57dd8ee7b9d7ffe02826",
      "f8f0c87cf237953c5890aec3998169005dae3eca1fbb04548c635953c817f92a",
      "ae81e7dedf20a497e10c304a765c1767a42d6e06029758d2d7e8ef7cc4c41179",
      "e2705652ff9f5e44d3e841bf1c251cf7dddb77d140870d1ab2ed64f1a9ce8628",
      "80bd07262511cdde4863f8a7434cef696750681cb9510eea557088f76d9e5065",
  };
  for (int i = 0; i < 7; ++i) EXPECT_EQ(encode(from_uniform_bytes(hex64(input[i]))), hex32(output[i])) << i;
}

TEST(R255, FieldConstantsAndSquareRootRatioKeepTheirDefinitions) {
  using namespace detail;
  EXPECT_EQ(equal(sq(fe_sqrt_m1), neg(fe_one())), 1u);
  // d = -121665 / 121666.
  const fe k121665{{121665, 0, 0, 0, 0}}, k121666{{121666, 0, 0, 0, 0}};
  EXPECT_EQ(equal(mul(fe_d, k121666), neg(k121665)), 1u);
  EXPECT_EQ(equal(fe_d2, add(fe_d, fe_d)), 1u);
  // SQRT_AD_MINUS_ONE^2 = a*d - 1 = -d - 1; INVSQRT_A_MINUS_D^2 * (a - d) = 1.
  EXPECT_EQ(equal(sq(fe_sqrt_ad_minus_one), sub(neg(fe_d), fe_one())), 1u);
  EXPECT_EQ(equal(mul(sq(fe_invsqrt_a_minus_d), sub(neg(fe_one()), fe_d)), fe_one()), 1u);
  EXPECT_EQ(equal(fe_one_minus_d_sq, sub(fe_one(), sq(fe_d))), 1u);
  EXPECT_EQ(equal(fe_d_minus_one_sq, sq(sub(fe_d, fe_one()))), 1u);
  // SQRT_RATIO_M1(u, v): v * r^2 = u when u/v is a square, sqrt(-1) * u otherwise; r >= 0.
  int squares = 0;
  for (int i = 0; i < 1000; ++i) {
    const fe u = from_bytes(random_bytes<32>()), v = from_bytes(random_bytes<32>());
    fe r;
    const auto was_square = sqrt_ratio_m1(u, v, r);
    squares += static_cast<int>(was_square);
    EXPECT_EQ(is_negative(r), 0u);
    EXPECT_EQ(equal(mul(v, sq(r)), was_square ? u : mul(fe_sqrt_m1, u)), 1u);
    EXPECT_EQ(equal(mul(invert(v), v), fe_one()), 1u);
  }
  EXPECT_GT(squares, 400);  // about half are squares
  EXPECT_LT(squares, 600);
  fe r;
  EXPECT_EQ(sqrt_ratio_m1(fe_zero(), fe_one(), r), 1u);  // 0 is a square
  EXPECT_EQ(sqrt_ratio_m1(fe_one(), fe_zero(), r), 0u);  // division by zero is not
  // Non-canonical limbs and values at or above p reduce to the canonical bytes.
  bytes32 p_bytes = hex32("edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f");
  EXPECT_EQ(is_zero(from_bytes(p_bytes)), 1u);
  const fe loose{{mask51 + 18, mask51, mask51, mask51, mask51}};  // 2^255 + 17 = p + 36
  EXPECT_EQ(to_bytes(loose), to_bytes(fe{{36, 0, 0, 0, 0}}));
}

TEST(R255, ScalarArithmeticAgreesWithLibsodium) {
  for (int i = 0; i < 1000; ++i) {
    const bytes32 a = sodium_scalar(), b = sodium_scalar();
    const scalar x = from_sodium(a), y = from_sodium(b);
    EXPECT_EQ(to_bytes(x), a);
    bytes32 want;
    crypto_core_ristretto255_scalar_add(want.data(), a.data(), b.data());
    EXPECT_EQ(to_bytes(x + y), want);
    crypto_core_ristretto255_scalar_sub(want.data(), a.data(), b.data());
    EXPECT_EQ(to_bytes(x - y), want);
    crypto_core_ristretto255_scalar_mul(want.data(), a.data(), b.data());
    EXPECT_EQ(to_bytes(x * y), want);
    crypto_core_ristretto255_scalar_negate(want.data(), a.data());
    EXPECT_EQ(to_bytes(-x), want);
    crypto_core_ristretto255_scalar_invert(want.data(), a.data());
    EXPECT_EQ(to_bytes(invert(x)), want);
    const auto wide = random_bytes<64>();
    crypto_core_ristretto255_scalar_reduce(want.data(), wide.data());
    EXPECT_EQ(to_bytes(scalar_reduce(wide)), want);
  }
  // The extremes of the 512-bit reduction, and of the canonical range.
  bytes64 ones;
  ones.fill(0xff);
  bytes32 want;
  crypto_core_ristretto255_scalar_reduce(want.data(), ones.data());
  EXPECT_EQ(to_bytes(scalar_reduce(ones)), want);
  const bytes32 l = hex32("edd3f55c1a631258d69cf7a2def9de1400000000000000000000000000000010");
  bool ok = true;
  (void)scalar_from_canonical(l, ok);
  EXPECT_FALSE(ok) << "l itself";
  bytes32 l_minus_1 = l;
  l_minus_1[0] -= 1;
  EXPECT_EQ(to_bytes(scalar_from_canonical(l_minus_1, ok)), l_minus_1);
  EXPECT_TRUE(ok);
  EXPECT_TRUE(scalar_from_u64(0) == scalar_from_u64(1) + scalar_from_canonical(l_minus_1, ok));
  bytes32 all_ones;
  all_ones.fill(0xff);
  (void)scalar_from_canonical(all_ones, ok);
  EXPECT_FALSE(ok);
  EXPECT_TRUE(invert(scalar{}) == scalar{});
  // The batch inversion equals one inversion each, zeros left zero.
  std::vector<scalar> many(50);
  for (auto& x : many) x = random_scalar();
  many[0] = many[17] = many[49] = scalar{};
  many[3] = scalar_from_u64(1);
  auto inverted = many;
  batch_invert(inverted);
  for (std::size_t i = 0; i < many.size(); ++i) EXPECT_TRUE(inverted[i] == invert(many[i])) << i;
  std::vector<scalar> none;
  batch_invert(none);
  EXPECT_FALSE(random_scalar() == random_scalar());
}

TEST(R255, GroupOperationsAgreeWithLibsodium) {
  for (int i = 0; i < 1000; ++i) {
    // from_hash: the one-way map of 64 random bytes.
    const auto h = random_bytes<64>();
    bytes32 want;
    crypto_core_ristretto255_from_hash(want.data(), h.data());
    const point p = from_uniform_bytes(h);
    ASSERT_EQ(encode(p), want);
    // Addition and subtraction of two elements.
    const auto h2 = random_bytes<64>();
    const point q = from_uniform_bytes(h2);
    const bytes32 ep = encode(p), eq = encode(q);
    crypto_core_ristretto255_add(want.data(), ep.data(), eq.data());
    EXPECT_EQ(encode(p + q), want);
    crypto_core_ristretto255_sub(want.data(), ep.data(), eq.data());
    EXPECT_EQ(encode(p - q), want);
    EXPECT_EQ(encode(dbl(p)), encode(p + p));
    // The constant-time product, and the generator's.
    const bytes32 s = sodium_scalar();
    ASSERT_EQ(crypto_scalarmult_ristretto255(want.data(), s.data(), ep.data()), 0);
    EXPECT_EQ(encode(from_sodium(s) * p), want);
    ASSERT_EQ(crypto_scalarmult_ristretto255_base(want.data(), s.data()), 0);
    EXPECT_EQ(encode(base_mul(from_sodium(s))), want);
    // Decoding an encoding gives the element back.
    point back;
    ASSERT_TRUE(decode(ep, back));
    EXPECT_TRUE(back == p);
    EXPECT_FALSE(back == q);
  }
}

TEST(R255, DecodesRandomBytesExactlyWhenLibsodiumDoes) {
  // Arbitrary bytes never crash the decoder, and it accepts the same strings as libsodium: random
  // strings (almost all invalid), valid encodings, and valid ones with one bit flipped. One
  // difference: RFC 9496 refuses a string with its top bit set (not canonical), libsodium 1.0.18
  // ignores that bit; such a string is refused here and judged as libsodium judges it without the bit.
  int valid = 0, top_bit = 0;
  for (int i = 0; i < 20000; ++i) {
    bytes32 b = random_bytes<32>();
    if (i % 4 == 1) b = encode(random_point());
    if (i % 4 == 2) {
      b = encode(random_point());
      b[b[0] % 32] ^= static_cast<std::uint8_t>(1u << (b[1] % 8));
    }
    point p;
    const bool ours = decode(b, p);
    if (b[31] & 0x80) {
      ++top_bit;
      EXPECT_FALSE(ours) << i;
      b[31] &= 0x7f;
      EXPECT_EQ(decode(b, p), crypto_core_ristretto255_is_valid_point(b.data()) == 1 || b == bytes32{}) << i;
      continue;
    }
    EXPECT_EQ(ours, crypto_core_ristretto255_is_valid_point(b.data()) == 1 || b == bytes32{}) << i;
    if (ours) {
      ++valid;
      EXPECT_EQ(encode(p), b);
    }
  }
  EXPECT_GT(valid, 5000);
  EXPECT_GT(top_bit, 2000);
}

TEST(R255, ElementEqualityIsTheQuotientByTheFourTorsion) {
  // P and P + T for T of order 2 or 4 are one ristretto element: equal, with one encoding.
  using namespace detail;
  const point p = random_point();
  const point t2{fe_zero(), neg(fe_one()), fe_one(), fe_zero()};         // (0, -1)
  const point t4{fe_sqrt_m1, fe_zero(), fe_one(), fe_zero()};            // (sqrt(-1), 0)
  for (const point& t : {t2, t4, t2 + t4}) {
    const point q = p + t;
    EXPECT_TRUE(q == p);
    EXPECT_EQ(encode(q), encode(p));
  }
  EXPECT_TRUE(p - p == identity());
  EXPECT_TRUE(-p + p == identity());
  EXPECT_FALSE(p == identity());
  EXPECT_EQ(encode(identity()), bytes32{});
}

TEST(R255, BatchedAndDoubleProductsMatchTheirPlainForms) {
  std::vector<point> pts(40);
  for (auto& p : pts) p = random_point();
  pts[3] = identity();
  const scalar s = random_scalar();
  std::vector<point> out(pts.size());
  multiply_each(s, pts, out);
  std::vector<bytes32> doubled(pts.size());
  double_and_encode(pts, doubled);
  for (std::size_t i = 0; i < pts.size(); ++i) {
    EXPECT_TRUE(out[i] == s * pts[i]) << i;
    EXPECT_EQ(doubled[i], encode(dbl(pts[i]))) << i;
  }
  for (int i = 0; i < 200; ++i) {
    const scalar a = random_scalar(), b = random_scalar();
    const point p = random_point();
    EXPECT_TRUE(vartime_double_mul(a, p, b) == a * p + base_mul(b));
  }
  EXPECT_TRUE(vartime_double_mul(scalar{}, pts[0], scalar{}) == identity());
  EXPECT_TRUE(vartime_double_mul(-scalar_from_u64(1), pts[0], scalar{}) == -pts[0]);
}

TEST(R255, EightLaneProductsEqualTheOnePointProducts) {
  if (!detail::ifma_available()) GTEST_SKIP() << "this CPU has no AVX-512 IFMA: multiply_each runs the portable path";
  // Counts around the eight lanes; scalars with extreme digits; the identity; and points whose
  // limbs are loose (each limb plus p's, as sums leave them), which the lanes must carry first.
  const detail::fe p_limbs{{0x7ffffffffffed, 0x7ffffffffffff, 0x7ffffffffffff, 0x7ffffffffffff, 0x7ffffffffffff}};
  const scalar scalars[] = {random_scalar(), random_scalar(), -scalar_from_u64(1), scalar_from_u64(1),
                            scalar_from_u64(8), scalar{}};
  int run = 0;
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 63u, 100u}) {
    for (const scalar& s : scalars) {
      std::vector<point> pts(n);
      for (std::size_t i = 0; i < n; ++i) {
        pts[i] = random_point();
        if (i % 13 == 5) pts[i] = identity();
        if (i % 3 == 1)
          for (int k = 0; k < 5; ++k) {
            pts[i].X.limb[k] += p_limbs.limb[k];
            pts[i].Y.limb[k] += p_limbs.limb[k];
            pts[i].Z.limb[k] += p_limbs.limb[k];
            pts[i].T.limb[k] += p_limbs.limb[k];
          }
      }
      std::vector<point> fast(n), plain(n);
      detail::multiply_each_ifma(s, pts, fast);
      detail::multiply_each_portable(s, pts, plain);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(encode(fast[i]), encode(plain[i])) << "n = " << n << ", point " << i << ", scalar " << run % 6;
        ASSERT_TRUE(fast[i] == s * pts[i]);
      }
      ++run;
    }
  }
  // In place: the output may be the input.
  std::vector<point> pts(20), want(20);
  for (auto& q : pts) q = random_point();
  const scalar s = random_scalar();
  detail::multiply_each_portable(s, pts, want);
  detail::multiply_each_ifma(s, pts, pts);
  for (std::size_t i = 0; i < pts.size(); ++i) EXPECT_EQ(encode(pts[i]), encode(want[i])) << i;
}

TEST(R255, EightLanePowersEqualTheOneByOne) {
  if (!detail::ifma_available()) GTEST_SKIP() << "this CPU has no AVX-512 IFMA: pow22523_each runs the portable path";
  // Random elements, loose limbs (below 2^54, as sums leave them), 0, 1, p - 1 and p itself.
  std::mt19937_64 g(5);
  std::vector<detail::fe> in;
  in.push_back(detail::fe_zero());
  in.push_back(detail::fe_one());
  in.push_back({{0x7ffffffffffec, 0x7ffffffffffff, 0x7ffffffffffff, 0x7ffffffffffff, 0x7ffffffffffff}});
  in.push_back({{0x7ffffffffffed, 0x7ffffffffffff, 0x7ffffffffffff, 0x7ffffffffffff, 0x7ffffffffffff}});
  for (int i = 0; i < 200; ++i) {
    detail::fe a;
    for (auto& l : a.limb) l = g() >> (i % 2 == 0 ? 13 : 10);
    in.push_back(a);
  }
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{8}, in.size()}) {
    std::vector<detail::fe> fast(n);
    detail::pow22523_ifma(in.data(), fast.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(detail::to_bytes(fast[i]), detail::to_bytes(detail::pow22523(in[i]))) << "n = " << n << ", element " << i;
  }
}

TEST(R255, BatchedDecodingAndHashingEqualTheOneByOne) {
  // Valid encodings, random bytes (mostly invalid) and valid ones with one bit flipped, across
  // the batches' chunks of 128 and lanes of 8.
  std::mt19937_64 g(23);
  for (std::size_t n : {0u, 1u, 9u, 300u}) {
    std::vector<bytes32> enc(n);
    std::vector<bytes64> wide(n);
    for (std::size_t i = 0; i < n; ++i) {
      wide[i] = random_bytes<64>();
      enc[i] = i % 3 == 0 ? random_bytes<32>() : encode(from_uniform_bytes(wide[i]));
      if (i % 5 == 4) enc[i][g() % 32] ^= static_cast<std::uint8_t>(1u << (g() % 8));
    }
    std::vector<point> decoded(n), hashed(n);
    std::vector<std::uint8_t> ok(n);
    decode_each(enc, decoded, ok);
    from_uniform_bytes_each(wide, hashed);
    for (std::size_t i = 0; i < n; ++i) {
      point one;
      ASSERT_EQ(ok[i] == 1, decode(enc[i], one)) << "n = " << n << ", element " << i;
      if (ok[i]) {
        EXPECT_EQ(encode(decoded[i]), enc[i]) << i;
      }
      bytes32 want;
      crypto_core_ristretto255_from_hash(want.data(), wide[i].data());
      EXPECT_EQ(encode(hashed[i]), want) << i;
    }
  }
}

TEST(R255, BatchesRefuseSpansOfUnequalLengthBeforeWritingAny) {
  // A shorter out (or ok) span would be written past its end: each batch refuses it and leaves
  // what it was given untouched.
  const point sentinel = random_point();
  std::vector<bytes32> enc(5, encode(random_point()));
  std::vector<bytes64> wide(5, random_bytes<64>());
  std::vector<point> pts(5, random_point());
  std::vector<point> four(4, sentinel), five(5, sentinel);
  std::vector<std::uint8_t> ok4(4, 7), ok5(5, 7);
  std::vector<bytes32> enc4(4);
  const auto untouched = [&] {
    for (const point& q : four) EXPECT_TRUE(q == sentinel);
    for (const point& q : five) EXPECT_TRUE(q == sentinel);
    for (std::uint8_t b : ok4) EXPECT_EQ(b, 7);
    for (std::uint8_t b : ok5) EXPECT_EQ(b, 7);
  };
  EXPECT_THROW(decode_each(enc, four, ok5), std::invalid_argument);
  EXPECT_THROW(decode_each(enc, five, ok4), std::invalid_argument);
  EXPECT_THROW(from_uniform_bytes_each(wide, four), std::invalid_argument);
  EXPECT_THROW(multiply_each(random_scalar(), pts, four), std::invalid_argument);
  EXPECT_THROW(double_and_encode(pts, enc4), std::invalid_argument);
  untouched();
  // A longer one is refused too (its tail would be left unwritten).
  std::vector<point> six(6);
  EXPECT_THROW(multiply_each(random_scalar(), pts, six), std::invalid_argument);
  EXPECT_THROW(from_uniform_bytes_each(wide, six), std::invalid_argument);
  try {
    multiply_each(random_scalar(), pts, four);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("5 points for 4 products"), std::string::npos) << e.what();
  }
  // Equal lengths still go through.
  decode_each(enc, five, ok5);
  for (std::uint8_t b : ok5) EXPECT_EQ(b, 1);
}

TEST(R255, MultiScalarMultiplicationEqualsTheSumOfProducts) {
  std::mt19937_64 g(17);
  for (std::size_t n : {0u, 1u, 2u, 3u, 7u, 33u, 64u, 257u, 1000u}) {
    std::vector<scalar> s(n);
    std::vector<point> p(n);
    for (std::size_t i = 0; i < n; ++i) {
      s[i] = random_scalar();
      p[i] = random_point();
      if (g() % 7 == 0) s[i] = scalar{};                 // zero scalars
      if (g() % 11 == 0) p[i] = identity();              // identity points
      if (g() % 13 == 0) s[i] = -scalar_from_u64(1);     // l - 1: every digit at its extreme
      if (g() % 17 == 0) s[i] = scalar_from_u64(g() % 5);
    }
    EXPECT_TRUE(msm(s, p) == msm_reference(s, p)) << "n = " << n;
  }
  // Every window width gives the same sum (the count picks one; here each is forced).
  std::vector<scalar> s(50);
  std::vector<point> p(50);
  for (std::size_t i = 0; i < s.size(); ++i) {
    s[i] = i % 9 == 4 ? -scalar_from_u64(1) : random_scalar();
    p[i] = i % 11 == 6 ? identity() : random_point();
  }
  const point want = msm_reference(s, p);
  for (int c = 2; c <= 16; ++c) EXPECT_TRUE(detail::msm_with_window(s, p, c) == want) << "window " << c;
  EXPECT_THROW((void)detail::msm_with_window(s, p, 1), std::invalid_argument);
  EXPECT_TRUE(msm({}, {}) == identity());
  const std::vector<scalar> one{scalar_from_u64(1)};
  const std::vector<point> none;
  EXPECT_THROW((void)msm(one, none), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::federated::r255
