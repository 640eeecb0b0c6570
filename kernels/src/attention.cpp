// Causal self-attention kernels (attention.hpp): the tiled fast path and its reference.

#include "troupe/kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fast_gelu.hpp"  // exp_approx

namespace troupe::kernels {

namespace {

void ensure(tensor& t, const tensor::shape_type& shape) {
  if (!t.defined() || t.shape() != shape || t.type() != dtype::f32 || !t.where().is_cpu())
    t = tensor::empty(shape);
}

/// Eight partial sums (lanes the compiler keeps in one vector register), then the tail.
[[gnu::always_inline]] inline float dot(const float* a, const float* b, std::int64_t d) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t k = 0;
  for (; k + 8 <= d; k += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[k + l] * b[k + l];
  float s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  for (; k < d; ++k) s += a[k] * b[k];
  return s;
}

[[gnu::always_inline]] inline void axpy(float a, const float* x, float* y, std::int64_t d) {
  for (std::int64_t k = 0; k < d; ++k) y[k] += a * x[k];
}

/// Where the pieces of one (sequence, head) live in the packed rows.
struct view {
  std::int64_t ctx, heads, d, c;  // c = heads * d
  std::int64_t qkv_stride() const { return 3 * c; }
  /// Offsets of row t of sequence b for head h.
  std::int64_t q(std::int64_t b, std::int64_t t, std::int64_t h) const { return (b * ctx + t) * 3 * c + h * d; }
  std::int64_t k(std::int64_t b, std::int64_t t, std::int64_t h) const { return q(b, t, h) + c; }
  std::int64_t v(std::int64_t b, std::int64_t t, std::int64_t h) const { return q(b, t, h) + 2 * c; }
  std::int64_t o(std::int64_t b, std::int64_t t, std::int64_t h) const { return (b * ctx + t) * c + h * d; }
  std::int64_t l(std::int64_t b, std::int64_t t, std::int64_t h) const { return (b * heads + h) * ctx + t; }
};

void check_tile(std::int64_t tile) {
  if (tile < 1) throw std::invalid_argument("attention: the tile must hold at least one row");
}

}  // namespace

std::int64_t attention_head_dim(const tensor& qkv, std::int64_t ctx, std::int64_t heads) {
  if (ctx < 1 || heads < 1) throw std::invalid_argument("attention needs ctx >= 1 and heads >= 1");
  if (qkv.rank() != 2 || qkv.type() != dtype::f32 || !qkv.where().is_cpu())
    throw std::invalid_argument("attention expects host f32 qkv rows [n, 3 * embd], got " + qkv.str());
  if (qkv.dim(1) % (3 * heads) != 0 || qkv.dim(1) == 0)
    throw std::invalid_argument("attention: qkv rows of " + std::to_string(qkv.dim(1)) + " columns do not split into q, k, v of " +
                                std::to_string(heads) + " heads");
  if (qkv.dim(0) % ctx != 0)
    throw std::invalid_argument("attention: " + std::to_string(qkv.dim(0)) + " rows are not sequences of ctx " +
                                std::to_string(ctx));
  return qkv.dim(1) / (3 * heads);
}

namespace {

// The bodies are compiled twice, for AVX2 and the baseline, and picked by an explicit test of the
// CPU (not an ifunc from target_clones: its resolver runs before the sanitizer runtimes start).
// No operation is reordered or fused, so the AVX2 results are the baseline's to the bit.
[[gnu::always_inline]] inline void forward_body(const tensor& qkv, std::int64_t ctx, std::int64_t heads, tensor& out,
                                                tensor& lse, std::int64_t tile) {
  check_tile(tile);
  const std::int64_t d = attention_head_dim(qkv, ctx, heads), n = qkv.dim(0), batch = n / ctx;
  const view w{ctx, heads, d, heads * d};
  ensure(out, {n, heads * d});
  ensure(lse, {batch * heads * ctx});
  const float* x = qkv.data<float>().data();
  float* o = out.data<float>().data();
  float* ls = lse.data<float>().data();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  // Scratch for one block: the scores of tile x tile, and per query row its running max and sum.
  std::vector<float> s(static_cast<std::size_t>(tile * tile)), m(static_cast<std::size_t>(tile)),
      sum(static_cast<std::size_t>(tile));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i0 = 0; i0 < ctx; i0 += tile) {
        const std::int64_t i1 = std::min(ctx, i0 + tile);
        for (std::int64_t i = i0; i < i1; ++i) {
          m[i - i0] = -std::numeric_limits<float>::infinity();
          sum[i - i0] = 0;
          std::fill_n(o + w.o(b, i, h), d, 0.0f);
        }
        for (std::int64_t j0 = 0; j0 < i1; j0 += tile) {  // keys after the block's last query are masked
          const std::int64_t j1 = std::min(i1, j0 + tile);
          for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t last = std::min(j1, i + 1);  // causal: keys j <= i
            if (last <= j0) continue;
            float* srow = s.data() + (i - i0) * tile;
            const float* q = x + w.q(b, i, h);
            float top = m[i - i0];
            for (std::int64_t j = j0; j < last; ++j) {
              srow[j - j0] = dot(q, x + w.k(b, j, h), d) * scale;
              top = std::max(top, srow[j - j0]);
            }
            // Rescale what was summed under the old maximum, then add this block.
            const float correction = detail::exp_approx(m[i - i0] - top);
            float* acc = o + w.o(b, i, h);
            float total = sum[i - i0] * correction;
            for (std::int64_t k = 0; k < d; ++k) acc[k] *= correction;
            for (std::int64_t j = 0; j < last - j0; ++j) srow[j] = detail::exp_approx(srow[j] - top);
            for (std::int64_t j = j0; j < last; ++j) {
              const float p = srow[j - j0];
              total += p;
              axpy(p, x + w.v(b, j, h), acc, d);
            }
            m[i - i0] = top;
            sum[i - i0] = total;
          }
        }
        for (std::int64_t i = i0; i < i1; ++i) {
          const float inv = 1.0f / sum[i - i0];
          float* acc = o + w.o(b, i, h);
          for (std::int64_t k = 0; k < d; ++k) acc[k] *= inv;
          ls[w.l(b, i, h)] = m[i - i0] + std::log(sum[i - i0]);
        }
      }
}

[[gnu::always_inline]] inline void backward_body(const tensor& dout, const tensor& qkv, const tensor& out,
                                                 const tensor& lse, std::int64_t ctx, std::int64_t heads, tensor& dqkv,
                                                 std::int64_t tile) {
  check_tile(tile);
  const std::int64_t d = attention_head_dim(qkv, ctx, heads), n = qkv.dim(0), batch = n / ctx;
  const view w{ctx, heads, d, heads * d};
  if (dout.shape() != out.shape() || out.shape() != tensor::shape_type{n, heads * d} || dout.type() != dtype::f32 ||
      lse.numel() != batch * heads * ctx)
    throw std::invalid_argument("attention backward: the gradient " + dout.str() + " does not match the output " + out.str());
  ensure(dqkv, qkv.shape());
  const float* x = qkv.data<float>().data();
  const float* o = out.data<float>().data();
  const float* go = dout.data<float>().data();
  const float* ls = lse.data<float>().data();
  float* g = dqkv.data<float>().data();
  std::fill_n(g, dqkv.numel(), 0.0f);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  std::vector<float> delta(static_cast<std::size_t>(ctx)), prow(static_cast<std::size_t>(tile));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      // D_i = dout_i . out_i: the softmax's backward term per row.
      for (std::int64_t i = 0; i < ctx; ++i) delta[static_cast<std::size_t>(i)] = dot(go + w.o(b, i, h), o + w.o(b, i, h), d);
      for (std::int64_t i0 = 0; i0 < ctx; i0 += tile) {
        const std::int64_t i1 = std::min(ctx, i0 + tile);
        for (std::int64_t j0 = 0; j0 < i1; j0 += tile) {
          const std::int64_t j1 = std::min(i1, j0 + tile);
          for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t last = std::min(j1, i + 1);
            const float* q = x + w.q(b, i, h);
            const float* gi = go + w.o(b, i, h);
            float* dq = g + w.q(b, i, h);
            const float li = ls[w.l(b, i, h)], di = delta[static_cast<std::size_t>(i)];
            float* pr = prow.data();
            for (std::int64_t j = j0; j < last; ++j) pr[j - j0] = dot(q, x + w.k(b, j, h), d) * scale - li;
            for (std::int64_t j = 0; j < last - j0; ++j) pr[j] = detail::exp_approx(pr[j]);
            for (std::int64_t j = j0; j < last; ++j) {
              const float* kj = x + w.k(b, j, h);
              const float* vj = x + w.v(b, j, h);
              const float p = pr[j - j0];
              axpy(p, gi, g + w.v(b, j, h), d);  // dV_j += p dO_i
              const float ds = p * (dot(gi, vj, d) - di) * scale;
              axpy(ds, kj, dq, d);                // dQ_i += ds K_j
              axpy(ds, q, g + w.k(b, j, h), d);   // dK_j += ds Q_i
            }
          }
        }
      }
    }
}

[[gnu::target("avx2")]] void forward_avx2(const tensor& qkv, std::int64_t ctx, std::int64_t heads, tensor& out,
                                          tensor& lse, std::int64_t tile) {
  forward_body(qkv, ctx, heads, out, lse, tile);
}
void forward_baseline(const tensor& qkv, std::int64_t ctx, std::int64_t heads, tensor& out, tensor& lse,
                      std::int64_t tile) {
  forward_body(qkv, ctx, heads, out, lse, tile);
}
[[gnu::target("avx2")]] void backward_avx2(const tensor& dout, const tensor& qkv, const tensor& out, const tensor& lse,
                                           std::int64_t ctx, std::int64_t heads, tensor& dqkv, std::int64_t tile) {
  backward_body(dout, qkv, out, lse, ctx, heads, dqkv, tile);
}
void backward_baseline(const tensor& dout, const tensor& qkv, const tensor& out, const tensor& lse, std::int64_t ctx,
                       std::int64_t heads, tensor& dqkv, std::int64_t tile) {
  backward_body(dout, qkv, out, lse, ctx, heads, dqkv, tile);
}

bool has_avx2() noexcept {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

}  // namespace

void causal_attention_forward(const tensor& qkv, std::int64_t ctx, std::int64_t heads, tensor& out, tensor& lse,
                              std::int64_t tile) {
  (has_avx2() ? forward_avx2 : forward_baseline)(qkv, ctx, heads, out, lse, tile);
}

void causal_attention_backward(const tensor& dout, const tensor& qkv, const tensor& out, const tensor& lse,
                               std::int64_t ctx, std::int64_t heads, tensor& dqkv, std::int64_t tile) {
  (has_avx2() ? backward_avx2 : backward_baseline)(dout, qkv, out, lse, ctx, heads, dqkv, tile);
}

void causal_attention_forward_reference(const tensor& qkv, std::int64_t ctx, std::int64_t heads, tensor& out,
                                        tensor& lse) {
  const std::int64_t d = attention_head_dim(qkv, ctx, heads), n = qkv.dim(0), batch = n / ctx;
  const view w{ctx, heads, d, heads * d};
  ensure(out, {n, heads * d});
  ensure(lse, {batch * heads * ctx});
  auto x = qkv.data<float>();
  auto o = out.data<float>();
  auto ls = lse.data<float>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> s(static_cast<std::size_t>(ctx * ctx));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < ctx; ++i)
        for (std::int64_t j = 0; j < ctx; ++j) {
          double v = -std::numeric_limits<double>::infinity();  // the causal mask
          if (j <= i) {
            v = 0;
            for (std::int64_t k = 0; k < d; ++k) v += static_cast<double>(x[w.q(b, i, h) + k]) * x[w.k(b, j, h) + k];
            v *= scale;
          }
          s[i * ctx + j] = v;
        }
      for (std::int64_t i = 0; i < ctx; ++i) {
        double top = s[i * ctx];
        for (std::int64_t j = 1; j <= i; ++j) top = std::max(top, s[i * ctx + j]);
        double total = 0;
        for (std::int64_t j = 0; j < ctx; ++j) total += std::exp(s[i * ctx + j] - top);
        ls[w.l(b, i, h)] = static_cast<float>(top + std::log(total));
        for (std::int64_t k = 0; k < d; ++k) {
          double acc = 0;
          for (std::int64_t j = 0; j < ctx; ++j) acc += std::exp(s[i * ctx + j] - top) / total * x[w.v(b, j, h) + k];
          o[w.o(b, i, h) + k] = static_cast<float>(acc);
        }
      }
    }
}

void causal_attention_backward_reference(const tensor& dout, const tensor& qkv, std::int64_t ctx, std::int64_t heads,
                                         tensor& dqkv) {
  const std::int64_t d = attention_head_dim(qkv, ctx, heads), n = qkv.dim(0), batch = n / ctx;
  const view w{ctx, heads, d, heads * d};
  if (dout.shape() != tensor::shape_type{n, heads * d} || dout.type() != dtype::f32)
    throw std::invalid_argument("attention backward: the gradient " + dout.str() + " does not match the output");
  ensure(dqkv, qkv.shape());
  auto x = qkv.data<float>();
  auto go = dout.data<float>();
  auto g = dqkv.data<float>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> p(static_cast<std::size_t>(ctx * ctx)), dp(static_cast<std::size_t>(ctx * ctx)),
      dq(static_cast<std::size_t>(d)), dk(static_cast<std::size_t>(d)), dv(static_cast<std::size_t>(d));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h) {
      // P = softmax(S) row by row, by definition.
      for (std::int64_t i = 0; i < ctx; ++i) {
        double top = -std::numeric_limits<double>::infinity(), total = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double v = 0;
          for (std::int64_t k = 0; k < d; ++k) v += static_cast<double>(x[w.q(b, i, h) + k]) * x[w.k(b, j, h) + k];
          p[i * ctx + j] = v * scale;
          top = std::max(top, v * scale);
        }
        for (std::int64_t j = 0; j <= i; ++j) total += std::exp(p[i * ctx + j] - top);
        for (std::int64_t j = 0; j < ctx; ++j) p[i * ctx + j] = j <= i ? std::exp(p[i * ctx + j] - top) / total : 0.0;
      }
      // dP = dO V^T; dS = P * (dP - rowsum(P * dP)).
      for (std::int64_t i = 0; i < ctx; ++i) {
        double row = 0;
        for (std::int64_t j = 0; j < ctx; ++j) {
          double v = 0;
          for (std::int64_t k = 0; k < d; ++k) v += static_cast<double>(go[w.o(b, i, h) + k]) * x[w.v(b, j, h) + k];
          dp[i * ctx + j] = v;
          row += p[i * ctx + j] * v;
        }
        for (std::int64_t j = 0; j < ctx; ++j) dp[i * ctx + j] = p[i * ctx + j] * (dp[i * ctx + j] - row);
      }
      for (std::int64_t t = 0; t < ctx; ++t) {
        std::fill(dq.begin(), dq.end(), 0.0);
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        for (std::int64_t u = 0; u < ctx; ++u)
          for (std::int64_t k = 0; k < d; ++k) {
            dq[k] += dp[t * ctx + u] * scale * x[w.k(b, u, h) + k];  // dQ = dS K / sqrt(d)
            dk[k] += dp[u * ctx + t] * scale * x[w.q(b, u, h) + k];  // dK = dS^T Q / sqrt(d)
            dv[k] += p[u * ctx + t] * go[w.o(b, u, h) + k];          // dV = P^T dO
          }
        for (std::int64_t k = 0; k < d; ++k) {
          g[w.q(b, t, h) + k] = static_cast<float>(dq[k]);
          g[w.k(b, t, h) + k] = static_cast<float>(dk[k]);
          g[w.v(b, t, h) + k] = static_cast<float>(dv[k]);
        }
      }
    }
}

}  // namespace troupe::kernels
