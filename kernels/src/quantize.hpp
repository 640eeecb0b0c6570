#pragma once
// Block-wise 8-bit quantization of optimizer state with the dynamic (tree) quantization map of
// Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (2022), and bf16 rounding.
//
// The map: 256 sorted float values in [-1, 1] (signed, for the first moment) or [0, 1]
// (unsigned, for the second), with an exact zero. Construction (bitsandbytes'
// create_dynamic_map with 7 exponent bits and 8 bits in all): for each decade i = 0..6 the
// values 10^(i-6) * mean(b_k, b_k+1) over n_i + 1 evenly spaced points b in [0.1, 1], with
// n_i = 2^i (signed, mirrored negative) or 2^(i+1) (unsigned); then 0 and 1. It is evaluated in
// double and rounded to float (bitsandbytes evaluates it in float32; the two may differ in the
// last bit of a few entries).
//
// A value x is quantized to the code of the nearest map entry (ties: the lower code). The
// reference is a linear scan; the fast path reads a candidate code from a table indexed by x's
// sign, exponent and top 7 mantissa bits (6400 entries, built and checked so that every bucket
// holds at most one decision point), then compares x with the one midpoint above the candidate.
// The two clamped buckets (magnitudes under 2^-24, and from 2 up) hold none (checked when the
// table is built; the smallest decision point is about 1.6e-7), so the vector path
// can compare the low 16 bits of x's magnitude with the decision point's offset in its bucket.
// With AVX-512 the code comes from arithmetic instead (estimate(): the map is evenly spaced inside
// each decade, so one multiply-add gives the code, exact unless it lands next to a decision
// point, where the table decides).

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace troupe::kernels::quant {

class qmap {
public:
  /// The dynamic map, signed (first moment) or unsigned (second moment).
  static const qmap& dynamic(bool is_signed);

  /// The nearest entry's code, by the table and one comparison.
  std::uint8_t quantize(float x) const noexcept {
    std::uint32_t b;
    std::memcpy(&b, &x, 4);
    std::uint32_t a = b & 0x7fffffffu;
    a = a < lo_bits ? lo_bits : a;
    a = a > hi_bits ? hi_bits : a;
    const std::uint32_t idx = ((a - lo_bits) >> shift) + (b >> 31) * buckets;
    const std::uint8_t c = lut_[idx];
    return static_cast<std::uint8_t>(c + (x > above_[c] ? 1 : 0));
  }
  /// The nearest entry's code by a linear scan over all 256 (the definition; slow).
  std::uint8_t quantize_reference(float x) const noexcept;

  float value(std::uint8_t code) const noexcept { return values_[code]; }
  const float* values() const noexcept { return values_.data(); }
  /// Entry c and entry c + 1 (entry 255 twice for c = 255) as one 64-bit word, c's in the low
  /// half: the two entries around a value in one 64-bit gather (stochastic rounding).
  const std::uint64_t* pairs() const noexcept { return pairs_.data(); }
  /// The entries as four byte planes: byte k (little-endian) of entry c at planes()[256 k + c]
  /// (64-byte aligned), so that 64 codes look up their entries by byte permutes, no gathers.
  const std::uint8_t* planes() const noexcept { return planes_.data(); }
  /// above(c): the largest float that still quantizes to c or lower (+inf for 255).
  float above(std::uint8_t code) const noexcept { return above_[code]; }
  const float* aboves() const noexcept { return above_.data(); }
  std::uint8_t zero_code() const noexcept { return zero_code_; }
  /// The bucket table of quantize(): 2 * buckets candidate codes (positive magnitudes, then
  /// negative ones).
  const std::uint8_t* table() const noexcept { return lut_.data(); }
  bool is_signed() const noexcept { return signed_; }
  /// Per bucket (same index as the table): the candidate code in bits 0-7 and, in bits 8 and up,
  /// where its decision point lies in the bucket: x's low 16 magnitude bits above it (positive
  /// buckets) or below it (negative ones) mean the next code. 65536 (positive) or 0 (negative)
  /// when the bucket holds no decision point. One lookup then decides without above().
  const std::int32_t* packed() const noexcept { return packed_.data(); }
  /// Stable identifier recorded in saved state: 1 signed dynamic, 2 unsigned dynamic.
  std::uint8_t id() const noexcept { return signed_ ? 1 : 2; }

  /// The arithmetic estimate behind the AVX-512 quantizer (every table below fits in registers).
  /// The magnitude a = min(|x|, 1) (signed map) or min(max(x, 0), 1) (unsigned) falls in a piece:
  /// 0 below the first decision point (the zero entry), d + 1 for decade d of the map, 8 for the
  /// entry 1. Pieces begin exactly at decision points: a's float exponent gives the piece at the
  /// start of its binade and the one piece start inside it (a >= exponent_threshold() means the
  /// next piece; a negative x with a tie at that decision point stays in the piece below, where
  /// t is a whole number, so that the estimate is not sure and the table breaks the tie).
  /// Inside decade d the entries are evenly spaced and the decision points between them lie at
  /// whole numbers of t = a * piece_scale + piece_offset (one fused multiply-add), so the
  /// magnitude index is min(trunc(t), piece_limit), mirrored around the zero code for negative
  /// x. The piece's first decision point (from the decade below) is its start and its last
  /// entry covers two units of t, hence the limit. t is within a small error of that ideal, so
  /// the index is exact whenever t is at least estimate_margin away from a whole number; otherwise
  /// `sure` is false and the caller asks the table (one value in 12,000-29,000 on random data).
  /// The tables hold t in a fine form: the multiply-add gives w = 2^16 t + 4 (scale times 2^16,
  /// offset times 2^16 plus 4, both exact), whose whole part W has the index in bits 16-23 and
  /// t's first 16 fraction bits, plus 4, below. So W >> 16 is the index and one test of bits
  /// 3-15 (sure_bits) tells whether t's fraction is at least the margin (2^-14) from 0 and 1;
  /// the limit is (limit << 16) | 0xffff, applied to W. With keep_nonzero the zero piece gives
  /// index 1 (t = 1.5) and a zero magnitude then gets W = 0 (so zeros keep the zero code and
  /// every nonzero magnitude gets index 1, and no zero is ever unsure). The construction checks
  /// every decision point of both signs and throws if any assumption fails.
  struct estimated {
    int code;
    bool sure;
  };
  estimated estimate(float x, bool keep) const noexcept {
    float a;
    if (signed_) {
      a = std::fabs(x);
      a = a < 1.0f ? a : 1.0f;
    } else {
      a = x > 0.0f ? x : 0.0f;
      a = a < 1.0f ? a : 1.0f;
    }
    std::uint32_t ab;
    std::memcpy(&ab, &a, 4);
    const std::uint32_t e = slot(a);
    std::uint32_t xb;
    std::memcpy(&xb, &x, 4);
    const bool negative = (xb >> 31) != 0;
    const int piece = exponent_piece_[e] + (a >= exponent_threshold_[e] ? 1 : 0);
    const int kv = keep ? 1 : 0;
    // w < 2^24: a is at most 1.
    const float w = std::fma(a, piece_scale_[kv][piece], piece_offset_[kv][piece]);
    std::uint32_t whole = static_cast<std::uint32_t>(w);
    const bool sure = (whole & sure_bits) != 0;
    const std::uint32_t limit = static_cast<std::uint32_t>(piece_limit_[kv][piece]);
    whole = whole < limit ? whole : limit;
    if (ab == 0) whole = 0;  // a zero keeps index 0
    int code = static_cast<int>(whole >> 16);
    if (signed_) {
      code = negative ? zero_code_ - code : zero_code_ + code;
      code = code < 0 ? 0 : code;
    }
    return {code, sure};
  }
  /// The nearest code (with keep_nonzero's rule when `keep`) by estimate(), or by the table when
  /// the estimate is not sure (the AVX-512 quantizer's scalar twin).
  std::uint8_t quantize_estimated(float x, bool keep = false) const noexcept {
    const estimated r = estimate(x, keep);
    if (r.sure) return static_cast<std::uint8_t>(r.code);
    int c = quantize(x);
    if (keep && c == zero_code_ && x != 0.0f) c += x > 0.0f ? 1 : (signed_ && c > 0 ? -1 : 0);
    return static_cast<std::uint8_t>(c);
  }
  /// The exponent slot of a magnitude: two binades each, 0..15 for [2^-31, 2); smaller ones share
  /// slot 0 (est_floor's).
  static std::uint32_t slot(float a) noexcept {
    const float ae = a > est_floor ? a : est_floor;
    std::uint32_t eb;
    std::memcpy(&eb, &ae, 4);
    return (eb >> 24) & 15u;
  }
  /// Tables of estimate(): per exponent slot (16) and per piece (16, 9 used);
  /// scale, offset and limit without (0) and with (1) keep_nonzero, in the fine form.
  const std::int32_t* exponent_piece() const noexcept { return exponent_piece_.data(); }
  const float* exponent_threshold() const noexcept { return exponent_threshold_.data(); }
  const float* piece_scale(bool keep) const noexcept { return piece_scale_[keep ? 1 : 0].data(); }
  const float* piece_offset(bool keep) const noexcept { return piece_offset_[keep ? 1 : 0].data(); }
  const std::int32_t* piece_limit(bool keep) const noexcept { return piece_limit_[keep ? 1 : 0].data(); }

  /// The construction evaluated in double (256 values, sorted).
  static std::array<double, 256> construct(bool is_signed);

  static constexpr std::uint32_t lo_bits = 0x33800000u;  // 2^-24: smaller magnitudes share a bucket
  static constexpr std::uint32_t hi_bits = 0x3fffffffu;  // just below 2: larger ones share a bucket
  static constexpr int shift = 16;                       // keep 7 mantissa bits
  static constexpr std::uint32_t buckets = ((hi_bits - lo_bits) >> shift) + 1;
  static constexpr float est_floor = 0x1p-31f;             // smaller magnitudes share its slot
  static constexpr float estimate_margin = 0x1p-14f;       // t nearer a whole number: not sure
  // estimate()'s fine form of t: w = fine_unit * t + fine_bias; W's bits 3-15 all zero: not sure.
  static constexpr float fine_unit = 0x1p16f;
  static constexpr float fine_bias = fine_unit * estimate_margin;
  static constexpr std::uint32_t sure_bits = 0xfff8u;
  static_assert(fine_bias == 4.0f && sure_bits == (0xffffu & ~(2u * 4u - 1u)));

private:
  explicit qmap(bool is_signed);
  void build_estimate();
  std::array<float, 256> values_{};
  std::array<float, 256> above_{};
  std::array<std::uint64_t, 256> pairs_{};
  alignas(64) std::array<std::uint8_t, 1024> planes_{};
  std::vector<std::uint8_t> lut_;
  std::vector<std::int32_t> packed_;  // code and decision offset, for the vector quantizers
  // estimate(): per exponent slot (the piece at its start, the start of the next one if inside), and
  // per piece (without and with keep_nonzero).
  std::array<std::int32_t, 16> exponent_piece_{};
  std::array<float, 16> exponent_threshold_{};
  std::array<std::array<float, 16>, 2> piece_scale_{}, piece_offset_{};
  std::array<std::array<std::int32_t, 16>, 2> piece_limit_{};
  std::uint8_t zero_code_ = 0;
  bool signed_ = false;
};

/// The widest vector instructions that the quantizer and the fused optimizer kernels use: 2
/// AVX-512 F, DQ, BW, VL and VBMI (Ice Lake, Zen 4 and later), 1 AVX2, 0 none. The CPU's, unless
/// lowered by the environment (TROUPE_SIMD=avx2 or none, read once) or by limit_simd().
int simd_level() noexcept;
/// Caps simd_level() at `level` (so that tests run every path); returns the previous cap. Not
/// for use while a step or a quantizer runs.
int limit_simd(int level) noexcept;

/// Counter-based random bits: the same (key, index) gives the same bits on any thread.
inline std::uint32_t random_bits(std::uint32_t key, std::uint32_t index) noexcept {
  std::uint32_t h = index * 0x9e3779b1u ^ key;
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}
/// A 32-bit key for one tensor's moment at one step.
std::uint32_t random_key(std::uint64_t seed, std::uint64_t step, std::uint64_t tensor, std::uint64_t moment) noexcept;

/// bf16 by round to nearest even (finite inputs).
inline std::uint16_t to_bf16(float x) noexcept {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<std::uint16_t>(b >> 16);
}
/// bf16 by stochastic rounding: rounds up with probability equal to the dropped fraction.
inline std::uint16_t to_bf16_stochastic(float x, std::uint32_t bits) noexcept {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  const std::uint32_t sign = b & 0x80000000u;
  std::uint32_t mag = b & 0x7fffffffu;
  // Rounding the magnitude keeps the probabilities symmetric for negative values; never round
  // a finite value up into infinity.
  const std::uint32_t up = mag + (bits & 0xffffu);
  mag = (up >> 16) >= 0x7f80u ? mag : up;
  return static_cast<std::uint16_t>((sign | mag) >> 16);
}
/// n values by stochastic rounding, value i with random_bits(key, first + i) (16 lanes at a time
/// with AVX-512, the same bits).
void to_bf16_stochastic(const float* x, std::size_t n, std::uint32_t key, std::uint32_t first,
                        std::uint16_t* out) noexcept;
inline float from_bf16(std::uint16_t h) noexcept {
  const std::uint32_t b = static_cast<std::uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

/// How one block's values become codes.
struct block_options {
  std::size_t block = 256;
  double percentile = 0;          ///< 0: scale by absmax; else by this percentile of |x| (e.g. 99.9)
  bool stochastic = false;        ///< stochastic rounding between the two neighbouring codes
  bool keep_nonzero = true;       ///< a nonzero value never becomes code zero (keeps m's sign)
};

/// The scale of one block: its absmax, or the percentile of |x| (the absmax when that is 0).
float block_scale(const float* x, std::size_t n, double percentile);

/// The scale a block is stored with: `s`, or 0 (the block stored as zeros) when `s` is below the
/// smallest normal float, whose reciprocal is infinite (x / s would be 0 x inf = NaN for a zero).
/// Every path, the CUDA kernels included, stores scales through this rule.
inline float stored_scale(float s) noexcept { return s >= 1.17549435e-38f ? s : 0.0f; }

/// Codes of one block of n values scaled by `scale`. `first` is the index of x[0] in its tensor
/// (for the random bits of stochastic rounding).
void quantize_block(const float* x, std::size_t n, float scale, const qmap& map, const block_options& o,
                    std::uint32_t key, std::uint32_t first, std::uint8_t* codes) noexcept;
/// The same, one code at a time through quantize_reference (the definition).
void quantize_block_reference(const float* x, std::size_t n, float scale, const qmap& map,
                              const block_options& o, std::uint32_t key, std::uint32_t first,
                              std::uint8_t* codes) noexcept;

/// A whole tensor: codes[n], scales[ceil(n / block)].
void quantize_blockwise(const float* x, std::size_t n, const qmap& map, const block_options& o, std::uint32_t key,
                        std::uint8_t* codes, float* scales);
/// out[i] = map value of codes[i] * scale.
void dequantize_block(const std::uint8_t* codes, std::size_t n, float scale, const qmap& map, float* out) noexcept;
void dequantize_blockwise(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t block,
                          const qmap& map, float* out) noexcept;

}  // namespace troupe::kernels::quant
