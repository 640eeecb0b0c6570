// Layers made of layers: sequential (in order, naming parameters by their place) and residual
// (x + f(x)).

#include "troupe/kernels/layers.hpp"

#include <stdexcept>
#include <utility>

#include "cuda_ops.hpp"
#include "layer_device.hpp"

namespace troupe::kernels {

namespace {

using detail::check_device;
using detail::fp;
using detail::on_device;

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

}  // namespace troupe::kernels
