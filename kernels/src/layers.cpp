#include "troupe/kernels/layers.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <random>
#include <stdexcept>
#include <utility>

#include "troupe/kernels/gemm.hpp"

#include "cuda_ops.hpp"
#include "dropout_mask.hpp"

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

// Device tensors: the layers below run their arithmetic where their parameters (or, for layers
// without parameters, their input) live, through cuda_ops.hpp, and refuse inputs elsewhere.
bool on_device(const tensor& t) { return !t.where().is_cpu(); }
/// A tensor's floats for a device kernel; the layers compute in f32 (the host path's data<float>
/// checks the same).
const float* fp(const tensor& t) {
  if (t.type() != dtype::f32) throw std::invalid_argument("the layers compute in f32; got " + t.str());
  return reinterpret_cast<const float*>(t.bytes());
}
float* fp(tensor& t) { return const_cast<float*>(fp(std::as_const(t))); }

void check_device(const tensor& x, device where, const std::string& who) {
  if (x.where() != where)
    throw std::invalid_argument(who + ": the input " + x.str() + " is not on " + where.str() +
                                ", where the parameters are: move it with .to()");
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
  linear(std::int64_t in, std::int64_t out)
      : in_(in), out_(out),
        w_{"weight", tensor::zeros({out, in}), tensor::zeros({out, in})},
        b_{"bias", tensor::zeros({1, out}), tensor::zeros({1, out})} {
    if (in < 1 || out < 1) throw std::invalid_argument("linear layer needs positive sizes");
  }
  std::string describe() const override {
    return "linear(" + std::to_string(in_) + "->" + std::to_string(out_) + ")";
  }
  tensor forward(const tensor& x, saved_activations& keep, bool) override {
    check_rows(x, in_, describe());
    const device where = w_.value.where();
    check_device(x, where, describe());
    tensor y = tensor::empty({x.dim(0), out_}, dtype::f32, where);
    gemm(x, false, w_.value, true, y);
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
  std::vector<parameter*> parameters() override { return {&w_, &b_}; }
  void initialize(std::uint64_t seed) override {
    std::mt19937_64 g(seed);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    for (auto* p : {&w_, &b_}) {
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
  parameter w_, b_;
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
    auto xd = x.data<float>();
    auto yd = y.data<float>();
    for (std::size_t i = 0; i < xd.size(); ++i) yd[i] = f(xd[i]);
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
    auto k = keep.tensors[0].data<float>();
    auto d = dy.data<float>();
    auto o = dx.data<float>();
    for (std::size_t i = 0; i < d.size(); ++i) o[i] = d[i] * df(k[i]);
    keep.clear();  // nothing is left for backward_weight
    return dx;
  }

protected:
  virtual float f(float x) const = 0;
  /// The derivative, from the kept value (the output when keeps_output(), else the input).
  virtual float df(float kept) const = 0;
  virtual bool keeps_output() const { return false; }
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
  float f(float x) const override {
    return static_cast<float>(0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))));
  }
  float df(float x) const override {
    const double cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * static_cast<double>(x) * x) / std::sqrt(2.0 * M_PI);
    return static_cast<float>(cdf + x * pdf);
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

class residual final : public layer {
  /// a + b, element by element (same shapes).
  static tensor sum(const tensor& a, const tensor& b) {
    check_device(b, a.where(), "residual");
    tensor out = tensor::empty(a.shape(), dtype::f32, a.where());
    if (on_device(a)) {
      cuda::add(a.where().index, fp(a), fp(b), fp(out), a.numel());
      return out;
    }
    auto x = a.data<float>();
    auto y = b.data<float>();
    auto o = out.data<float>();
    for (std::size_t i = 0; i < x.size(); ++i) o[i] = x[i] + y[i];
    return out;
  }

public:
  explicit residual(std::unique_ptr<layer> inner) : inner_(std::move(inner)) {
    if (!inner_) throw std::invalid_argument("residual: the inner layer is null");
  }
  std::string describe() const override { return "residual(" + inner_->describe() + ")"; }
  tensor forward(const tensor& x, saved_activations& keep, bool training) override {
    keep.clear();
    keep.children.resize(1);
    tensor fx = inner_->forward(x, keep.children[0], training);
    if (fx.shape() != x.shape())
      throw std::invalid_argument(describe() + ": the inner layers change the shape " + x.str() + " to " + fx.str());
    return sum(x, fx);
  }
  tensor backward_input(const tensor& dy, saved_activations& keep) override {
    if (keep.children.size() != 1) throw std::logic_error(describe() + ": backward without forward");
    return sum(dy, inner_->backward_input(dy, keep.children[0]));
  }
  void backward_weight(const tensor& dy, saved_activations& keep) override {
    if (keep.children.size() != 1) throw std::logic_error(describe() + ": backward without forward");
    inner_->backward_weight(dy, keep.children[0]);
    keep.clear();
  }
  std::vector<parameter*> parameters() override { return inner_->parameters(); }
  void initialize(std::uint64_t seed) override { inner_->initialize(seed); }
  void save_random_state(std::vector<std::string>& out) const override { inner_->save_random_state(out); }
  void load_random_state(const std::vector<std::string>& in, std::size_t& next) override {
    inner_->load_random_state(in, next);
  }

private:
  std::unique_ptr<layer> inner_;
};

}  // namespace

std::unique_ptr<layer> make_linear(std::int64_t in, std::int64_t out) {
  auto l = std::make_unique<linear>(in, out);
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
std::unique_ptr<layer> make_residual(std::unique_ptr<layer> inner) {
  return std::make_unique<residual>(std::move(inner));
}

sequential::sequential(std::vector<std::unique_ptr<layer>> layers) {
  for (auto& l : layers) add(std::move(l));
}

void sequential::add(std::unique_ptr<layer> l) {
  if (!l) throw std::invalid_argument("sequential: a null layer");
  // Each parameter is named by its path from here, as PyTorch's nn.Sequential names them.
  const std::string prefix = std::to_string(layers_.size()) + ".";
  for (auto* p : l->parameters()) p->name.insert(0, prefix);
  layers_.push_back(std::move(l));
}

std::string sequential::describe() const {
  std::string out = "sequential(";
  for (std::size_t i = 0; i < layers_.size(); ++i) out += (i ? ", " : "") + layers_[i]->describe();
  return out + ")";
}

tensor sequential::forward(const tensor& x, saved_activations& keep, bool training) {
  keep.clear();
  keep.children.resize(layers_.size());
  tensor h = x;
  for (std::size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward(h, keep.children[i], training);
  return h;
}

tensor sequential::backward_input(const tensor& dy, saved_activations& keep) {
  if (keep.children.size() != layers_.size())
    throw std::logic_error("sequential: backward without a matching forward");
  keep.output_grads.assign(layers_.size(), tensor());
  tensor g = dy;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    if (layers_[i]->needs_output_grad()) keep.output_grads[i] = g;
    g = layers_[i]->backward_input(g, keep.children[i]);
  }
  return g;
}

void sequential::backward_weight(const tensor&, saved_activations& keep) {
  if (keep.children.size() != layers_.size() || keep.output_grads.size() != layers_.size())
    throw std::logic_error("sequential: backward_weight before backward_input");
  for (std::size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i]->needs_output_grad()) layers_[i]->backward_weight(keep.output_grads[i], keep.children[i]);
  keep.clear();
}

std::vector<parameter*> sequential::parameters() {
  std::vector<parameter*> out;
  for (auto& l : layers_)
    for (auto* p : l->parameters()) out.push_back(p);
  return out;
}

void sequential::save_random_state(std::vector<std::string>& out) const {
  for (const auto& l : layers_) l->save_random_state(out);
}

void sequential::load_random_state(const std::vector<std::string>& in, std::size_t& next) {
  // All or nothing: a bad entry leaves every layer as it was.
  std::vector<std::string> before;
  save_random_state(before);
  std::size_t at = next;
  try {
    for (auto& l : layers_) l->load_random_state(in, at);
  } catch (...) {
    std::size_t back = 0;
    for (auto& l : layers_) l->load_random_state(before, back);
    throw;
  }
  next = at;
}

void sequential::initialize(std::uint64_t seed) {
  // One generator stream per layer, derived from the seed and the layer's position.
  for (std::size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->initialize(seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull);
}

std::vector<std::int64_t> mlp_sizes(const std::string& spec) {
  const std::string prefix = "mlp:";
  if (spec.rfind(prefix, 0) != 0)
    throw std::invalid_argument("model '" + spec + "' is not of the form mlp:784-256-128-10");
  constexpr std::int64_t widest = std::int64_t{1} << 20, most_params = std::int64_t{1} << 28;
  std::vector<std::int64_t> sizes;
  const std::string rest = spec.substr(prefix.size());
  std::size_t pos = 0;
  for (;;) {
    const auto dash = rest.find('-', pos);
    const auto item = rest.substr(pos, dash == std::string::npos ? std::string::npos : dash - pos);
    // Digits only (strtoll would take spaces and signs); more than 7 is beyond the limit anyway.
    const bool digits =
        !item.empty() && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && (item.size() > 7 || std::stoll(item) > widest))
      throw std::invalid_argument("model '" + spec + "': a layer of " + item + " units (at most " +
                                  std::to_string(widest) + ")");
    const std::int64_t v = digits ? std::stoll(item) : 0;
    if (v < 1) throw std::invalid_argument("model '" + spec + "': '" + item + "' is not a positive layer size");
    sizes.push_back(v);
    if (dash == std::string::npos) break;
    pos = dash + 1;
  }
  if (sizes.size() < 2) throw std::invalid_argument("model '" + spec + "' needs at least an input and an output size");
  std::int64_t params = 0;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) params += sizes[i] * sizes[i + 1] + sizes[i + 1];
  if (params > most_params)
    throw std::invalid_argument("model '" + spec + "' has " + std::to_string(params) + " parameters (at most " +
                                std::to_string(most_params) + ")");
  return sizes;
}

namespace {

/// Reads what describe() writes (make_layer's grammar), one layer at a time: a first pass checks
/// the whole text and counts its parameters without building anything, the second builds.
class description_reader {
public:
  explicit description_reader(std::string_view text) : text_(text) {}

  std::unique_ptr<layer> whole() {
    read(true);
    return read(false);
  }
  std::int64_t parameters() {
    read(true);
    return params_;
  }

private:
  std::unique_ptr<layer> read(bool dry) {
    dry_ = dry;
    pos_ = 0;
    params_ = 0;
    auto l = next_layer(0);
    if (pos_ != text_.size()) fail("unexpected text after the layer");
    return l;
  }

  static constexpr int deepest = 64;
  static constexpr std::int64_t widest = std::int64_t{1} << 20, most_params = std::int64_t{1} << 28;

  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument("layer description '" + std::string(text_) + "': " + why + " (at character " +
                                std::to_string(pos_) + ")");
  }
  bool eat(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }
  void expect(std::string_view s) {
    if (!eat(s)) fail("expected '" + std::string(s) + "'");
  }
  std::string_view word() {
    const auto start = pos_;
    while (pos_ < text_.size() && (std::isalpha(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    return text_.substr(start, pos_ - start);
  }
  std::int64_t size() {
    std::int64_t v = 0;
    const auto r = std::from_chars(text_.data() + pos_, text_.data() + text_.size(), v);
    if (r.ec != std::errc() || v < 1 || v > widest)
      fail("expected a size from 1 to " + std::to_string(widest));
    pos_ = static_cast<std::size_t>(r.ptr - text_.data());
    return v;
  }
  /// Adds a layer's parameters to the description's total, which has a limit as mlp_sizes has
  /// (a few bytes of text must not allocate gigabytes).
  void count_params(std::int64_t n) {
    params_ += n;
    if (params_ > most_params)
      fail("more than " + std::to_string(most_params) + " parameters in all");
  }
  float number() {
    float v = 0;
    const auto r = std::from_chars(text_.data() + pos_, text_.data() + text_.size(), v);
    if (r.ec != std::errc() || !std::isfinite(v)) fail("expected a number");
    pos_ = static_cast<std::size_t>(r.ptr - text_.data());
    return v;
  }

  std::unique_ptr<layer> next_layer(int depth) {
    if (depth > deepest) fail("layers nested more than " + std::to_string(deepest) + " deep");
    const auto name = word();
    if (name == "relu") return dry_ ? nullptr : make_relu();
    if (name == "gelu") return dry_ ? nullptr : make_gelu();
    if (name == "linear") {
      expect("(");
      const auto in = size();
      expect("->");
      const auto out = size();
      expect(")");
      count_params(in * out + out);
      return dry_ ? nullptr : make_linear(in, out);
    }
    if (name == "layer_norm") {
      expect("(");
      const auto n = size();
      float eps = 1e-5f;
      if (eat(", eps=")) eps = number();
      expect(")");
      if (!(eps > 0)) fail("eps must be positive");
      count_params(2 * n);
      return dry_ ? nullptr : make_layer_norm(n, eps);
    }
    if (name == "dropout") {
      expect("(");
      const float p = number();
      expect(")");
      if (!(p >= 0.0f && p < 1.0f)) fail("a dropout probability must be in [0, 1)");
      return dry_ ? nullptr : make_dropout(p);
    }
    if (name == "residual") {
      expect("(");
      auto inner = next_layer(depth + 1);
      expect(")");
      return dry_ ? nullptr : make_residual(std::move(inner));
    }
    if (name == "sequential") {
      expect("(");
      auto seq = dry_ ? nullptr : std::make_unique<sequential>();
      if (!eat(")")) {
        do {
          auto l = next_layer(depth + 1);
          if (seq) seq->add(std::move(l));
        } while (eat(", "));
        expect(")");
      }
      return seq;
    }
    fail(name.empty() ? std::string("expected a layer") : "'" + std::string(name) + "' is not a layer troupe knows");
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::int64_t params_ = 0;
  bool dry_ = false;
};

}  // namespace

std::unique_ptr<layer> make_layer(std::string_view description) {
  return description_reader(description).whole();
}

std::int64_t parameter_count(std::string_view description) { return description_reader(description).parameters(); }

std::unique_ptr<sequential> make_mlp(const std::string& spec) {
  const auto sizes = mlp_sizes(spec);
  auto m = std::make_unique<sequential>();
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i) m->add(make_relu());
    m->add(make_linear(sizes[i], sizes[i + 1]));
  }
  return m;
}

namespace {
std::int64_t label_at(const tensor& labels, std::int64_t i) {
  switch (labels.type()) {
    case dtype::u8: return labels.data<std::uint8_t>()[i];
    case dtype::i32: return labels.data<std::int32_t>()[i];
    case dtype::i64: return labels.data<std::int64_t>()[i];
    default: throw std::invalid_argument("labels must be u8, i32 or i64, not " + labels.str());
  }
}

/// Logits f32 [N, C] with N, C >= 1 and labels [N]; `what` names the caller in the errors.
void check_logits(const tensor& logits, const tensor& labels, const char* what) {
  if (logits.rank() != 2 || logits.type() != dtype::f32 || logits.dim(0) < 1 || logits.dim(1) < 1)
    throw std::invalid_argument(std::string(what) + " expects f32 logits [N, C] with N, C >= 1, got " + logits.str());
  if (labels.rank() != 1 || labels.dim(0) != logits.dim(0))
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(logits.dim(0)) + " rows of logits but labels " +
                                labels.str());
}

std::int64_t checked_label(const tensor& labels, std::int64_t i, std::int64_t classes) {
  const std::int64_t y = label_at(labels, i);
  if (y < 0 || y >= classes)
    throw std::invalid_argument("label " + std::to_string(y) + " of row " + std::to_string(i) + " is outside 0.." +
                                std::to_string(classes - 1));
  return y;
}
}  // namespace

double softmax_cross_entropy(const tensor& logits, const tensor& labels, tensor& dlogits) {
  check_logits(logits, labels, "softmax_cross_entropy");
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  if (!dlogits.defined() || dlogits.shape() != logits.shape() || dlogits.where() != logits.where())
    dlogits = tensor::empty(logits.shape(), dtype::f32, logits.where());
  if (on_device(logits)) {
    // Labels as int64 on the logits' device.
    tensor host = labels.to(device::cpu()), wide = tensor::empty({n}, dtype::i64);
    for (std::int64_t i = 0; i < n; ++i) wide.data<std::int64_t>()[i] = checked_label(host, i, c);
    const tensor dev = wide.to(logits.where());
    return cuda::softmax_cross_entropy(logits.where().index, fp(logits),
                                       reinterpret_cast<const std::int64_t*>(dev.bytes()), fp(dlogits), n, c);
  }
  auto z = logits.data<float>();
  auto g = dlogits.data<float>();
  double loss = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t y = checked_label(labels, i, c);
    const float* row = z.data() + i * c;
    float top = row[0];
    for (std::int64_t j = 1; j < c; ++j) top = std::max(top, row[j]);
    double sum = 0;
    for (std::int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(row[j]) - top);
    loss += std::log(sum) + top - row[y];
    for (std::int64_t j = 0; j < c; ++j) {
      const double p = std::exp(static_cast<double>(row[j]) - top) / sum;
      g[i * c + j] = static_cast<float>((p - (j == y ? 1.0 : 0.0)) / static_cast<double>(n));
    }
  }
  return loss / static_cast<double>(n);
}

std::int64_t count_correct(const tensor& logits_in, const tensor& labels_in) {
  const tensor logits = logits_in.to(device::cpu()), labels = labels_in.to(device::cpu());
  check_logits(logits, labels, "count_correct");
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  auto z = logits.data<float>();
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < c; ++j)
      if (z[i * c + j] > z[i * c + best]) best = j;
    if (best == checked_label(labels, i, c)) ++correct;
  }
  return correct;
}

}  // namespace troupe::kernels
