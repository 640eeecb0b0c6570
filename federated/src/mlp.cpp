#include "mlp.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "troupe/kernels/layers.hpp"

namespace troupe::federated::detail {

flat_mlp::flat_mlp(std::vector<int> sizes) : sizes_(std::move(sizes)) {
  if (sizes_.size() < 2) throw std::invalid_argument("an MLP needs at least an input and an output size");
  for (int s : sizes_)
    if (s < 1) throw std::invalid_argument("MLP layer sizes must be positive");
  for (std::size_t l = 0; l + 1 < sizes_.size(); ++l) {
    w_offset_.push_back(dim_);
    dim_ += static_cast<std::size_t>(sizes_[l]) * static_cast<std::size_t>(sizes_[l + 1]);
    b_offset_.push_back(dim_);
    dim_ += static_cast<std::size_t>(sizes_[l + 1]);
  }
  act_.resize(sizes_.size() - 1);
}

flat_mlp flat_mlp::from_spec(const std::string& spec) {
  std::vector<int> sizes;
  for (const std::int64_t s : kernels::mlp_sizes(spec)) sizes.push_back(static_cast<int>(s));  // at most 2^20 each
  return flat_mlp(std::move(sizes));
}

void flat_mlp::reserve(int rows) {
  if (rows <= capacity_) return;
  capacity_ = rows;
  for (std::size_t l = 1; l < act_.size(); ++l) act_[l].resize(static_cast<std::size_t>(rows) * sizes_[l]);
  int widest = *std::max_element(sizes_.begin() + 1, sizes_.end());
  logits_.resize(static_cast<std::size_t>(rows) * outputs());
  dz_.resize(static_cast<std::size_t>(rows) * widest);
  dz_prev_.resize(static_cast<std::size_t>(rows) * widest);
  da_.resize(static_cast<std::size_t>(rows) * widest);
}

double flat_mlp::softmax_loss(const float* logits, const std::uint8_t* labels, int rows, float* dz,
                              std::int64_t* correct) const {
  const int c = outputs();
  double loss = 0;
  std::array<double, 64> small;
  std::vector<double> big;
  double* e = small.data();
  if (c > static_cast<int>(small.size())) {
    big.resize(static_cast<std::size_t>(c));
    e = big.data();
  }
  for (int i = 0; i < rows; ++i) {
    const float* z = logits + static_cast<std::size_t>(i) * c;
    const int y = labels[i];
    if (y >= c)
      throw std::invalid_argument("label " + std::to_string(y) + " is outside 0.." + std::to_string(c - 1));
    float top = z[0];
    int best = 0;
    for (int j = 1; j < c; ++j)
      if (z[j] > top) top = z[j], best = j;
    double sum = 0;
    for (int j = 0; j < c; ++j) sum += (e[j] = std::exp(static_cast<double>(z[j]) - top));
    loss += std::log(sum) + top - z[y];
    if (correct && best == y) ++*correct;
    if (dz)
      for (int j = 0; j < c; ++j)
        dz[static_cast<std::size_t>(i) * c + j] =
            static_cast<float>((e[j] / sum - (j == y ? 1.0 : 0.0)) / static_cast<double>(rows));
  }
  return loss;
}

// ---- the reference ----------------------------------------------------------------------

namespace {

/// z [rows, out] = a [rows, in] W^T + b, then ReLU unless last.
void forward_layer_reference(const float* a, int rows, int in, const float* w, const float* b,
                             float* z, int out, bool relu) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < out; ++j) {
      float s = 0;
      for (int k = 0; k < in; ++k) s += a[static_cast<std::size_t>(i) * in + k] * w[static_cast<std::size_t>(j) * in + k];
      s += b[j];
      z[static_cast<std::size_t>(i) * out + j] = relu && s < 0 ? 0.0f : s;
    }
}

}  // namespace

double flat_mlp::step_reference(float* w, const float* x, const std::uint8_t* labels, int rows, float lr,
                                const gradient_extras& extras) {
  reserve(rows);
  const std::size_t layers = sizes_.size() - 1;
  auto input_of = [&](std::size_t l) { return l == 0 ? x : act_[l].data(); };
  for (std::size_t l = 0; l < layers; ++l) {
    float* out = l + 1 < layers ? act_[l + 1].data() : logits_.data();
    forward_layer_reference(input_of(l), rows, sizes_[l], w + w_offset_[l], w + b_offset_[l], out,
                            sizes_[l + 1], l + 1 < layers);
  }
  const double loss = softmax_loss(logits_.data(), labels, rows, dz_.data(), nullptr);

  grad_.assign(dim_, 0.0f);
  for (std::size_t l = layers; l-- > 0;) {
    const int in = sizes_[l], out = sizes_[l + 1];
    const float* a = input_of(l);
    float* gw = grad_.data() + w_offset_[l];
    float* gb = grad_.data() + b_offset_[l];
    for (int j = 0; j < out; ++j)
      for (int k = 0; k < in; ++k) {
        float s = 0;
        for (int i = 0; i < rows; ++i) s += dz_[static_cast<std::size_t>(i) * out + j] * a[static_cast<std::size_t>(i) * in + k];
        gw[static_cast<std::size_t>(j) * in + k] = s;
      }
    for (int j = 0; j < out; ++j) {
      float s = 0;
      for (int i = 0; i < rows; ++i) s += dz_[static_cast<std::size_t>(i) * out + j];
      gb[j] = s;
    }
    if (l == 0) break;
    const float* wl = w + w_offset_[l];
    for (int i = 0; i < rows; ++i)
      for (int k = 0; k < in; ++k) {
        float s = 0;
        for (int j = 0; j < out; ++j) s += dz_[static_cast<std::size_t>(i) * out + j] * wl[static_cast<std::size_t>(j) * in + k];
        // ReLU's derivative from its output: the layer's input a.
        dz_prev_[static_cast<std::size_t>(i) * in + k] = a[static_cast<std::size_t>(i) * in + k] > 0 ? s : 0.0f;
      }
    std::swap(dz_, dz_prev_);
  }
  for (std::size_t p = 0; p < dim_; ++p) {
    float g = grad_[p];
    if (extras.center) g += extras.mu * (w[p] - extras.center[p]);
    if (extras.correction) g += extras.correction[p];
    w[p] -= lr * g;
  }
  return loss;
}

// ---- the fast path: AVX2 with FMA, or AVX-512 -------------------------------------------

namespace {

using forward_fn = void (*)(const float*, int, const float*, const float*, float*, int, bool);
using backward_fn = void (*)(const float*, int, const float*, int, float*, float*, float*, float, float,
                             const float*, const float*, const float*, const float*, float*, float*, bool, bool);

/// One instruction set's row kernels: forward[n - 1] for n rows (n <= forward_tile), backward[n -
/// 1] for n <= backward_tile.
struct row_kernels {
  int forward_tile;
  const forward_fn* forward;
  const backward_fn* backward;
};

// GCC 12 warns about the undefined source register inside _mm512_maskz_loadu_ps's own header
// (a false positive: maskz zeroes the masked lanes). The loops over the R rows must unroll
// completely, or the accumulators live on the stack: `#pragma GCC unroll` on each.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
/// 8 lanes; 6 rows per forward tile (12 accumulators and 3 operands in the 16 registers).
struct V {
  using reg = __m256;
  using mask = __m256i;
  static constexpr int width = 8, forward_tile = 6;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float f) { return _mm256_set1_ps(f); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static reg load_part(mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void store_part(float* p, mask m, reg x) { _mm256_maskstore_ps(p, m, x); }
  static mask first(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg fnmadd(reg a, reg b, reg c) { return _mm256_fnmadd_ps(a, b, c); }
  static float sum(reg x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
};
#include "mlp_rows.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
/// 16 lanes; 12 rows per forward tile (of the 32 registers).
struct V {
  using reg = __m512;
  using mask = __mmask16;
  static constexpr int width = 16, forward_tile = 12;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float f) { return _mm512_set1_ps(f); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static reg load_part(mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_part(float* p, mask m, reg x) { _mm512_mask_storeu_ps(p, m, x); }
  static mask first(int n) { return static_cast<mask>((1u << n) - 1); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg fnmadd(reg a, reg b, reg c) { return _mm512_fnmadd_ps(a, b, c); }
  static float sum(reg x) { return _mm512_reduce_add_ps(x); }
};
#include "mlp_rows.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC diagnostic pop

int cpu_simd_level() noexcept {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 2;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}

std::atomic<int> simd_cap{2};

/// The kernels for the level in use; null without AVX2.
const row_kernels* fast_kernels() noexcept {
  switch (flat_mlp::simd_level()) {
    case 2: return &avx512::kernels;
    case 1: return &avx2::kernels;
    default: return nullptr;
  }
}

/// Any number of rows, in tiles of the kernels' forward_tile.
void forward_layer_fast(const row_kernels& k, const float* a, int rows, int in, const float* w, const float* b,
                        float* z, int out, bool relu) {
  for (int r0 = 0; r0 < rows; r0 += k.forward_tile) {
    const int n = std::min(k.forward_tile, rows - r0);
    k.forward[n - 1](a + static_cast<std::size_t>(r0) * in, in, w, b, z + static_cast<std::size_t>(r0) * out, out,
                     relu);
  }
}

}  // namespace

int flat_mlp::simd_level() noexcept {
  static const int cpu = cpu_simd_level();
  return std::min(cpu, simd_cap.load(std::memory_order_relaxed));
}

int flat_mlp::limit_simd(int level) noexcept { return simd_cap.exchange(level); }

bool flat_mlp::fast_available() noexcept { return simd_level() >= 1; }

double flat_mlp::step_fast(float* w, const float* x, const std::uint8_t* labels, int rows, float lr,
                           const gradient_extras& extras) {
  const row_kernels* k = fast_kernels();
  if (!k) throw std::logic_error("step_fast needs a CPU with AVX2 and FMA");
  if (rows < 1) throw std::invalid_argument("step_fast needs at least one row");
  reserve(rows);
  // More rows than one backward tile: the gradient's partial sums wait in grad_ between tiles.
  const bool tiled = rows > backward_tile;
  if (tiled) grad_.resize(dim_);
  const std::size_t layers = sizes_.size() - 1;
  auto input_of = [&](std::size_t l) { return l == 0 ? x : act_[l].data(); };
  for (std::size_t l = 0; l < layers; ++l) {
    float* out = l + 1 < layers ? act_[l + 1].data() : logits_.data();
    forward_layer_fast(*k, input_of(l), rows, sizes_[l], w + w_offset_[l], w + b_offset_[l], out, sizes_[l + 1],
                       l + 1 < layers);
  }
  const double loss = softmax_loss(logits_.data(), labels, rows, dz_.data(), nullptr);
  for (std::size_t l = layers; l-- > 0;) {
    const int in = sizes_[l], out = sizes_[l + 1];
    const float* a = input_of(l);
    float* da = nullptr;
    if (l > 0) {
      da = da_.data();
      std::fill_n(da, static_cast<std::size_t>(rows) * in, 0.0f);
    }
    const float* cw = extras.center ? extras.center + w_offset_[l] : nullptr;
    const float* cb = extras.center ? extras.center + b_offset_[l] : nullptr;
    const float* kw = extras.correction ? extras.correction + w_offset_[l] : nullptr;
    const float* kb = extras.correction ? extras.correction + b_offset_[l] : nullptr;
    for (int r0 = 0; r0 < rows; r0 += backward_tile) {
      const int n = std::min(backward_tile, rows - r0);
      k->backward[n - 1](a + static_cast<std::size_t>(r0) * in, in, dz_.data() + static_cast<std::size_t>(r0) * out, out,
                         w + w_offset_[l], w + b_offset_[l], da ? da + static_cast<std::size_t>(r0) * in : nullptr, lr,
                         extras.mu, cw, cb, kw, kb, tiled ? grad_.data() + w_offset_[l] : nullptr,
                         tiled ? grad_.data() + b_offset_[l] : nullptr, r0 == 0, r0 + n == rows);
    }
    if (l == 0) break;
    for (std::size_t i = 0; i < static_cast<std::size_t>(rows) * in; ++i) dz_prev_[i] = a[i] > 0 ? da[i] : 0.0f;
    std::swap(dz_, dz_prev_);
  }
  return loss;
}

double flat_mlp::step(float* w, const float* x, const std::uint8_t* labels, int rows, float lr,
                      const gradient_extras& extras) {
  if (fast_available()) return step_fast(w, x, labels, rows, lr, extras);
  return step_reference(w, x, labels, rows, lr, extras);
}

void flat_mlp::evaluate(const float* w, const float* x, const std::uint8_t* labels, int rows, double& loss,
                        std::int64_t& correct) {
  reserve(rows);
  const std::size_t layers = sizes_.size() - 1;
  const row_kernels* k = fast_kernels();
  for (std::size_t l = 0; l < layers; ++l) {
    const float* in = l == 0 ? x : act_[l].data();
    float* out = l + 1 < layers ? act_[l + 1].data() : logits_.data();
    if (k) forward_layer_fast(*k, in, rows, sizes_[l], w + w_offset_[l], w + b_offset_[l], out, sizes_[l + 1],
                              l + 1 < layers);
    else forward_layer_reference(in, rows, sizes_[l], w + w_offset_[l], w + b_offset_[l], out, sizes_[l + 1],
                                 l + 1 < layers);
  }
  loss += softmax_loss(logits_.data(), labels, rows, nullptr, &correct);
}

}  // namespace troupe::federated::detail
