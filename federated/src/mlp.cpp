#include "mlp.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
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
  auto model = kernels::make_mlp(spec);
  std::vector<int> sizes;
  auto params = model->parameters();
  for (std::size_t i = 0; i < params.size(); i += 2) {
    const auto& w = params[i]->value;
    if (sizes.empty()) sizes.push_back(static_cast<int>(w.dim(1)));
    sizes.push_back(static_cast<int>(w.dim(0)));
  }
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

// ---- the AVX-512 path ---------------------------------------------------------------------

namespace {

#define TROUPE_AVX512 __attribute__((target("avx512f")))
// GCC 12 warns about the undefined source register inside _mm512_maskz_loadu_ps's own header
// (a false positive: maskz zeroes the masked lanes). The loops over the R rows must unroll
// completely, or the accumulators live on the stack: `#pragma GCC unroll` on each.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

/// z [R, out] = a [R, in] W^T + b (ReLU when asked), two weight rows at a time.
template <int R>
TROUPE_AVX512 void forward_rows(const float* a, int in, const float* w, const float* b, float* z,
                                int out, bool relu) {
  const int full = in / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (in - full)) - 1);
  int j = 0;
  for (; j + 2 <= out; j += 2) {
    const float* w0 = w + static_cast<std::size_t>(j) * in;
    const float* w1 = w0 + in;
    __m512 s0[R], s1[R];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
    for (int k = 0; k < full; k += 16) {
      const __m512 v0 = _mm512_loadu_ps(w0 + k), v1 = _mm512_loadu_ps(w1 + k);
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_loadu_ps(a + static_cast<std::size_t>(r) * in + k);
        s0[r] = _mm512_fmadd_ps(x, v0, s0[r]);
        s1[r] = _mm512_fmadd_ps(x, v1, s1[r]);
      }
    }
    if (tail) {
      const __m512 v0 = _mm512_maskz_loadu_ps(tail, w0 + full), v1 = _mm512_maskz_loadu_ps(tail, w1 + full);
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_maskz_loadu_ps(tail, a + static_cast<std::size_t>(r) * in + full);
        s0[r] = _mm512_fmadd_ps(x, v0, s0[r]);
        s1[r] = _mm512_fmadd_ps(x, v1, s1[r]);
      }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      float* zr = z + static_cast<std::size_t>(r) * out + j;
      const float v0 = _mm512_reduce_add_ps(s0[r]) + b[j], v1 = _mm512_reduce_add_ps(s1[r]) + b[j + 1];
      zr[0] = relu && v0 < 0 ? 0.0f : v0;
      zr[1] = relu && v1 < 0 ? 0.0f : v1;
    }
  }
  for (; j < out; ++j) {
    const float* w0 = w + static_cast<std::size_t>(j) * in;
    __m512 s0[R];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) s0[r] = _mm512_setzero_ps();
    for (int k = 0; k < full; k += 16) {
      const __m512 v0 = _mm512_loadu_ps(w0 + k);
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        s0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(a + static_cast<std::size_t>(r) * in + k), v0, s0[r]);
    }
    if (tail) {
      const __m512 v0 = _mm512_maskz_loadu_ps(tail, w0 + full);
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        s0[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, a + static_cast<std::size_t>(r) * in + full), v0, s0[r]);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float v0 = _mm512_reduce_add_ps(s0[r]) + b[j];
      z[static_cast<std::size_t>(r) * out + j] = relu && v0 < 0 ? 0.0f : v0;
    }
  }
}

/// For one layer and R <= 16 rows: the input gradient da [R, in] += dz W (with the weights as
/// they were; da may be null), then W, b -= lr * (dz^T a + extras), row by row in one pass.
template <int R>
TROUPE_AVX512 void backward_rows(const float* a, int in, const float* dz, int out, float* w, float* b,
                                 float* da, float lr, float mu, const float* cw, const float* cb,
                                 const float* kw, const float* kb) {
  const int full = in / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (in - full)) - 1);
  const __m512 vlr = _mm512_set1_ps(lr), vmu = _mm512_set1_ps(mu);
  for (int j = 0; j < out; ++j) {
    __m512 d[R];
    float gb = 0;
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float v = dz[static_cast<std::size_t>(r) * out + j];
      d[r] = _mm512_set1_ps(v);
      gb += v;
    }
    if (cb) gb += mu * (b[j] - cb[j]);
    if (kb) gb += kb[j];
    b[j] -= lr * gb;
    float* wj = w + static_cast<std::size_t>(j) * in;
    const std::size_t row = static_cast<std::size_t>(j) * in;
    // Four vectors at a time: four independent chains of R FMAs (one chain would wait on
    // the FMA latency); each lane still sums its rows in order 0..R-1, as the reference does.
    int k = 0;
    for (; k + 64 <= in; k += 64) {
      __m512 v[4], g[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) v[c] = _mm512_loadu_ps(wj + k + 16 * c);
      if (da) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          float* p = da + static_cast<std::size_t>(r) * in + k;
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c)
            _mm512_storeu_ps(p + 16 * c, _mm512_fmadd_ps(d[r], v[c], _mm512_loadu_ps(p + 16 * c)));
        }
      }
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) g[c] = _mm512_mul_ps(d[0], _mm512_loadu_ps(a + k + 16 * c));
#pragma GCC unroll 16
      for (int r = 1; r < R; ++r) {
        const float* ar = a + static_cast<std::size_t>(r) * in + k;
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) g[c] = _mm512_fmadd_ps(d[r], _mm512_loadu_ps(ar + 16 * c), g[c]);
      }
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        if (cw) g[c] = _mm512_fmadd_ps(vmu, _mm512_sub_ps(v[c], _mm512_loadu_ps(cw + row + k + 16 * c)), g[c]);
        if (kw) g[c] = _mm512_add_ps(g[c], _mm512_loadu_ps(kw + row + k + 16 * c));
        _mm512_storeu_ps(wj + k + 16 * c, _mm512_fnmadd_ps(vlr, g[c], v[c]));
      }
    }
    for (; k < in; k += 16) {
      const __mmask16 m = k < full ? static_cast<__mmask16>(0xFFFF) : tail;
      const __m512 v = _mm512_maskz_loadu_ps(m, wj + k);
      if (da)
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          float* p = da + static_cast<std::size_t>(r) * in + k;
          _mm512_mask_storeu_ps(p, m, _mm512_fmadd_ps(d[r], v, _mm512_maskz_loadu_ps(m, p)));
        }
      __m512 g = _mm512_mul_ps(d[0], _mm512_maskz_loadu_ps(m, a + k));
#pragma GCC unroll 16
      for (int r = 1; r < R; ++r)
        g = _mm512_fmadd_ps(d[r], _mm512_maskz_loadu_ps(m, a + static_cast<std::size_t>(r) * in + k), g);
      if (cw) g = _mm512_fmadd_ps(vmu, _mm512_sub_ps(v, _mm512_maskz_loadu_ps(m, cw + row + k)), g);
      if (kw) g = _mm512_add_ps(g, _mm512_maskz_loadu_ps(m, kw + row + k));
      _mm512_mask_storeu_ps(wj + k, m, _mm512_fnmadd_ps(vlr, g, v));
    }
  }
}

using forward_fn = void (*)(const float*, int, const float*, const float*, float*, int, bool);
using backward_fn = void (*)(const float*, int, const float*, int, float*, float*, float*, float, float,
                             const float*, const float*, const float*, const float*);

template <int... I>
constexpr std::array<forward_fn, sizeof...(I)> forward_table(std::integer_sequence<int, I...>) {
  return {&forward_rows<I + 1>...};
}
template <int... I>
constexpr std::array<backward_fn, sizeof...(I)> backward_table(std::integer_sequence<int, I...>) {
  return {&backward_rows<I + 1>...};
}

#pragma GCC diagnostic pop

constexpr int forward_tile = 12;
constexpr auto forward_kernels = forward_table(std::make_integer_sequence<int, forward_tile>{});
constexpr auto backward_kernels = backward_table(std::make_integer_sequence<int, flat_mlp::fast_max_rows>{});

/// Any number of rows, in tiles of forward_tile.
void forward_layer_fast(const float* a, int rows, int in, const float* w, const float* b, float* z, int out,
                        bool relu) {
  for (int r0 = 0; r0 < rows; r0 += forward_tile) {
    const int n = std::min(forward_tile, rows - r0);
    forward_kernels[n - 1](a + static_cast<std::size_t>(r0) * in, in, w, b, z + static_cast<std::size_t>(r0) * out,
                           out, relu);
  }
}

bool cpu_has_avx512() noexcept {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

}  // namespace

bool flat_mlp::fast_available() noexcept { return cpu_has_avx512(); }

double flat_mlp::step_fast(float* w, const float* x, const std::uint8_t* labels, int rows, float lr,
                           const gradient_extras& extras) {
  if (!fast_available()) throw std::logic_error("step_fast needs a CPU with AVX-512");
  if (rows < 1 || rows > fast_max_rows)
    throw std::invalid_argument("step_fast takes 1.." + std::to_string(fast_max_rows) + " rows");
  reserve(rows);
  const std::size_t layers = sizes_.size() - 1;
  auto input_of = [&](std::size_t l) { return l == 0 ? x : act_[l].data(); };
  for (std::size_t l = 0; l < layers; ++l) {
    float* out = l + 1 < layers ? act_[l + 1].data() : logits_.data();
    forward_layer_fast(input_of(l), rows, sizes_[l], w + w_offset_[l], w + b_offset_[l], out, sizes_[l + 1],
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
    backward_kernels[rows - 1](a, in, dz_.data(), out, w + w_offset_[l], w + b_offset_[l], da, lr, extras.mu, cw,
                               cb, kw, kb);
    if (l == 0) break;
    for (std::size_t i = 0; i < static_cast<std::size_t>(rows) * in; ++i) dz_prev_[i] = a[i] > 0 ? da[i] : 0.0f;
    std::swap(dz_, dz_prev_);
  }
  return loss;
}

double flat_mlp::step(float* w, const float* x, const std::uint8_t* labels, int rows, float lr,
                      const gradient_extras& extras) {
  if (fast_available() && rows <= fast_max_rows) return step_fast(w, x, labels, rows, lr, extras);
  return step_reference(w, x, labels, rows, lr, extras);
}

void flat_mlp::evaluate(const float* w, const float* x, const std::uint8_t* labels, int rows, double& loss,
                        std::int64_t& correct) {
  reserve(rows);
  const std::size_t layers = sizes_.size() - 1;
  const bool fast = fast_available();
  for (std::size_t l = 0; l < layers; ++l) {
    const float* in = l == 0 ? x : act_[l].data();
    float* out = l + 1 < layers ? act_[l + 1].data() : logits_.data();
    (fast ? forward_layer_fast : forward_layer_reference)(in, rows, sizes_[l], w + w_offset_[l], w + b_offset_[l], out,
                                                          sizes_[l + 1], l + 1 < layers);
  }
  loss += softmax_loss(logits_.data(), labels, rows, nullptr, &correct);
}

}  // namespace troupe::federated::detail
