#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quantize.hpp"

namespace {

using namespace troupe::kernels::quant;

// The published construction written out independently: decade d in 0..6 holds the midpoints
// of n + 1 evenly spaced points of [0.1, 1] scaled by 10^(d-6), n = 2^d (signed, with their
// negatives) or 2^(d+1) (unsigned); then 0 and 1.
std::vector<float> published_map(bool is_signed) {
  std::vector<double> v{0.0, 1.0};
  const double decades[] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  for (int d = 0; d < 7; ++d) {
    const int n = is_signed ? 1 << d : 2 << d;
    for (int k = 0; k < n; ++k) {
      const double mid = 0.1 + (k + 0.5) * (0.9 / n);
      v.push_back(mid * decades[d]);
      if (is_signed) v.push_back(-mid * decades[d]);
    }
  }
  std::sort(v.begin(), v.end());
  return std::vector<float>(v.begin(), v.end());
}

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(QuantMap, EqualsThePublishedConstructionBitForBit) {
  for (bool s : {true, false}) {
    const auto& map = qmap::dynamic(s);
    const auto expect = published_map(s);
    ASSERT_EQ(expect.size(), 256u);
    for (int c = 0; c < 256; ++c) EXPECT_EQ(bits(map.value(c)), bits(expect[c])) << "signed " << s << " code " << c;
  }
}

TEST(QuantMap, IsSortedWithAnExactZeroAndOne) {
  for (bool s : {true, false}) {
    const auto& map = qmap::dynamic(s);
    for (int c = 1; c < 256; ++c) EXPECT_LT(map.value(c - 1), map.value(c));
    EXPECT_EQ(map.value(map.zero_code()), 0.0f);
    EXPECT_EQ(map.value(255), 1.0f);
    EXPECT_EQ(map.quantize(0.0f), map.zero_code());
    EXPECT_EQ(map.quantize(1.0f), 255);
  }
  // Signed: 127 negative entries, the most negative just short of -1 (the construction has +1
  // but no -1); unsigned: nothing below zero.
  EXPECT_EQ(qmap::dynamic(true).zero_code(), 127);
  EXPECT_NEAR(qmap::dynamic(true).value(0), -(1 - 0.45 / 64), 1e-7);
  EXPECT_EQ(qmap::dynamic(false).zero_code(), 0);
  EXPECT_EQ(qmap::dynamic(false).value(0), 0.0f);
}

TEST(QuantMap, FastQuantizerEqualsTheNearestEntrySearch) {
  std::mt19937 rng(7);
  for (bool s : {true, false}) {
    const auto& map = qmap::dynamic(s);
    std::vector<float> xs;
    // Adversarial: every entry, every decision point and its float neighbours, signed zeros,
    // tiny, subnormal and out-of-range values.
    for (int c = 0; c < 256; ++c) {
      for (float x : {map.value(c), map.above(c)}) {
        if (!std::isfinite(x)) continue;
        xs.push_back(x);
        xs.push_back(std::nextafter(x, 2.0f));
        xs.push_back(std::nextafter(x, -2.0f));
        xs.push_back(-x);
      }
    }
    for (float x : {0.0f, -0.0f, 1.0f, -1.0f, 1e-30f, -1e-30f, 1e-40f, 5.96e-8f, 1.6e-7f, 2.8e-7f, 1.0001f, -1.0001f,
                    3.0f, -3.0f, 1e30f, -1e30f, std::numeric_limits<float>::denorm_min()})
      xs.push_back(x);
    // Random: uniform in [-1, 1], log-uniform magnitudes, and random bit patterns of magnitude <= 2.
    std::uniform_real_distribution<float> u(-1, 1), e(-30, 0.5);
    std::uniform_int_distribution<std::uint32_t> b(0, 0x40000000u);
    for (int i = 0; i < 1'000'000; ++i) {
      xs.push_back(u(rng));
      xs.push_back((i & 1 ? -1 : 1) * std::pow(10.0f, e(rng)));
      std::uint32_t r = b(rng) | (i & 2 ? 0x80000000u : 0);
      float f;
      std::memcpy(&f, &r, 4);
      xs.push_back(f);
    }
    std::size_t bad = 0, bad_estimated = 0;
    for (float x : xs) {
      const auto want = map.quantize_reference(x);
      if (map.quantize(x) != want && ++bad < 5)
        ADD_FAILURE() << "signed " << s << " x " << x << ": fast " << int(map.quantize(x)) << " reference "
                      << int(want);
      if (map.quantize_estimated(x) != want && ++bad_estimated < 5)
        ADD_FAILURE() << "signed " << s << " x " << x << ": estimated " << int(map.quantize_estimated(x))
                      << " reference " << int(want);
    }
    EXPECT_EQ(bad, 0u);
    EXPECT_EQ(bad_estimated, 0u);
    // The block quantizer agrees too on every vector path the CPU has (AVX-512, AVX2, none),
    // with and without keep_nonzero, and so does the block dequantizer.
    const int top = limit_simd(2);
    for (bool keep : {false, true}) {
      block_options o;
      o.keep_nonzero = keep;
      std::vector<std::uint8_t> slow(xs.size());
      quantize_block_reference(xs.data(), xs.size(), 1.0f, map, o, 0, 0, slow.data());
      for (int level = simd_level(); level >= 0; --level) {
        limit_simd(level);
        std::vector<std::uint8_t> fast(xs.size());
        quantize_block(xs.data(), xs.size(), 1.0f, map, o, 0, 0, fast.data());
        EXPECT_TRUE(fast == slow) << "signed " << s << " keep_nonzero " << keep << " vector level " << level;
        std::vector<float> back(xs.size());
        dequantize_block(fast.data(), fast.size(), 0.5f, map, back.data());
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < xs.size(); ++i) wrong += back[i] != map.value(fast[i]) * 0.5f;
        EXPECT_EQ(wrong, 0u) << "vector level " << level;
      }
    }
    limit_simd(top);
  }
}

TEST(QuantMap, DequantizerGivesEveryCodesEntryAtEveryPosition) {
  // Every code at every position of a 64-code group (the AVX-512 dequantizer looks groups up by
  // byte permutes), then vectors of 16 and single values, on every vector path.
  const int top = limit_simd(2);
  for (bool s : {true, false}) {
    const qmap& map = qmap::dynamic(s);
    std::vector<std::uint8_t> codes(64 * 256 + 16 + 5);
    for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 7 + i / 64);
    for (int level = simd_level(); level >= 0; --level) {
      limit_simd(level);
      std::vector<float> out(codes.size());
      dequantize_block(codes.data(), codes.size(), 0.75f, map, out.data());
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < codes.size(); ++i) wrong += out[i] != map.value(codes[i]) * 0.75f;
      EXPECT_EQ(wrong, 0u) << "signed " << s << " vector level " << level;
    }
  }
  limit_simd(top);
}

TEST(QuantMap, VectorQuantizersEqualTheTableOnAFloatSweep) {
  // Every 61st float bit pattern of magnitude up to 2, both signs (about 35 million values),
  // through the block quantizer of each vector path, against the table quantizer (itself checked
  // against the nearest-entry search above).
  std::vector<float> xs;
  for (std::uint32_t b = 0; b <= 0x40000000u; b += 61) {
    float f;
    std::memcpy(&f, &b, 4);
    xs.push_back(f);
    xs.push_back(-f);
  }
  const int top = limit_simd(2);
  for (bool s : {true, false}) {
    const auto& map = qmap::dynamic(s);
    std::vector<std::uint8_t> want(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) want[i] = map.quantize(xs[i]);
    for (int level = simd_level(); level >= 1; --level) {
      limit_simd(level);
      block_options o;
      o.keep_nonzero = false;
      std::vector<std::uint8_t> got(xs.size());
      quantize_block(xs.data(), xs.size(), 1.0f, map, o, 0, 0, got.data());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < xs.size(); ++i)
        if (got[i] != want[i] && ++bad < 5)
          ADD_FAILURE() << "signed " << s << " level " << level << " x " << xs[i] << ": " << int(got[i])
                        << " table " << int(want[i]);
      EXPECT_EQ(bad, 0u) << "signed " << s << " vector level " << level;
    }
  }
  limit_simd(top);
}

TEST(QuantMap, TheEstimateIsSureForAlmostEveryValueAndRightWhenSure) {
  // The AVX-512 quantizer sends the lanes it is not sure of to the table; that must stay rare
  // (or the fast path is the table in disguise), zeros must never need it (sparse moments), and
  // a sure estimate must be the nearest entry (with keep_nonzero's rule when asked).
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1), e(-9, 0);
  for (bool s : {true, false}) {
    const auto& map = qmap::dynamic(s);
    for (bool keep : {false, true}) {
      for (float z : {0.0f, -0.0f}) EXPECT_TRUE(map.estimate(z, keep).sure) << "signed " << s;
      std::size_t unsure = 0, wrong = 0, n = 0;
      for (int i = 0; i < 400'000; ++i) {
        const float x = i % 2 ? u(rng) : (i % 4 == 0 ? 1 : -1) * std::pow(10.0f, e(rng));
        const auto r = map.estimate(x, keep);
        ++n;
        if (!r.sure) {
          ++unsure;
          continue;
        }
        int want = map.quantize_reference(x);
        if (keep && want == map.zero_code() && x != 0.0f) want += x > 0 ? 1 : (s && want > 0 ? -1 : 0);
        if (r.code != want && ++wrong < 5)
          ADD_FAILURE() << "signed " << s << " keep " << keep << " x " << x << ": " << r.code << " want " << want;
      }
      EXPECT_EQ(wrong, 0u);
      EXPECT_LT(unsure, n / 200) << "signed " << s << " keep " << keep;  // measured: 1 in 12,000-29,000
      EXPECT_GT(unsure, 0u) << "no value near a decision point in " << n << " draws";
    }
  }
}

TEST(QuantMap, TiesGoToTheLowerCode) {
  const auto& map = qmap::dynamic(false);
  // 0.5 * (v[1] + v[2]) is a float for these entries when exactly representable; check by search.
  for (int c = 0; c < 255; ++c) {
    const double mid = (double(map.value(c)) + double(map.value(c + 1))) / 2;
    if (double(float(mid)) != mid) continue;
    EXPECT_EQ(map.quantize(float(mid)), c);
    EXPECT_EQ(map.quantize(std::nextafter(float(mid), 2.0f)), c + 1);
  }
}

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float scale = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

TEST(Blockwise, RoundTripsWithinHalfAStepOfTheMap) {
  for (std::size_t block : {256u, 2048u, 100u}) {
    auto x = random_values(10'000, 3, 0.01f);
    block_options o;
    o.block = block;
    const auto& map = qmap::dynamic(true);
    std::vector<std::uint8_t> codes(x.size());
    std::vector<float> scales((x.size() + block - 1) / block), y(x.size());
    quantize_blockwise(x.data(), x.size(), map, o, 0, codes.data(), scales.data());
    dequantize_blockwise(codes.data(), scales.data(), x.size(), block, map, y.data());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float s = scales[i / block];
      const std::uint8_t c = codes[i];
      // y is an entry of the map next to x / s: x lies between the neighbours of c.
      const float lo = c > 0 ? map.value(c - 1) * s : -s, hi = c < 255 ? map.value(c + 1) * s : s;
      ASSERT_LE(lo, x[i]) << i;
      ASSERT_GE(hi, x[i]) << i;
      ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i])) << "sign kept at " << i;
    }
    // The scale of each block is its absmax.
    for (std::size_t k = 0; k < scales.size(); ++k) {
      float m = 0;
      for (std::size_t i = k * block; i < std::min(x.size(), (k + 1) * block); ++i) m = std::max(m, std::fabs(x[i]));
      EXPECT_EQ(scales[k], m);
    }
  }
}

TEST(Blockwise, ZerosStayExactlyZeroAndTinyValuesKeepTheirSign) {
  std::vector<float> x(512, 0.0f);
  x[3] = 1.0f;
  x[4] = 1e-9f;
  x[5] = -1e-9f;
  x[300] = -0.0f;
  const auto& map = qmap::dynamic(true);
  block_options o;
  std::vector<std::uint8_t> codes(x.size());
  std::vector<float> scales(2), y(x.size());
  quantize_blockwise(x.data(), x.size(), map, o, 0, codes.data(), scales.data());
  dequantize_blockwise(codes.data(), scales.data(), x.size(), 256, map, y.data());
  EXPECT_EQ(scales[1], 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i)
    if (i != 3 && i != 4 && i != 5) {
      EXPECT_EQ(y[i], 0.0f) << i;
    }
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_GT(y[4], 0.0f);
  EXPECT_LT(y[5], 0.0f);
  EXPECT_EQ(codes[4], map.zero_code() + 1);
  EXPECT_EQ(codes[5], map.zero_code() - 1);
}

TEST(Blockwise, FastBlocksEqualTheReferenceWithEveryOption) {
  // Every vector path (AVX-512 and AVX2, stochastic rounding too) against the linear search, on random
  // values and on the hard ones: map entries themselves (no draw), their neighbours and the
  // midpoints between entries, zeros of both signs, subnormals, and values beyond the scale.
  struct restore {
    int cap;
    ~restore() { limit_simd(cap); }
  } guard{limit_simd(2)};
  for (bool s : {true, false}) {
    const auto& map = qmap::dynamic(s);
    auto x = random_values(4096, 9, 3.0f);
    x[17] = 40.0f;  // an outlier for the percentile scale
    for (int c = 0; c < 256; ++c) {
      const float v = map.value(static_cast<std::uint8_t>(c)) * 3.0f;
      x.push_back(v);
      x.push_back(std::nextafter(v, 10.0f));
      x.push_back(std::nextafter(v, -10.0f));
      if (c < 255) x.push_back((map.value(static_cast<std::uint8_t>(c)) + map.value(static_cast<std::uint8_t>(c + 1))) * 1.5f);
    }
    for (float v : {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                    1e-30f, -1e-30f, 2.9f, -2.9f, 3.0f, -3.0f})
      x.push_back(v);
    if (!s)
      for (auto& v : x) v = std::fabs(v);
    for (int level = simd_level(); level >= 0; --level) {
      limit_simd(level);
      for (int variant = 0; variant < 6; ++variant) {
        block_options o;
        o.stochastic = variant & 1;
        o.keep_nonzero = variant & 2;
        o.percentile = variant >= 4 ? 99.0 : 0.0;
        for (std::size_t b = 0; b < x.size(); b += 256) {
          const std::size_t n = std::min<std::size_t>(256, x.size() - b);
          const float scale = b == 0 || variant >= 4 ? block_scale(x.data() + b, n, o.percentile) : 3.0f;
          std::vector<std::uint8_t> fast(n), ref(n);
          quantize_block(x.data() + b, n, scale, map, o, 1234, static_cast<std::uint32_t>(b), fast.data());
          quantize_block_reference(x.data() + b, n, scale, map, o, 1234, static_cast<std::uint32_t>(b), ref.data());
          ASSERT_EQ(fast, ref) << "signed " << s << " variant " << variant << " level " << level << " block at " << b;
        }
      }
    }
  }
}

TEST(Blockwise, PercentileScaleIgnoresAnOutlier) {
  auto x = random_values(256, 4, 1.0f);
  x[10] = 1000.0f;
  EXPECT_EQ(block_scale(x.data(), x.size(), 0), 1000.0f);
  const float p = block_scale(x.data(), x.size(), 99.0);
  EXPECT_LT(p, 5.0f);
  EXPECT_GT(p, 1.0f);
}

TEST(Blockwise, PercentileScaleIsTheRankedMagnitude) {
  // The scale by percentile p of n values is the ceil(p / 100 * n)-th smallest |x| (the absmax
  // when that is 0), whichever way it is found (on every vector path the CPU has): sizes,
  // percentiles and ties that take the selection of the few largest, the absmax shortcut and the
  // full selection.
  struct restore {
    int cap;
    ~restore() { limit_simd(cap); }
  } guard{limit_simd(2)};
  const int top = simd_level();
  std::mt19937 rng(8);
  for (std::size_t n : {1u, 2u, 17u, 256u, 2048u, 5000u}) {
    for (double p : {10.0, 50.0, 90.0, 98.8, 99.0, 99.5, 99.9, 99.99}) {
      // ties 2: magnitudes that grow along the block, so that every vector has lanes that enter
      // the few largest kept; 3: the largest all in one lane (every 16th value), taken off it
      // one after another.
      for (int ties = 0; ties < 4; ++ties) {
        std::vector<float> x(n);
        std::uniform_int_distribution<int> small(-3, 3);
        std::normal_distribution<float> normal(0, 1);
        for (std::size_t i = 0; i < n; ++i)
          x[i] = ties == 3   ? (i % 16 == 3 ? 100.0f + static_cast<float>(i) : normal(rng))
                 : ties == 2 ? static_cast<float>(i) * (i % 3 ? 1.0f : -1.0f)
                 : ties      ? static_cast<float>(small(rng))
                             : normal(rng);
        std::vector<float> sorted(n);
        for (std::size_t i = 0; i < n; ++i) sorted[i] = std::fabs(x[i]);
        std::sort(sorted.begin(), sorted.end());
        const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(n)));
        const float want = sorted[std::min(n - 1, rank == 0 ? 0 : rank - 1)];
        for (int level = top; level >= 0; --level) {
          limit_simd(level);
          EXPECT_EQ(block_scale(x.data(), n, p), want > 0 ? want : sorted.back())
              << "n " << n << ", percentile " << p << ", ties " << ties << ", level " << level;
        }
      }
    }
  }
}

TEST(Blockwise, StochasticRoundingIsUnbiasedAndDeterministic) {
  const auto& map = qmap::dynamic(false);
  // A value a third of the way between two entries rounds up a third of the time.
  const float a = map.value(200), b = map.value(201), x = a + (b - a) / 3;
  block_options o;
  o.stochastic = true;
  std::vector<float> xs(100'000, x);
  std::vector<std::uint8_t> codes(xs.size()), again(xs.size());
  quantize_block(xs.data(), xs.size(), 1.0f, map, o, 99, 0, codes.data());
  quantize_block(xs.data(), xs.size(), 1.0f, map, o, 99, 0, again.data());
  EXPECT_EQ(codes, again);
  double ups = 0;
  for (auto c : codes) {
    ASSERT_TRUE(c == 200 || c == 201);
    ups += c == 201;
  }
  EXPECT_NEAR(ups / xs.size(), 1.0 / 3, 0.01);
  // Another key draws other bits.
  quantize_block(xs.data(), xs.size(), 1.0f, map, o, random_key(1, 2, 3, 4), 0, again.data());
  EXPECT_NE(codes, again);
}

TEST(Bf16, StochasticRoundingOfManyValuesEqualsOneAtATime) {
  // The array form (16 lanes with AVX-512) against the scalar rule, at every vector level, on
  // random values and on the edges: the largest finite values (never rounded up into infinity),
  // infinities, NaN, zeros of both signs and subnormals.
  struct restore {
    int cap;
    ~restore() { limit_simd(cap); }
  } guard{limit_simd(2)};
  auto x = random_values(1000, 3, 5.0f);
  for (float v : {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, std::numeric_limits<float>::denorm_min(),
                  -std::numeric_limits<float>::min()})
    x.insert(x.begin() + 5, 20, v);
  for (int level = simd_level(); level >= 0; --level) {
    limit_simd(level);
    std::vector<std::uint16_t> many(x.size());
    to_bf16_stochastic(x.data(), x.size(), 77, 1000, many.data());
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(many[i], to_bf16_stochastic(x[i], random_bits(77, 1000 + static_cast<std::uint32_t>(i))))
          << "value " << x[i] << " at " << i << ", level " << level;
  }
}

TEST(Bf16, RoundsToNearestEvenAndStochasticallyWithoutBias) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 0x1p-8f)), 1.0f);                     // tie: to even (down)
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);       // tie: to even (up)
  EXPECT_EQ(from_bf16(to_bf16(-(1.0f + 0x1p-7f + 0x1p-9f))), -(1.0f + 0x1p-7f));
  const float x = 1.0f + 0x1p-7f / 4;  // a quarter of a bf16 step above 1
  double sum = 0;
  for (std::uint32_t i = 0; i < 100'000; ++i) sum += from_bf16(to_bf16_stochastic(x, random_bits(5, i)));
  EXPECT_NEAR(sum / 100'000, x, 0x1p-7 * 0.01);
  double neg = 0;
  for (std::uint32_t i = 0; i < 100'000; ++i) neg += from_bf16(to_bf16_stochastic(-x, random_bits(6, i)));
  EXPECT_NEAR(neg / 100'000, -x, 0x1p-7 * 0.01);
  EXPECT_EQ(from_bf16(to_bf16_stochastic(std::numeric_limits<float>::max(), 0xffffffffu)),
            from_bf16(0x7f7f));
}

}  // namespace
