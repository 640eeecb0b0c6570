#include "quantize.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "quantize_avx2.hpp"
#include "quantize_avx512.hpp"

namespace troupe::kernels::quant {

namespace {

int cpu_simd_level() noexcept {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi"))
    return 2;
  return __builtin_cpu_supports("avx2") ? 1 : 0;
}

/// The CPU's level, capped by TROUPE_SIMD (avx512, avx2 or none) to compare the paths on one machine.
int capped_cpu_level() noexcept {
  const int cpu = cpu_simd_level();
  const char* env = std::getenv("TROUPE_SIMD");
  if (env == nullptr || *env == '\0') return cpu;
  const std::string want = env;
  const int cap = want == "avx512" ? 2 : want == "avx2" ? 1 : want == "none" ? 0 : -1;
  if (cap < 0) {
    std::fprintf(stderr, "troupe: TROUPE_SIMD=%s is not one of avx512, avx2, none; using the CPU's vectors\n", env);
    return cpu;
  }
  return std::min(cpu, cap);
}

std::atomic<int> simd_cap{2};

}  // namespace

int simd_level() noexcept {
  static const int cpu = capped_cpu_level();
  return std::min(cpu, simd_cap.load(std::memory_order_relaxed));
}

int limit_simd(int level) noexcept { return simd_cap.exchange(level); }

std::array<double, 256> qmap::construct(bool is_signed) {
  constexpr int exponent_bits = 7;
  std::vector<double> data;
  for (int i = 0; i < exponent_bits; ++i) {
    const int means = is_signed ? (1 << i) : (1 << (i + 1));
    const double decade = std::pow(10.0, i - (exponent_bits - 1));
    const double step = 0.9 / means;  // n + 1 evenly spaced boundaries in [0.1, 1]
    for (int k = 0; k < means; ++k) {
      const double lo = 0.1 + step * k, hi = k + 1 == means ? 1.0 : 0.1 + step * (k + 1);
      const double v = decade * ((lo + hi) / 2);
      data.push_back(v);
      if (is_signed) data.push_back(-v);
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  if (data.size() != 256) throw std::logic_error("dynamic map: " + std::to_string(data.size()) + " entries");
  std::sort(data.begin(), data.end());
  std::array<double, 256> out;
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

std::uint8_t qmap::quantize_reference(float x) const noexcept {
  // Beyond the ends the nearest entry is the end one; clamping first keeps the distances below
  // exact in double.
  x = std::clamp(x, values_[0], values_[255]);
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    const double d = std::fabs(static_cast<double>(x) - static_cast<double>(values_[c]));
    if (d < best_d) {  // strict: ties keep the lower code
      best_d = d;
      best = c;
    }
  }
  return static_cast<std::uint8_t>(best);
}

qmap::qmap(bool is_signed) : signed_(is_signed) {
  const auto exact = construct(is_signed);
  for (int c = 0; c < 256; ++c) {
    values_[c] = static_cast<float>(exact[c]);
    if (values_[c] == 0.0f) zero_code_ = static_cast<std::uint8_t>(c);
  }
  // The entries rise strictly (the nearest-entry search and the pairs rely on it).
  for (int c = 0; c < 256; ++c) {
    if (c < 255 && !(values_[c] < values_[c + 1]))
      throw std::logic_error("quantization map: entries " + std::to_string(c) + " and " + std::to_string(c + 1) +
                             " do not rise");
    std::uint32_t lo, hi;
    std::memcpy(&lo, &values_[c], 4);
    std::memcpy(&hi, &values_[c < 255 ? c + 1 : c], 4);
    pairs_[c] = lo | (std::uint64_t{hi} << 32);
    for (int k = 0; k < 4; ++k) planes_[256 * k + c] = static_cast<std::uint8_t>(lo >> (8 * k));
  }
  // The decision point between c and c + 1 is their midpoint (exact in double); x > midpoint
  // <=> x > (the largest float not above it).
  for (int c = 0; c < 255; ++c) {
    const double mid = (static_cast<double>(values_[c]) + static_cast<double>(values_[c + 1])) / 2;
    float f = static_cast<float>(mid);
    if (static_cast<double>(f) > mid) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
    above_[c] = f;
  }
  above_[255] = std::numeric_limits<float>::infinity();
  build_estimate();

  // One bucket per (sign, clamped magnitude >> shift). A bucket's candidate is the code of its
  // lowest value; check that its highest value is at most one code further.
  lut_.resize(2 * buckets);
  packed_.resize(2 * buckets);
  auto from_bits = [](std::uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  for (std::uint32_t sign = 0; sign < 2; ++sign) {
    for (std::uint32_t j = 0; j < buckets; ++j) {
      const float lo = j == 0 ? 0.0f : from_bits(lo_bits + (j << shift));
      const float hi = j + 1 == buckets ? std::numeric_limits<float>::max()
                                        : from_bits(lo_bits + ((j + 1) << shift) - 1);
      const float lowest = sign ? -hi : lo, highest = sign ? -lo : hi;
      const std::uint8_t c = quantize_reference(lowest), top = quantize_reference(highest);
      if (top > c + 1)
        throw std::logic_error("quantization table: bucket " + std::to_string(j) + " spans codes " +
                               std::to_string(c) + ".." + std::to_string(top));
      lut_[sign * buckets + j] = c;
      // The decision point above c as an offset into this bucket's magnitudes.
      std::int32_t offset = sign ? 0 : 65536;
      if (top != c) {
        if (j == 0 || j + 1 == buckets)
          throw std::logic_error("quantization table: a clamped bucket holds a decision point");
        const float t = above_[c];
        std::uint32_t tb;
        std::memcpy(&tb, &t, 4);
        const std::uint32_t start = lo_bits + (j << shift);
        // Positive: x > t <=> magnitude bits > bits(t). Negative: x > t <=> magnitude bits < bits(|t|).
        offset = static_cast<std::int32_t>((tb & 0x7fffffffu) - start);
        if (offset < 0 || offset > 65535 || (sign != 0) != (t < 0))
          throw std::logic_error("quantization table: decision point outside bucket " + std::to_string(j));
      }
      packed_[sign * buckets + j] = static_cast<std::int32_t>(c) | (offset << 8);
    }
  }
}

void qmap::build_estimate() {
  // Magnitude indices: 0 the zero entry, 1.. the positive entries in order, top the entry 1.
  // Decision j lies between indices j and j + 1: a positive x goes up when x > above(zero + j),
  // a negative one when |x| >= -above(zero - j - 1) (ties go to the lower code, which is the
  // larger magnitude below zero).
  constexpr int decades = 7;
  const int zero = zero_code_;
  const int top = 255 - zero;
  const float inf = std::numeric_limits<float>::infinity();
  auto up = [&](float f) { return std::nextafter(f, inf); };
  auto down = [&](float f) { return std::nextafter(f, -inf); };
  auto fail = [](const std::string& why) { throw std::logic_error("quantization estimate: " + why); };
  // Pieces: 0 the zero entry, d + 1 decade d, 8 the entry 1. Piece q > 0 starts at decision
  // start[q] - 1, at magnitude start_at[q]; on a tie a negative x's start is one ulp lower (that
  // one magnitude is left to the table: the proof checks that the estimate is not sure of it).
  std::array<int, 9> start{};
  std::array<float, 9> start_at{};
  std::array<bool, 9> tie{};
  const float margin = estimate_margin;
  for (auto* table : {&piece_scale_[0], &piece_scale_[1]}) table->fill(0.0f);
  for (auto* table : {&piece_offset_[0], &piece_offset_[1]}) table->fill(0.5f);
  for (auto* table : {&piece_limit_[0], &piece_limit_[1]}) table->fill(0);
  int base = 1;
  for (int q = 1; q <= decades + 1; ++q) {
    const int d = q - 1;
    const int n = q > decades ? 1 : (signed_ ? (1 << d) : (2 << d));
    start[q] = base;
    const float p = above_[zero + base - 1];
    start_at[q] = up(p);
    if (signed_ && base <= zero) {
      const float neg = -above_[zero - base];
      if (neg == p) tie[q] = true;
      else if (neg != up(p)) fail("decision " + std::to_string(base - 1) + " is not mirrored");
    }
    for (int kv = 0; kv < 2; ++kv) {
      if (q > decades) {
        piece_offset_[kv][q] = static_cast<float>(top) + 0.5f;
        piece_limit_[kv][q] = top;
      } else {
        // t = base + (a / unit - 0.1) * n / 0.9: whole at the midpoints between the decade's entries.
        const double unit = std::pow(10.0, d - (decades - 1));
        piece_scale_[kv][q] = static_cast<float>(n / (0.9 * unit));
        piece_offset_[kv][q] = static_cast<float>(base - 0.1 * n / 0.9);
        piece_limit_[kv][q] = base + n - 1;
      }
    }
    base += n;
  }
  if (base != top + 1) fail("the pieces hold " + std::to_string(base) + " entries");
  // The zero piece: index 0, with t from 0.5 at zero to 1 at the first decision point (so that a
  // negative x on a tie there is not sure); with keep_nonzero index 1 (estimate() caps it at 0
  // for a zero).
  piece_scale_[0][0] = static_cast<float>(0.5 / static_cast<double>(above_[zero]));
  piece_offset_[1][0] = 1.5f;
  piece_limit_[1][0] = 1;
  for (std::uint32_t s = 0; s < 16; ++s) {
    // Slot s: the two binades [lo, hi) from est_floor * 4^s; slot 0 also holds everything smaller.
    const float lo = s == 0 ? 0.0f : std::ldexp(est_floor, 2 * static_cast<int>(s));
    const float hi = std::ldexp(est_floor, 2 * static_cast<int>(s) + 2);
    int q = 0;
    while (q < decades + 1 && start_at[q + 1] <= lo) ++q;
    exponent_piece_[s] = q;
    exponent_threshold_[s] = inf;
    if (q < decades + 1 && start_at[q + 1] < hi) {
      if (q + 1 < decades + 1 && start_at[q + 2] < hi) fail("two pieces start in one slot");
      exponent_threshold_[s] = start_at[q + 1];
    }
  }
  // The fine form (estimate()): scale times 2^16, offset times 2^16 plus 4, limit << 16 | 0xffff,
  // all exact (an offset is below 256).
  for (int kv = 0; kv < 2; ++kv) {
    for (int q = 0; q < 16; ++q) {
      const float offset = piece_offset_[kv][q];
      piece_scale_[kv][q] *= fine_unit;
      piece_offset_[kv][q] = offset * fine_unit + fine_bias;
      if (static_cast<double>(piece_offset_[kv][q]) != static_cast<double>(offset) * fine_unit + fine_bias)
        fail("piece " + std::to_string(q) + "'s offset is not exact in the fine form");
      piece_limit_[kv][q] = piece_limit_[kv][q] * 65536 + 65535;
    }
  }
  // Magnitudes from 1 up to 2 (a scaled moment a little over 1, which the AVX-512 kernels do not
  // clamp) share the last slot and its piece, the entry 1.
  if (slot(1.0f) != 15 || slot(std::nextafter(2.0f, 0.0f)) != 15 || exponent_piece_[15] + 1 != decades + 1 ||
      !(exponent_threshold_[15] <= 1.0f))
    fail("magnitudes from 1 to 2 are not in the last piece");
  // The proof: t grows with a inside a piece, so the estimate is exact for every float when, at
  // every decision inside a piece, t is below K + margin at the largest magnitude of index j
  // and above K - margin at the smallest of index j + 1 (K = j + 1), both in that piece; when
  // every piece starts where it should for both signs; and when t at a piece's start is at
  // least its first index plus the margin. Magnitudes of a negative x are checked through -a.
  auto piece_of = [&](float x) {
    const float a = std::min(std::fabs(x), 1.0f);
    const std::uint32_t e = slot(a);
    return exponent_piece_[e] + (a >= exponent_threshold_[e] ? 1 : 0);
  };
  // t from the fine form, exactly (w < 2^24, so w - 4 and the power-of-two scaling are exact); a
  // magnitude is sure when W's sure_bits are not all zero, i.e. when t's fraction is in
  // [margin, 1 - margin).
  auto w_of = [&](float a, int q) { return std::fma(a, piece_scale_[0][q], piece_offset_[0][q]); };
  auto t_of = [&](float a, int q) { return (w_of(a, q) - fine_bias) / fine_unit; };
  auto sure_at = [&](float a, int q) { return (static_cast<std::uint32_t>(w_of(a, q)) & sure_bits) != 0; };
  for (int sign = 0; sign < (signed_ ? 2 : 1); ++sign) {
    for (int j = 0; j < top; ++j) {
      if (sign == 1 && j >= zero) break;  // no negative entry beyond -above(0)
      // Largest magnitude of index j and smallest of index j + 1, as signed values.
      const float hi_mag = sign == 0 ? up(above_[zero + j]) : -above_[zero - j - 1];
      const float lo_mag = down(hi_mag);
      const float x_lo = sign == 0 ? lo_mag : -lo_mag, x_hi = sign == 0 ? hi_mag : -hi_mag;
      int q_start = 0;
      while (q_start < decades + 1 && start[q_start + 1] <= j + 1) ++q_start;
      if (sign == 1 && tie[q_start] && start[q_start] == j + 1) {
        // A tie at a piece start: the negative x lands in the piece below, at the end of its
        // last entry's two units, and must not be sure there (the table breaks the tie).
        if (piece_of(x_hi) != q_start - 1 || sure_at(hi_mag, q_start - 1))
          fail("the tie at piece " + std::to_string(q_start) + " is sure");
        continue;
      }
      const int q = piece_of(x_hi);
      if (q != q_start) fail("decision " + std::to_string(j) + " falls in piece " + std::to_string(q));
      if (start[q] == j + 1) {
        if (piece_of(x_lo) != q - 1) fail("piece " + std::to_string(q) + " starts late");
        if (q <= decades && !(t_of(hi_mag, q) >= static_cast<float>(j + 1) + margin))
          fail("piece " + std::to_string(q) + " starts below its first index");
        continue;
      }
      const float k = static_cast<float>(j + 1);
      if (piece_of(x_lo) != q || !(t_of(lo_mag, q) < k + margin) || !(t_of(hi_mag, q) > k - margin))
        fail("decision " + std::to_string(j) + " outside the margin");
    }
  }
  // And the estimate agrees with the search at these points (keep_nonzero both ways).
  for (int c = 0; c < 256; ++c) {
    for (float x : {values_[c], above_[c], up(above_[c]), down(above_[c]), -above_[c], -up(above_[c])}) {
      if (!std::isfinite(x)) continue;
      for (bool keep : {false, true}) {
        const estimated r = estimate(x, keep);
        int want = quantize_reference(x);
        if (keep && want == zero && x != 0.0f) want += x > 0.0f ? 1 : (signed_ && want > 0 ? -1 : 0);
        if (r.sure && r.code != want) fail(std::to_string(r.code) + " for code " + std::to_string(want));
      }
    }
  }
}

const qmap& qmap::dynamic(bool is_signed) {
  static const qmap s(true), u(false);
  return is_signed ? s : u;
}

std::uint32_t random_key(std::uint64_t seed, std::uint64_t step, std::uint64_t tensor, std::uint64_t moment) noexcept {
  // splitmix64 over the four counters, folded to 32 bits.
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const std::uint64_t h = mix(mix(mix(mix(seed) ^ step) ^ tensor) ^ moment);
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

namespace {

// AVX2: the table quantizer (nearest codes, stochastic rounding), bf16 stochastic rounding, the
// dequantizer and the absmax, the same operations as the scalar twins on 8 lanes, so the same
// results. Chosen at run time; the AVX-512 quantizer comes first (quantize_avx512.hpp:
// arithmetic and registers instead of the table).

/// The nearest codes of 8 normalized values by the table (qmap::quantize on 8 lanes, one table lookup),
/// in 32-bit lanes; keep_nonzero is not applied.
/// `packed`: map.packed(), passed in so that the loop does not reload it after every byte store.
TROUPE_AVX2 inline __m256i nearest_codes_avx2(const std::int32_t* packed, __m256 xn) noexcept {
  const __m256i lo = _mm256_set1_epi32(static_cast<int>(qmap::lo_bits));
  const __m256i b = _mm256_castps_si256(xn);
  __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  a = _mm256_min_epi32(_mm256_max_epi32(a, lo), _mm256_set1_epi32(static_cast<int>(qmap::hi_bits)));
  const __m256i rel = _mm256_sub_epi32(a, lo);
  const __m256i idx = _mm256_add_epi32(_mm256_srli_epi32(rel, qmap::shift),
                                       _mm256_mullo_epi32(_mm256_srli_epi32(b, 31),
                                                          _mm256_set1_epi32(static_cast<int>(qmap::buckets))));
  const __m256i entry = avx2::lookup(packed, idx);
  const __m256i c = _mm256_and_si256(entry, _mm256_set1_epi32(0xff));
  const __m256i offset = _mm256_srli_epi32(entry, 8);
  const __m256i lowbits = _mm256_and_si256(rel, _mm256_set1_epi32(0xffff));
  // Next code: low bits above the offset (positive x) or below it (negative x).
  const __m256i up = _mm256_blendv_epi8(_mm256_cmpgt_epi32(lowbits, offset), _mm256_cmpgt_epi32(offset, lowbits),
                                        _mm256_srai_epi32(b, 31));
  return _mm256_sub_epi32(c, up);
}

/// keep_nonzero on 8 codes c of the values xn (when `keep`): a nonzero value on the zero code
/// (`zero`, the map's in every lane) moves one code toward its sign (never below code 0).
TROUPE_AVX2 inline __m256i keep_nonzero_avx2(__m256i c, __m256 xn, __m256i zero, bool keep) noexcept {
  if (!keep) return c;
  const __m256i at_zero = _mm256_cmpeq_epi32(c, zero);
  if (_mm256_testz_si256(at_zero, at_zero)) return c;  // no lane on the zero code: the common case
  const __m256i pos = _mm256_castps_si256(_mm256_cmp_ps(xn, _mm256_setzero_ps(), _CMP_GT_OQ));
  const __m256i neg = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(xn, _mm256_setzero_ps(), _CMP_LT_OQ)),
                                       _mm256_cmpgt_epi32(c, _mm256_setzero_si256()));
  c = _mm256_sub_epi32(c, _mm256_and_si256(at_zero, pos));  // +1
  return _mm256_add_epi32(c, _mm256_and_si256(at_zero, neg));  // -1
}

/// Stores 8 codes (0..255 in 32-bit lanes) as bytes.
TROUPE_AVX2 inline void store_codes_avx2(std::uint8_t* out, __m256i c) noexcept {
  // Two unsigned packs leave codes 0-3 in the low lane's first 4 bytes and 4-7 in the high lane's.
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(c, c), _mm256_setzero_si256());
  const auto low = static_cast<std::uint32_t>(_mm256_cvtsi256_si32(bytes));
  const auto high = static_cast<std::uint32_t>(_mm256_extract_epi32(bytes, 4));
  std::memcpy(out, &low, 4);
  std::memcpy(out + 4, &high, 4);
}

/// Stores 32 codes (0..255 in the 32-bit lanes of c[0..3], in order) as bytes: three packs and
/// one permute instead of four times store_codes_avx2's four operations.
TROUPE_AVX2 inline void store_codes32_avx2(std::uint8_t* out, const __m256i (&c)[4]) noexcept {
  // Each 128-bit lane of the bytes holds four codes of each vector: c0 0-3, c1 0-3, c2 0-3,
  // c3 0-3 | c0 4-7, c1 4-7, c2 4-7, c3 4-7.
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/// The nearest codes on 8 lanes (one table lookup), with keep_nonzero when Keep.
template <bool Keep>
TROUPE_AVX2 std::size_t quantize_avx2(const float* x, std::size_t n, float inv, const qmap& map,
                                      std::uint8_t* codes) noexcept {
  constexpr bool keep = Keep;
  const __m256 vinv = _mm256_set1_ps(inv);
  const std::int32_t* packed = map.packed();
  const __m256i zero = _mm256_set1_epi32(map.zero_code());
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i c[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256 xn = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), vinv);
      c[k] = keep_nonzero_avx2(nearest_codes_avx2(packed, xn), xn, zero, keep);
    }
    store_codes32_avx2(codes + i, c);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 xn = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
    store_codes_avx2(codes + i, keep_nonzero_avx2(nearest_codes_avx2(packed, xn), xn, zero, keep));
  }
  return i;
}

/// Stochastic rounding on 8 lanes, as finish(): from the nearest code c, the pair of entries
/// around xn (c and the next one above or below), then the draw between them.
TROUPE_AVX2 std::size_t quantize_stochastic_avx2(const float* x, std::size_t n, float inv, const qmap& map,
                                                 bool keep, std::uint32_t key, std::uint32_t first,
                                                 std::uint8_t* codes) noexcept {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i vkey = _mm256_set1_epi32(static_cast<int>(key));
  const __m256i none = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);
  const __m256i zero = _mm256_set1_epi32(map.zero_code());
  const std::int32_t* packed = map.packed();
  const float* values = map.values();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xn = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
    const __m256i c = nearest_codes_avx2(packed, xn);
    const __m256 vc = avx2::lookup(values, c);
    const __m256i above = _mm256_castps_si256(_mm256_cmp_ps(xn, vc, _CMP_GT_OQ));
    const __m256i below = _mm256_castps_si256(_mm256_cmp_ps(xn, vc, _CMP_LT_OQ));
    // A pair where finish() has one: above and not the last code, or below and not the first.
    const __m256i pair = _mm256_or_si256(_mm256_andnot_si256(_mm256_cmpeq_epi32(c, top), above),
                                         _mm256_andnot_si256(_mm256_cmpeq_epi32(c, none), below));
    const __m256i lo = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(c, below), none), _mm256_set1_epi32(254));
    const __m256 va = avx2::lookup(values, lo);
    const __m256 vb = avx2::lookup(values + 1, lo);
    const __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(avx2::random_bits(vkey, first + static_cast<std::uint32_t>(i)), 8)),
                                   _mm256_set1_ps(0x1p-24f));
    const __m256i take_hi = _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_sub_ps(xn, va), _mm256_mul_ps(r, _mm256_sub_ps(vb, va)), _CMP_GT_OQ));
    const __m256i drawn = _mm256_sub_epi32(lo, take_hi);  // lo + 1 where taken
    store_codes_avx2(codes + i, keep_nonzero_avx2(_mm256_blendv_epi8(c, drawn, pair), xn, zero, keep));
  }
  return i;
}

/// quant::to_bf16_stochastic on 8 lanes.
TROUPE_AVX2 std::size_t bf16_stochastic_avx2(const float* x, std::size_t n, std::uint32_t key, std::uint32_t first,
                                             std::uint16_t* out) noexcept {
  const __m256i vkey = _mm256_set1_epi32(static_cast<int>(key));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     avx2::bf16_stochastic(_mm256_loadu_ps(x + i), avx2::random_bits(vkey, first + static_cast<std::uint32_t>(i))));
  return i;
}

__attribute__((target("avx2"))) std::size_t dequantize_avx2(const std::uint8_t* codes, std::size_t n, float scale,
                                                             const float* values, float* out) noexcept {
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(avx2::decode8(values, codes + i), s));
  }
  return i;
}

template <bool Signed>
TROUPE_AVX512 std::size_t quantize_avx512(const float* x, std::size_t n, float inv, const qmap& map, bool keep,
                                          std::uint8_t* codes) noexcept {
  const avx512::quantizer q = avx512::load_quantizer(map, keep);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) avx512::store_exact_codes<Signed>(codes + i, q, map, x + i, inv, keep);
  return i;
}

/// Stochastic rounding on 16 lanes (avx512::stochastic_codes), then bytes.
template <bool Signed>
TROUPE_AVX512 std::size_t quantize_stochastic_avx512(const float* x, std::size_t n, float inv, const qmap& map,
                                                     bool keep, std::uint32_t key, std::uint32_t first,
                                                     std::uint8_t* codes) noexcept {
  const avx512::quantizer q = avx512::load_quantizer(map, false);
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i vkey = _mm512_set1_epi32(static_cast<int>(key));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 xn = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
    const __m512i c = avx512::stochastic_codes<Signed>(q, map, xn, vkey, first + static_cast<std::uint32_t>(i), keep);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(c));
  }
  return i;
}

/// quant::to_bf16_stochastic on 16 lanes.
TROUPE_AVX512 std::size_t bf16_stochastic_avx512(const float* x, std::size_t n, std::uint32_t key, std::uint32_t first,
                                                 std::uint16_t* out) noexcept {
  const __m512i vkey = _mm512_set1_epi32(static_cast<int>(key));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        avx512::bf16_stochastic(_mm512_loadu_ps(x + i), avx512::random_bits(vkey, first + static_cast<std::uint32_t>(i))));
  return i;
}

TROUPE_AVX512 std::size_t dequantize_avx512(const std::uint8_t* codes, std::size_t n,
                                                                 float scale, const qmap& map,
                                                                 float* out) noexcept {
  const __m512 s = _mm512_set1_ps(scale);
  const float* values = map.values();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 v[4];
    avx512::decode64(map.planes(), codes + i, s, v);
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + i + 16 * j, v[j]);
  }
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_i32gather_ps(avx512::load_codes(codes + i), values, 4), s));
  return i;
}

/// mth_largest_avx512 on 8 lanes: per lane the M largest magnitudes, sorted, by a network of
/// max and min; then the m-th largest from the lanes' heads.
template <int M>
TROUPE_AVX2 float mth_largest_avx2(const float* x, std::size_t n, std::size_t m, float& absmax) noexcept {
  const __m256 none = _mm256_set1_ps(-1.0f);  // below every magnitude
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 t[M];
  for (auto& r : t) r = none;
  auto insert = [&](__m256 a) TROUPE_AVX2 {
    for (int k = M - 1; k > 0; --k) t[k] = _mm256_max_ps(t[k], _mm256_min_ps(t[k - 1], a));
    t[0] = _mm256_max_ps(t[0], a);
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) insert(_mm256_and_ps(_mm256_loadu_ps(x + i), magnitude));
  if (i < n) {
    const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), lanes);
    insert(_mm256_blendv_ps(none, _mm256_and_ps(_mm256_maskload_ps(x + i, in), magnitude), _mm256_castsi256_ps(in)));
  }
  for (std::size_t taken = 1;; ++taken) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(t[0]), _mm256_extractf128_ps(t[0], 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float v = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    if (taken == 1) absmax = v;
    if (taken == m) return v;
    const int at = __builtin_ctz(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(t[0], _mm256_set1_ps(v), _CMP_EQ_OQ))));
    const __m256 lane = _mm256_castsi256_ps(_mm256_cmpeq_epi32(lanes, _mm256_set1_epi32(at)));  // one lane holding v
    for (int k = 0; k + 1 < M; ++k) t[k] = _mm256_blendv_ps(t[k], t[k + 1], lane);
    t[M - 1] = _mm256_blendv_ps(t[M - 1], none, lane);
  }
}

__attribute__((target("avx2"))) float absmax_avx2(const float* x, std::size_t n, std::size_t& done) noexcept {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), magnitude));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = 0;
  for (float l : lanes) r = std::max(r, l);
  done = i;
  return r;
}

/// The m largest magnitudes seen so far (m <= 16), largest first: a value enters only when it
/// beats the smallest of them.
struct largest_magnitudes {
  float top[16];
  std::size_t m, filled = 0;
  void offer(float v) noexcept {
    if (filled == m && !(v > top[m - 1])) return;
    std::size_t j = filled < m ? filled++ : m - 1;
    for (; j > 0 && top[j - 1] < v; --j) top[j] = top[j - 1];
    top[j] = v;
  }
};

// GCC 12 takes the reductions' own undefined-value placeholders for uninitialized variables.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
/// The m-th largest |x| (counting equal values, m <= M) of n finite values in one pass without
/// branches on the data: each of the 16 lanes keeps the M largest magnitudes of its values,
/// sorted, in M registers (an insertion is 2M - 1 min/max), and the m largest of all are among
/// them; then m times the largest head of the lanes is taken off its lane. `absmax` gets the first.
template <int M>
TROUPE_AVX512 float mth_largest_avx512(const float* x, std::size_t n, std::size_t m, float& absmax) noexcept {
  const __m512 none = _mm512_set1_ps(-1.0f);  // below every magnitude
  __m512 t[M];
  for (auto& r : t) r = none;
  auto insert = [&](__m512 a) TROUPE_AVX512 {
    for (int k = M - 1; k > 0; --k) t[k] = _mm512_max_ps(t[k], _mm512_min_ps(t[k - 1], a));
    t[0] = _mm512_max_ps(t[0], a);
  };
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) insert(_mm512_abs_ps(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const auto lanes = static_cast<__mmask16>((1u << (n - i)) - 1);
    insert(_mm512_mask_mov_ps(none, lanes, _mm512_abs_ps(_mm512_maskz_loadu_ps(lanes, x + i))));
  }
  for (std::size_t taken = 1;; ++taken) {
    const float v = _mm512_reduce_max_ps(t[0]);
    if (taken == 1) absmax = v;
    if (taken == m) return v;
    const __mmask16 at = _mm512_cmp_ps_mask(t[0], _mm512_set1_ps(v), _CMP_EQ_OQ);
    const auto lane = static_cast<__mmask16>(at & (~at + 1));  // one lane holding v
    for (int k = 0; k + 1 < M; ++k) t[k] = _mm512_mask_mov_ps(t[k], lane, t[k + 1]);
    t[M - 1] = _mm512_mask_mov_ps(t[M - 1], lane, none);
  }
}

/// The largest |x| of x[0, n - n % 32) on AVX-512 (two accumulators); `done` gets n - n % 32.
TROUPE_AVX512 float absmax_avx512(const float* x, std::size_t n, std::size_t& done) noexcept {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = _mm512_max_ps(a, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    b = _mm512_max_ps(b, _mm512_abs_ps(_mm512_loadu_ps(x + i + 16)));
  }
  done = i;
  return _mm512_reduce_max_ps(_mm512_max_ps(a, b));
}
#pragma GCC diagnostic pop

}  // namespace

float block_scale(const float* x, std::size_t n, double percentile) {
  // The (k+1)-th smallest |x| is the m-th largest. High percentiles leave m small (99.9 of a block
  // of 256: m = 1, the absmax; of 2048: m = 3): one pass keeps the m largest.
  std::size_t m = 1;
  if (percentile > 0 && percentile < 100 && n > 0) {
    const auto rank = static_cast<std::size_t>(std::ceil(percentile / 100.0 * static_cast<double>(n)));
    m = n - std::min(n - 1, rank == 0 ? 0 : rank - 1);
  }
  float absmax = 0, selected;
  if (m > 1 && m <= 16 && simd_level() >= 2) {
    // Per lane in registers (mth_largest_avx512), which finds the absmax too.
    selected = m <= 4 ? mth_largest_avx512<4>(x, n, m, absmax)
               : m <= 8 ? mth_largest_avx512<8>(x, n, m, absmax)
                        : mth_largest_avx512<16>(x, n, m, absmax);
    return selected > 0 ? selected : absmax;
  }
  if (m > 1 && m <= 16 && simd_level() >= 1) {
    selected = m <= 4 ? mth_largest_avx2<4>(x, n, m, absmax)
               : m <= 8 ? mth_largest_avx2<8>(x, n, m, absmax)
                        : mth_largest_avx2<16>(x, n, m, absmax);
    return selected > 0 ? selected : absmax;
  }
  std::size_t i = 0;
  if (simd_level() >= 2) absmax = absmax_avx512(x, n, i);
  else if (simd_level() >= 1) absmax = absmax_avx2(x, n, i);
  for (; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  if (m == 1) {
    selected = absmax;
  } else if (m <= 16) {
    largest_magnitudes t;
    t.m = m;
    for (std::size_t i = 0; i < n; ++i) t.offer(std::fabs(x[i]));
    selected = t.top[m - 1];
  } else {
    // The m-th largest magnitude by its bits (a nonnegative float's bits order as it does), a
    // byte at a time from the top: four counting passes, no memory but the counts (an optimizer
    // step allocates nothing once it has begun).
    std::uint32_t prefix = 0, known = 0;
    std::size_t left = m;  // the rank among the values that share `prefix`
    for (int shift = 24; shift >= 0; shift -= 8) {
      std::size_t count[256] = {};
      for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t b;
        const float a = std::fabs(x[i]);
        std::memcpy(&b, &a, 4);
        if ((b & known) == prefix) ++count[(b >> shift) & 0xffu];
      }
      std::uint32_t d = 255;
      for (; left > count[d]; --d) left -= count[d];
      prefix |= d << shift;
      known |= 0xffu << shift;
    }
    std::memcpy(&selected, &prefix, 4);
  }
  return selected > 0 ? selected : absmax;
}

namespace {

// One code from the nearest code c of the normalized value xn: stochastic rounding picks between
// the two entries around xn with probability by distance; keep_nonzero moves a nonzero value
// off the zero code, toward its sign.
inline std::uint8_t finish(std::uint8_t c, float xn, const qmap& map, const block_options& o, std::uint32_t key,
                           std::uint32_t index) noexcept {
  if (o.stochastic) {
    const float vc = map.value(c);
    int lo = c, hi = c;
    if (xn > vc && c < 255) hi = c + 1;
    else if (xn < vc && c > 0) lo = c - 1;
    if (lo != hi) {
      const float a = map.value(static_cast<std::uint8_t>(lo)), b = map.value(static_cast<std::uint8_t>(hi));
      const float r = static_cast<float>(random_bits(key, index) >> 8) * 0x1p-24f;
      c = static_cast<std::uint8_t>((xn - a) > r * (b - a) ? hi : lo);
    }
  }
  if (o.keep_nonzero && c == map.zero_code() && xn != 0.0f) {
    if (xn > 0) c = static_cast<std::uint8_t>(c + 1);
    else if (c > 0) c = static_cast<std::uint8_t>(c - 1);
  }
  return c;
}

}  // namespace

void to_bf16_stochastic(const float* x, std::size_t n, std::uint32_t key, std::uint32_t first,
                        std::uint16_t* out) noexcept {
  const int level = simd_level();
  const std::size_t done = level >= 2   ? bf16_stochastic_avx512(x, n, key, first, out)
                           : level >= 1 ? bf16_stochastic_avx2(x, n, key, first, out)
                                        : 0;
  for (std::size_t i = done; i < n; ++i)
    out[i] = to_bf16_stochastic(x[i], random_bits(key, first + static_cast<std::uint32_t>(i)));
}

void dequantize_block(const std::uint8_t* codes, std::size_t n, float scale, const qmap& map, float* out) noexcept {
  const float* v = map.values();
  const int level = simd_level();
  std::size_t done = level >= 2 ? dequantize_avx512(codes, n, scale, map, out) : 0;
  if (level >= 1) done += dequantize_avx2(codes + done, n - done, scale, v, out + done);
  for (std::size_t i = done; i < n; ++i) out[i] = v[codes[i]] * scale;
}

void quantize_block(const float* x, std::size_t n, float scale, const qmap& map, const block_options& o,
                    std::uint32_t key, std::uint32_t first, std::uint8_t* codes) noexcept {
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  if (o.stochastic && simd_level() >= 1) {
    const std::size_t done =
        simd_level() == 1 ? quantize_stochastic_avx2(x, n, inv, map, o.keep_nonzero, key, first, codes)
        : map.is_signed() ? quantize_stochastic_avx512<true>(x, n, inv, map, o.keep_nonzero, key, first, codes)
                          : quantize_stochastic_avx512<false>(x, n, inv, map, o.keep_nonzero, key, first, codes);
    x += done;
    codes += done;
    n -= done;
    first += static_cast<std::uint32_t>(done);
  }
  const int level = o.stochastic ? 0 : simd_level();
  for (int l = level; l >= 1; --l) {
    const std::size_t done = l == 1 ? (o.keep_nonzero ? quantize_avx2<true>(x, n, inv, map, codes)
                                                      : quantize_avx2<false>(x, n, inv, map, codes))
                             : map.is_signed() ? quantize_avx512<true>(x, n, inv, map, o.keep_nonzero, codes)
                                               : quantize_avx512<false>(x, n, inv, map, o.keep_nonzero, codes);
    x += done;
    codes += done;
    n -= done;
  }
  if (!o.stochastic) {
    // The common case without a call per element: keep_nonzero as arithmetic on the code.
    const int zero = map.zero_code();
    const int down = map.is_signed() ? 1 : 0;
    const int keep = o.keep_nonzero ? 1 : 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float xn = x[i] * inv;
      int c = map.quantize(xn);
      const int at_zero = (c == zero) & keep;
      c += at_zero & (xn > 0.0f);
      c -= at_zero & (xn < 0.0f) & down;
      codes[i] = static_cast<std::uint8_t>(c);
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float xn = x[i] * inv;
    codes[i] = finish(map.quantize(xn), xn, map, o, key, first + static_cast<std::uint32_t>(i));
  }
}

void quantize_block_reference(const float* x, std::size_t n, float scale, const qmap& map,
                              const block_options& o, std::uint32_t key, std::uint32_t first,
                              std::uint8_t* codes) noexcept {
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float xn = x[i] * inv;
    codes[i] = finish(map.quantize_reference(xn), xn, map, o, key, first + static_cast<std::uint32_t>(i));
  }
}

void quantize_blockwise(const float* x, std::size_t n, const qmap& map, const block_options& o, std::uint32_t key,
                        std::uint8_t* codes, float* scales) {
  for (std::size_t b = 0, k = 0; b < n; b += o.block, ++k) {
    const std::size_t len = std::min(o.block, n - b);
    scales[k] = stored_scale(block_scale(x + b, len, o.percentile));
    quantize_block(x + b, len, scales[k], map, o, key, static_cast<std::uint32_t>(b), codes + b);
  }
}

void dequantize_blockwise(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t block,
                          const qmap& map, float* out) noexcept {
  for (std::size_t b = 0, k = 0; b < n; b += block, ++k) {
    const std::size_t len = std::min(block, n - b);
    dequantize_block(codes + b, len, scales[k], map, out + b);
  }
}

}  // namespace troupe::kernels::quant
