// The layer kinds: linear, ReLU, GELU, layer norm and dropout, each computing on the host or,
// through cuda_ops.hpp, on the device its parameters (or its input) live on. Composition
// (sequential, residual) is in layers_compose.cpp, descriptions (make_layer, make_mlp) in
// layers_describe.cpp, the losses in losses.cpp.

#include "troupe/kernels/layers.hpp"

#include <charconv>
#include <cmath>
#include <random>
#include <stdexcept>

#include "troupe/kernels/gemm.hpp"

#include "cuda_ops.hpp"
#include "dropout_mask.hpp"
#include "fast_gelu.hpp"
#include "layer_device.hpp"

namespace troupe::kernels {

std::size_t saved_activations::bytes() const {
  std::size_t n = 0;
  for (const auto& t : tensors) n += t.nbytes();
  for (const auto& t : output_grads) n += t.nbytes();
  for (const auto& c : children) n += c.bytes();
  return n;
}

void saved_activations::clear() {
  tensors.clear();
  children.clear();
  output_grads.clear();
}

namespace {

using detail::check_device;
using detail::fp;
using detail::on_device;

/// Uniform doubles in [0, 1) from 53 bits of the generator: the same on every platform.
double uniform01(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

void check_rows(const tensor& x, std::int64_t features, const std::string& who) {
  if (x.rank() != 2 || x.type() != dtype::f32 || x.dim(1) != features)
    throw std::invalid_argument(who + " expects f32 [batch, " + std::to_string(features) + "], got " + x.str());
}

void check_same(const tensor& dy, const tensor& like, const std::string& who) {
  if (dy.shape() != like.shape() || dy.type() != dtype::f32)
    throw std::invalid_argument(who + ": the gradient " + dy.str() + " does not match the output " + like.str());
}

void check_kept(const saved_activations& keep, std::size_t n, const std::string& who) {
  if (keep.tensors.size() < n)
    throw std::logic_error(who + ": backward without a matching forward (or after it was freed)");
}

/// The shortest text that reads back as `v` (descriptions are exact, so make_layer rebuilds them).
std::string exact(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

/// Writes host values into t, wherever t lives.
void assign(tensor& t, const tensor& host) { copy(host, t); }

class linear final : public layer {
public:
  linear(std::int64_t in, std::int64_t out, bool bias)
      : in_(in), out_(out), bias_(bias),
        w_{"weight", tensor::zeros({out, in}), tensor::zeros({out, in})},
        b_{"bias", tensor::zeros({1, out}), tensor::zeros({1, out})} {
    if (in < 1 || out < 1) throw std::invalid_argument("linear layer needs positive sizes");
  }
  std::string describe() const override {
    return "linear(" + std::to_string(in_) + "->" + std::to_string(out_) + (bias_ ? ")" : ", bias=false)");
  }
  tensor forward(const tensor& x, saved_activations& keep, bool) override {
    check_rows(x, in_, describe());
    const device where = w_.value.where();
    check_device(x, where, describe());
    tensor y = tensor::empty({x.dim(0), out_}, dtype::f32, where);
    gemm(x, false, w_.value, true, y);
    if (!bias_) {
      keep.tensors = {x};
      return y;
    }
    if (on_device(y)) {
      cuda::add_bias_rows(where.index, fp(y), fp(b_.value), x.dim(0), out_);
      keep.tensors = {x};
      return y;
    }
    auto yd = y.data<float>();
    auto bd = b_.value.data<float>();
    for (std::int64_t i = 0; i < x.dim(0); ++i)
      for (std::int64_t j = 0; j < out_; ++j) yd[i * out_ + j] += bd[j];
    keep.tensors = {x};
    return y;
  }
  tensor backward_input(const tensor& dy, saved_activations& keep) override {
    check_kept(keep, 1, describe());
    check_rows(dy, out_, describe() + " backward");
    check_batch(dy, keep.tensors[0]);
    check_device(dy, w_.value.where(), describe() + " backward");
    tensor dx = tensor::empty({dy.dim(0), in_}, dtype::f32, w_.value.where());
    gemm(dy, false, w_.value, false, dx);
    return dx;  // x stays: backward_weight needs it
  }
  void backward_weight(const tensor& dy, saved_activations& keep) override {
    check_kept(keep, 1, describe());
    check_rows(dy, out_, describe() + " backward");
    check_batch(dy, keep.tensors[0]);
    check_device(dy, w_.value.where(), describe() + " backward");
    gemm(dy, true, keep.tensors[0], false, w_.grad, 1.0f, 1.0f);
    if (!bias_) {
      keep.clear();
      return;
    }
    if (on_device(dy)) {
      cuda::accumulate_column_sums(dy.where().index, fp(dy), fp(b_.grad), dy.dim(0), out_);
      keep.clear();
      return;
    }
    auto g = b_.grad.data<float>();
    auto d = dy.data<float>();
    for (std::int64_t i = 0; i < dy.dim(0); ++i)
      for (std::int64_t j = 0; j < out_; ++j) g[j] += d[i * out_ + j];
    keep.clear();
  }
  std::vector<parameter*> parameters() override {
    if (!bias_) return {&w_};
    return {&w_, &b_};
  }
  void initialize(std::uint64_t seed) override {
    std::mt19937_64 g(seed);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    for (auto* p : parameters()) {
      tensor v = tensor::empty(p->value.shape());
      for (float& e : v.data<float>()) e = static_cast<float>((2 * uniform01(g) - 1) * bound);
      assign(p->value, v);
      assign(p->grad, tensor::zeros(p->grad.shape()));
    }
  }

private:
  /// dy has a row per row of the kept input x.
  void check_batch(const tensor& dy, const tensor& x) const {
    if (dy.dim(0) != x.dim(0))
      throw std::invalid_argument(describe() + " backward: the gradient " + dy.str() + " does not match the output f32[" +
                                  std::to_string(x.dim(0)) + ", " + std::to_string(out_) + "]");
  }
  std::int64_t in_, out_;
  bool bias_;
  parameter w_, b_;  // b_ is unused (and stays [1, out] of zeros) without a bias
};

/// Element-wise activation layers: y = f(x), dx = dy * f'(kept).
class elementwise : public layer {
public:
  tensor forward(const tensor& x, saved_activations& keep, bool) override {
    if (x.type() != dtype::f32) throw std::invalid_argument(describe() + " expects f32, got " + x.str());
    tensor y = tensor::empty(x.shape(), dtype::f32, x.where());
    if (on_device(x)) {
      cuda::activation_forward(x.where().index, device_kind(), fp(x), fp(y), x.numel());
      keep.tensors = {keeps_output() ? y : x};
      return y;
    }
    forward_rows(x.data<float>().data(), y.data<float>().data(), static_cast<std::size_t>(x.numel()));
    keep.tensors = {keeps_output() ? y : x};
    return y;
  }
  tensor backward_input(const tensor& dy, saved_activations& keep) override {
    check_kept(keep, 1, describe());
    check_same(dy, keep.tensors[0], describe());
    check_device(dy, keep.tensors[0].where(), describe() + " backward");
    tensor dx = tensor::empty(dy.shape(), dtype::f32, dy.where());
    if (on_device(dy)) {
      cuda::activation_backward(dy.where().index, device_kind(), fp(keep.tensors[0]), fp(dy), fp(dx), dy.numel());
      keep.clear();
      return dx;
    }
    backward_rows(keep.tensors[0].data<float>().data(), dy.data<float>().data(), dx.data<float>().data(),
                  static_cast<std::size_t>(dy.numel()));
    keep.clear();  // nothing is left for backward_weight
    return dx;
  }

protected:
  virtual float f(float x) const = 0;
  /// The derivative, from the kept value (the output when keeps_output(), else the input).
  virtual float df(float kept) const = 0;
  virtual bool keeps_output() const { return false; }
  /// y = f(x) over n elements; a layer whose loop vectorizes when written out overrides it.
  virtual void forward_rows(const float* x, float* y, std::size_t n) const {
    for (std::size_t i = 0; i < n; ++i) y[i] = f(x[i]);
  }
  /// dx = dy * f'(kept) over n elements.
  virtual void backward_rows(const float* kept, const float* dy, float* dx, std::size_t n) const {
    for (std::size_t i = 0; i < n; ++i) dx[i] = dy[i] * df(kept[i]);
  }
  /// The same function in cuda_ops.hpp.
  virtual cuda::activation device_kind() const = 0;
};

class relu final : public elementwise {
public:
  std::string describe() const override { return "relu"; }

protected:
  float f(float x) const override { return x > 0 ? x : 0.0f; }
  float df(float y) const override { return y > 0 ? 1.0f : 0.0f; }
  bool keeps_output() const override { return true; }
  cuda::activation device_kind() const override { return cuda::activation::relu; }
};

class gelu final : public elementwise {
public:
  std::string describe() const override { return "gelu"; }

protected:
  // In float, vectorized (fast_gelu.hpp: within 4e-7 * (1 + |x|) of the exact x Phi(x)).
  float f(float x) const override { return detail::gelu_value(x); }
  float df(float x) const override { return detail::gelu_slope(x); }
  void forward_rows(const float* x, float* y, std::size_t n) const override { detail::gelu_rows(x, y, n); }
  void backward_rows(const float* kept, const float* dy, float* dx, std::size_t n) const override {
    detail::gelu_grad_rows(kept, dy, dx, n);
  }
  cuda::activation device_kind() const override { return cuda::activation::gelu; }
};

class layer_norm final : public layer {
public:
  layer_norm(std::int64_t features, float eps)
      : n_(features), eps_(eps),
        gamma_{"gamma", tensor::zeros({1, features}), tensor::zeros({1, features})},
        beta_{"beta", tensor::zeros({1, features}), tensor::zeros({1, features})} {
    if (features < 1) throw std::invalid_argument("layer_norm needs at least one feature");
    if (!(eps > 0) || !std::isfinite(eps)) throw std::invalid_argument("layer_norm: eps must be a positive number");
    initialize(0);
  }
  std::string describe() const override {
    return "layer_norm(" + std::to_string(n_) + (eps_ == 1e-5f ? "" : ", eps=" + exact(eps_)) + ")";
  }
  tensor forward(const tensor& x, saved_activations& keep, bool) override {
    check_rows(x, n_, describe());
    const std::int64_t rows = x.dim(0);
    const device where = gamma_.value.where();
    check_device(x, where, describe());
    tensor y = tensor::empty(x.shape(), dtype::f32, where), xhat = tensor::empty(x.shape(), dtype::f32, where),
           rstd = tensor::empty({rows, 1}, dtype::f32, where);
    keep.tensors = {xhat, rstd};
    if (on_device(x)) {
      cuda::layer_norm_forward(where.index, fp(x), fp(gamma_.value), fp(beta_.value), eps_, fp(y), fp(xhat), fp(rstd),
                               rows, n_);
      return y;
    }
    auto xd = x.data<float>();
    auto yd = y.data<float>();
    auto hd = xhat.data<float>();
    auto rd = rstd.data<float>();
    auto gd = gamma_.value.data<float>();
    auto bd = beta_.value.data<float>();
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* row = xd.data() + i * n_;
      double mean = 0, var = 0;
      for (std::int64_t j = 0; j < n_; ++j) mean += row[j];
      mean /= static_cast<double>(n_);
      for (std::int64_t j = 0; j < n_; ++j) var += (row[j] - mean) * (row[j] - mean);
      var /= static_cast<double>(n_);
      const double r = 1.0 / std::sqrt(var + eps_);
      rd[i] = static_cast<float>(r);
      for (std::int64_t j = 0; j < n_; ++j) {
        const float h = static_cast<float>((row[j] - mean) * r);
        hd[i * n_ + j] = h;
        yd[i * n_ + j] = h * gd[j] + bd[j];
      }
    }
    return y;
  }
  tensor backward_input(const tensor& dy, saved_activations& keep) override {
    check_kept(keep, 2, describe());
    check_same(dy, keep.tensors[0], describe());
    const std::int64_t rows = dy.dim(0);
    check_device(dy, gamma_.value.where(), describe() + " backward");
    tensor dx = tensor::empty(dy.shape(), dtype::f32, dy.where());
    if (on_device(dy)) {
      cuda::layer_norm_backward_input(dy.where().index, fp(dy), fp(keep.tensors[0]), fp(keep.tensors[1]),
                                      fp(gamma_.value), fp(dx), rows, n_);
      keep.tensors.resize(1);
      return dx;
    }
    auto d = dy.data<float>();
    auto h = keep.tensors[0].data<float>();
    auto r = keep.tensors[1].data<float>();
    auto g = gamma_.value.data<float>();
    auto o = dx.data<float>();
    for (std::int64_t i = 0; i < rows; ++i) {
      double mean_dh = 0, mean_dh_h = 0;
      for (std::int64_t j = 0; j < n_; ++j) {
        const double dh = static_cast<double>(d[i * n_ + j]) * g[j];
        mean_dh += dh;
        mean_dh_h += dh * h[i * n_ + j];
      }
      mean_dh /= static_cast<double>(n_);
      mean_dh_h /= static_cast<double>(n_);
      for (std::int64_t j = 0; j < n_; ++j) {
        const double dh = static_cast<double>(d[i * n_ + j]) * g[j];
        o[i * n_ + j] = static_cast<float>(r[i] * (dh - mean_dh - h[i * n_ + j] * mean_dh_h));
      }
    }
    keep.tensors.resize(1);  // x-hat stays for the weight gradients
    return dx;
  }
  void backward_weight(const tensor& dy, saved_activations& keep) override {
    check_kept(keep, 1, describe());
    check_same(dy, keep.tensors[0], describe());
    check_device(dy, gamma_.value.where(), describe() + " backward");
    if (on_device(dy)) {
      cuda::layer_norm_backward_weight(dy.where().index, fp(dy), fp(keep.tensors[0]), fp(gamma_.grad), fp(beta_.grad),
                                       dy.dim(0), n_);
      keep.clear();
      return;
    }
    auto d = dy.data<float>();
    auto h = keep.tensors[0].data<float>();
    auto gg = gamma_.grad.data<float>();
    auto bg = beta_.grad.data<float>();
    for (std::int64_t i = 0; i < dy.dim(0); ++i)
      for (std::int64_t j = 0; j < n_; ++j) {
        gg[j] += d[i * n_ + j] * h[i * n_ + j];
        bg[j] += d[i * n_ + j];
      }
    keep.clear();
  }
  std::vector<parameter*> parameters() override { return {&gamma_, &beta_}; }
  void initialize(std::uint64_t) override {
    tensor ones = tensor::empty(gamma_.value.shape());
    for (float& v : ones.data<float>()) v = 1;
    assign(gamma_.value, ones);
    assign(beta_.value, tensor::zeros(beta_.value.shape()));
    for (auto* p : {&gamma_, &beta_}) assign(p->grad, tensor::zeros(p->grad.shape()));
  }

private:
  std::int64_t n_;
  float eps_;
  parameter gamma_, beta_;
};

/// Dropout with counter-based masks (dropout_mask.hpp): the forward keeps which draw it was and
/// the shape (8 bytes per dimension), and the backward, on the host or the device, draws the same
/// mask again; no mask is kept or copied.
class dropout final : public layer {
public:
  explicit dropout(float p) : p_(p) {
    if (!(p >= 0.0f && p < 1.0f)) throw std::invalid_argument("dropout probability must be in [0, 1)");
  }
  std::string describe() const override { return "dropout(" + exact(p_) + ")"; }
  tensor forward(const tensor& x, saved_activations& keep, bool training) override {
    if (!training || p_ == 0.0f) {
      keep.clear();
      keep.tensors = {tensor()};  // no mask: the backward is the identity (and may run once)
      return x;
    }
    const std::uint64_t key = dropout_mask::stream_key(seed_, calls_);
    tensor y = apply(key, x);
    // What the backward needs to draw the mask again: which forward it was, and its shape.
    tensor drawn = tensor::empty({static_cast<std::int64_t>(x.rank()) + 1}, dtype::i64);
    auto dd = drawn.data<std::int64_t>();
    dd[0] = static_cast<std::int64_t>(calls_);
    for (int d = 0; d < x.rank(); ++d) dd[static_cast<std::size_t>(d) + 1] = x.dim(d);
    ++calls_;
    keep.tensors = {drawn};
    return y;
  }
  tensor backward_input(const tensor& dy, saved_activations& keep) override {
    check_kept(keep, 1, describe());
    const tensor& kept_tensor = keep.tensors[0];
    if (!kept_tensor.defined()) {  // evaluation mode: the identity
      keep.clear();
      return dy;
    }
    auto dd = kept_tensor.data<std::int64_t>();
    const tensor::shape_type shape(dd.begin() + 1, dd.end());
    if (dy.shape() != shape || dy.type() != dtype::f32)
      throw std::invalid_argument(describe() + ": the gradient " + dy.str() + " does not match the output " +
                                  tensor::empty(shape).str());
    tensor dx = apply(dropout_mask::stream_key(seed_, static_cast<std::uint64_t>(dd[0])), dy);
    keep.clear();
    return dx;
  }
  void initialize(std::uint64_t seed) override {
    seed_ = seed;
    calls_ = 0;
  }
  void save_random_state(std::vector<std::string>& out) const override {
    out.push_back("dropout " + std::to_string(seed_) + " " + std::to_string(calls_));
  }
  void load_random_state(const std::vector<std::string>& in, std::size_t& next) override {
    if (next >= in.size()) throw std::invalid_argument(describe() + ": no random state left to load");
    const std::string& e = in[next];
    std::uint64_t seed = 0, calls = 0;
    const char* p = e.data();
    const char* end = e.data() + e.size();
    bool ok = e.starts_with("dropout ");
    if (ok) {
      auto r = std::from_chars(p + 8, end, seed);
      ok = r.ec == std::errc() && r.ptr != end && *r.ptr == ' ';
      if (ok) {
        r = std::from_chars(r.ptr + 1, end, calls);
        ok = r.ec == std::errc() && r.ptr == end;
      }
    }
    if (!ok)
      throw std::invalid_argument(describe() + ": entry " + std::to_string(next) +
                                  " is not a dropout generator's state (\"dropout SEED DRAWS\")");
    seed_ = seed;
    calls_ = calls;
    ++next;
  }

private:
  /// x times the mask of `key`: 1 / (1 - p) for an element kept, 0 for one dropped (multiplied
  /// in: a NaN stays a NaN), where x lives.
  tensor apply(std::uint64_t key, const tensor& x) const {
    const float scale = 1.0f / (1.0f - p_);
    tensor y = tensor::empty(x.shape(), dtype::f32, x.where());
    if (on_device(x)) {
      cuda::dropout(x.where().index, key, p_, scale, fp(x), fp(y), x.numel());
      return y;
    }
    auto xd = x.data<float>();
    auto yd = y.data<float>();
    for (std::size_t i = 0; i < xd.size(); ++i) yd[i] = xd[i] * (dropout_mask::kept(key, i, p_) ? scale : 0.0f);
    return y;
  }

  float p_;
  std::uint64_t seed_ = 0;
  std::uint64_t calls_ = 0;  // training forwards drawn since the seed
};

}  // namespace

std::unique_ptr<layer> make_linear(std::int64_t in, std::int64_t out, bool bias) {
  auto l = std::make_unique<linear>(in, out, bias);
  l->initialize(0);
  return l;
}
void move_to(layer& l, device where) {
  for (auto* p : l.parameters()) {
    p->value = p->value.to(where);
    p->grad = p->grad.to(where);
  }
}

std::unique_ptr<layer> make_relu() { return std::make_unique<relu>(); }
std::unique_ptr<layer> make_gelu() { return std::make_unique<gelu>(); }
std::unique_ptr<layer> make_layer_norm(std::int64_t features, float eps) {
  return std::make_unique<layer_norm>(features, eps);
}
std::unique_ptr<layer> make_dropout(float p) { return std::make_unique<dropout>(p); }

}  // namespace troupe::kernels
