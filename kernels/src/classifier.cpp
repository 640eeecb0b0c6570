#include "troupe/kernels/classifier.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "classifier_fused.hpp"

namespace troupe::kernels {

namespace {

std::atomic<int> simd_cap{2};

/// "linear(784->100)" -> {784, 100}; false for anything else.
bool linear_sizes(const std::string& d, int& in, int& out) {
  const std::string head = "linear(";
  if (d.rfind(head, 0) != 0 || d.back() != ')') return false;
  const auto arrow = d.find("->", head.size());
  if (arrow == std::string::npos) return false;
  const char* b = d.data();
  auto a = std::from_chars(b + head.size(), b + arrow, in);
  auto c = std::from_chars(b + arrow + 2, b + d.size() - 1, out);
  return a.ec == std::errc() && a.ptr == b + arrow && c.ec == std::errc() && c.ptr == b + d.size() - 1;
}

/// The layer sizes when `model` is linear layers with ReLU between them (as make_mlp builds),
/// input first; empty otherwise.
std::vector<int> mlp_shape(sequential& model) {
  std::vector<int> sizes;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const std::string d = model.at(i).describe();
    if (i % 2 == 1) {
      if (d != "relu") return {};
      continue;
    }
    int in = 0, out = 0;
    if (!linear_sizes(d, in, out)) return {};
    if (sizes.empty()) sizes.push_back(in);
    if (sizes.back() != in) return {};
    sizes.push_back(out);
  }
  if (model.size() % 2 == 0) return {};  // ends with a ReLU (or is empty)
  return sizes;
}

const detail::row_kernels* kernels_in_use() noexcept { return detail::row_kernels_for(classifier::simd_level()); }

/// Any number of rows, in tiles of the kernels' forward_tile.
void forward_layer_fused(const detail::row_kernels& k, const float* a, int rows, int in, const float* w, const float* b,
                         float* z, int out, bool relu) {
  for (int r0 = 0; r0 < rows; r0 += k.forward_tile) {
    const int n = std::min(k.forward_tile, rows - r0);
    k.forward[n - 1](a + static_cast<std::size_t>(r0) * in, in, w, b, z + static_cast<std::size_t>(r0) * out, out, relu);
  }
}

}  // namespace

static_assert(classifier::backward_tile == detail::backward_tile);

classifier::classifier(sequential& model, optimizer& opt, std::int64_t inputs)
    : model_(model), opt_(opt), params_(model.parameters()), inputs_(inputs) {
  if (params_.empty()) throw std::invalid_argument("classifier: the model has no parameters to train");
  for (auto* p : params_) {
    offset_.push_back(count_);
    count_ += static_cast<std::size_t>(p->value.numel());
  }
  if (inputs < 1) throw std::invalid_argument("classifier: the inputs must be at least 1");
  sizes_ = mlp_shape(model);
  if (!sizes_.empty()) {  // an MLP says what it takes and gives
    if (sizes_.front() != inputs)
      throw std::invalid_argument("the model " + model.describe() + " takes rows of " + std::to_string(sizes_.front()) +
                                  " features, not " + std::to_string(inputs));
    classes_ = sizes_.back();
  } else {
    // One row through the model tells whether it takes `inputs` features and how many classes
    // it gives; the layers' own message says what does not fit.
    saved_activations keep;
    tensor probe = tensor::zeros({1, inputs});
    if (params_.front()->value.where() != probe.where()) probe = probe.to(params_.front()->value.where());
    tensor logits;
    try {
      logits = model.forward(probe, keep, false);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("the model " + model.describe() + " does not take rows of " + std::to_string(inputs) +
                                  " features: " + e.what());
    }
    if (logits.rank() != 2 || logits.dim(0) != 1)
      throw std::invalid_argument("the model " + model.describe() + " does not give one row of class scores per row");
    classes_ = logits.dim(1);
  }
  if (classes_ < 2 || classes_ > 256)
    throw std::invalid_argument("the model " + model.describe() + " gives " + std::to_string(classes_) +
                                " class scores per row; a classifier needs 2 to 256");
  if (!sizes_.empty()) act_.resize(sizes_.size() - 1);
  // The parameters as views of one block: a federated client trains in it directly, and one
  // worker's model stays one contiguous range of memory.
  const device where = params_.front()->value.where();
  if (std::all_of(params_.begin(), params_.end(),
                  [&](const parameter* p) { return p->value.type() == dtype::f32 && p->value.where() == where; })) {
    flat_ = tensor::empty({static_cast<std::int64_t>(count_)}, dtype::f32, where);
    for (std::size_t k = 0; k < params_.size(); ++k) {
      parameter& p = *params_[k];
      const auto at = static_cast<std::int64_t>(offset_[k]);
      tensor view = flat_.slice(at, at + p.value.numel()).reshape(p.value.shape());
      copy(p.value, view);
      p.value = std::move(view);
    }
  }
}

classifier::~classifier() = default;

int classifier::simd_level() noexcept {
  static const int cpu = detail::cpu_simd_level();
  return std::min(cpu, simd_cap.load(std::memory_order_relaxed));
}

int classifier::limit_simd(int level) noexcept { return simd_cap.exchange(level); }

bool classifier::fused_available() const {
  if (sizes_.empty() || simd_level() < 1) return false;
  if (opt_.kind() != optimizer_kind::sgd || opt_.has_lr_schedule() || !opt_.where().is_cpu()) return false;
  // Plain SGD over exactly the model's parameters, in order, at one learning rate.
  std::size_t at = 0;
  const double lr = opt_.groups().empty() ? 0.0 : opt_.groups().front().hp.lr;
  for (const auto& g : opt_.groups()) {
    if (g.hp.momentum != 0 || g.hp.weight_decay != 0 || g.hp.lr != lr || g.state.percentile_clipping < 100) return false;
    for (auto* p : g.params)
      if (at >= params_.size() || params_[at++] != p) return false;
  }
  if (at != params_.size()) return false;
  for (auto* p : params_)
    if (p->value.type() != dtype::f32 || !p->value.where().is_cpu()) return false;
  return true;
}

void classifier::reserve(int rows) {
  if (rows <= capacity_) return;
  capacity_ = rows;
  const std::size_t r = static_cast<std::size_t>(rows);
  logits_.resize(r * static_cast<std::size_t>(classes_));
  if (sizes_.empty()) return;
  for (std::size_t l = 1; l < act_.size(); ++l) act_[l].resize(r * static_cast<std::size_t>(sizes_[l]));
  const std::size_t widest = static_cast<std::size_t>(*std::max_element(sizes_.begin() + 1, sizes_.end()));
  dz_.resize(r * widest);
  dz_prev_.resize(r * widest);
  da_.resize(r * widest);
}

void classifier::check_batch(const float* x, const std::uint8_t* labels, int rows) const {
  if (rows < 1) throw std::invalid_argument("classifier: a batch needs at least one row");
  if (!x || !labels) throw std::invalid_argument("classifier: null batch");
}

double classifier::softmax_loss(const float* logits, const std::uint8_t* labels, int rows, float* dz,
                                std::int64_t* correct, std::uint8_t* errors) const {
  const int c = static_cast<int>(classes_);
  double loss = 0;
  std::array<double, 256> e;
  for (int i = 0; i < rows; ++i) {
    const float* z = logits + static_cast<std::size_t>(i) * c;
    const int y = labels[i];
    if (y >= c) throw std::invalid_argument("label " + std::to_string(y) + " is outside 0.." + std::to_string(c - 1));
    float top = z[0];
    int best = 0;
    for (int j = 1; j < c; ++j)
      if (z[j] > top) top = z[j], best = j;
    double sum = 0;
    for (int j = 0; j < c; ++j) sum += (e[j] = std::exp(static_cast<double>(z[j]) - top));
    loss += std::log(sum) + top - z[y];
    if (correct && best == y) ++*correct;
    if (errors) errors[i] = best == y ? 0 : 1;
    if (dz)
      for (int j = 0; j < c; ++j)
        dz[static_cast<std::size_t>(i) * c + j] =
            static_cast<float>((e[j] / sum - (j == y ? 1.0 : 0.0)) / static_cast<double>(rows));
  }
  return loss;
}

std::span<float> classifier::flat_parameters() noexcept {
  if (!flat_.defined() || !flat_.where().is_cpu()) return {};
  return {reinterpret_cast<float*>(flat_.bytes()), count_};
}

void classifier::load_flat(const float* values) {
  if (const auto own = flat_parameters(); values == own.data() && !own.empty()) return;
  for (auto* p : params_) {
    const auto n = static_cast<std::size_t>(p->value.numel());
    if (p->value.where().is_cpu()) {
      std::memcpy(p->value.data<float>().data(), values, n * sizeof(float));
    } else {
      copy(tensor::from<float>(std::span<const float>(values, n), p->value.shape()), p->value);
    }
    values += n;
  }
}

void classifier::store_flat(float* values) const {
  if (flat_.defined() && flat_.where().is_cpu() && values == reinterpret_cast<const float*>(flat_.bytes())) return;
  for (auto* p : params_) {
    const tensor host = p->value.where().is_cpu() ? p->value : p->value.to(device::cpu());
    const auto v = host.data<float>();
    std::memcpy(values, v.data(), v.size_bytes());
    values += v.size();
  }
}

batch_outcome classifier::step(const float* x, const std::uint8_t* labels, int rows, const gradient_terms& terms) {
  return fused_available() ? step_fused(x, labels, rows, terms) : step_reference(x, labels, rows, terms);
}

batch_outcome classifier::step_reference(const float* x, const std::uint8_t* labels, int rows,
                                         const gradient_terms& terms) {
  check_batch(x, labels, rows);
  const auto r = static_cast<std::size_t>(rows);
  const device where = params_.front()->value.where();
  tensor xt = tensor::from<float>(std::span<const float>(x, r * static_cast<std::size_t>(inputs_)), {rows, inputs_});
  tensor yt = tensor::from<std::uint8_t>(std::span<const std::uint8_t>(labels, r), {rows});
  if (!where.is_cpu()) {
    xt = xt.to(where);
    yt = yt.to(where);
  }
  opt_.zero_grad();
  saved_activations keep;
  tensor dlogits;
  const double mean = softmax_cross_entropy(model_.forward(xt, keep, true), yt, dlogits);
  model_.backward(dlogits, keep);
  if (terms.center || terms.correction) {
    if (!where.is_cpu()) throw std::invalid_argument("classifier: gradient terms need the model on the host");
    std::size_t at = 0;
    for (auto* p : params_) {
      auto g = p->grad.data<float>();
      const auto w = std::as_const(p->value).data<float>();
      for (std::size_t i = 0; i < g.size(); ++i, ++at) {
        if (terms.center) g[i] += terms.mu * (w[i] - terms.center[at]);
        if (terms.correction) g[i] += terms.correction[at];
      }
    }
  }
  const bool applied = opt_.step();
  return {mean * static_cast<double>(rows), applied};
}

batch_outcome classifier::step_fused(const float* x, const std::uint8_t* labels, int rows, const gradient_terms& terms) {
  if (!fused_available()) throw std::logic_error("classifier::step_fused: needs an MLP, plain SGD and AVX2 with FMA");
  check_batch(x, labels, rows);
  const detail::row_kernels& k = *kernels_in_use();
  reserve(rows);
  const float lr = static_cast<float>(opt_.groups().front().hp.lr);
  const std::size_t layers = sizes_.size() - 1;
  auto w_of = [&](std::size_t l) { return params_[2 * l]->value.data<float>().data(); };
  auto b_of = [&](std::size_t l) { return params_[2 * l + 1]->value.data<float>().data(); };
  auto input_of = [&](std::size_t l) { return l == 0 ? x : act_[l].data(); };
  for (std::size_t l = 0; l < layers; ++l) {
    float* out = l + 1 < layers ? act_[l + 1].data() : logits_.data();
    forward_layer_fused(k, input_of(l), rows, sizes_[l], w_of(l), b_of(l), out, sizes_[l + 1], l + 1 < layers);
  }
  const double loss = softmax_loss(logits_.data(), labels, rows, dz_.data(), nullptr);
  // A finite loss means finite logits, hence a finite output gradient and activations.
  if (!std::isfinite(loss)) {
    opt_.count_step(false);
    return {loss, false};
  }
  // More rows than one backward tile: the gradient's partial sums wait in grad_ between tiles.
  const bool tiled = rows > backward_tile;
  if (tiled) grad_.resize(count_);
  for (std::size_t l = layers; l-- > 0;) {
    const int in = sizes_[l], out = sizes_[l + 1];
    const float* a = input_of(l);
    float* da = nullptr;
    if (l > 0) {
      da = da_.data();
      std::fill_n(da, static_cast<std::size_t>(rows) * in, 0.0f);
    }
    const std::size_t ow = offset_[2 * l], ob = offset_[2 * l + 1];
    const float* cw = terms.center ? terms.center + ow : nullptr;
    const float* cb = terms.center ? terms.center + ob : nullptr;
    const float* kw = terms.correction ? terms.correction + ow : nullptr;
    const float* kb = terms.correction ? terms.correction + ob : nullptr;
    for (int r0 = 0; r0 < rows; r0 += backward_tile) {
      const int n = std::min(backward_tile, rows - r0);
      k.backward[n - 1](a + static_cast<std::size_t>(r0) * in, in, dz_.data() + static_cast<std::size_t>(r0) * out, out,
                        w_of(l), b_of(l), da ? da + static_cast<std::size_t>(r0) * in : nullptr, lr,
                        terms.center ? terms.mu : 0.0f, cw, cb, kw, kb, tiled ? grad_.data() + ow : nullptr,
                        tiled ? grad_.data() + ob : nullptr, r0 == 0, r0 + n == rows);
    }
    if (l == 0) break;
    for (std::size_t i = 0; i < static_cast<std::size_t>(rows) * in; ++i) dz_prev_[i] = a[i] > 0 ? da[i] : 0.0f;
    std::swap(dz_, dz_prev_);
  }
  opt_.count_step(true);
  return {loss, true};
}

void classifier::evaluate(const float* x, const std::uint8_t* labels, int rows, double& loss_sum, std::int64_t& correct,
                          std::uint8_t* errors) {
  check_batch(x, labels, rows);
  reserve(rows);
  const detail::row_kernels* k = kernels_in_use();
  const bool host = params_.front()->value.where().is_cpu();
  if (!sizes_.empty() && k && host) {
    const std::size_t layers = sizes_.size() - 1;
    for (std::size_t l = 0; l < layers; ++l) {
      const float* in = l == 0 ? x : act_[l].data();
      float* out = l + 1 < layers ? act_[l + 1].data() : logits_.data();
      forward_layer_fused(*k, in, rows, sizes_[l], params_[2 * l]->value.data<float>().data(),
                          params_[2 * l + 1]->value.data<float>().data(), out, sizes_[l + 1], l + 1 < layers);
    }
  } else {
    const auto r = static_cast<std::size_t>(rows);
    tensor xt = tensor::from<float>(std::span<const float>(x, r * static_cast<std::size_t>(inputs_)), {rows, inputs_});
    if (!host) xt = xt.to(params_.front()->value.where());
    saved_activations keep;
    tensor logits = model_.forward(xt, keep, false);
    if (!host) logits = logits.to(device::cpu());
    const auto v = std::as_const(logits).data<float>();
    std::copy(v.begin(), v.end(), logits_.begin());
  }
  loss_sum += softmax_loss(logits_.data(), labels, rows, nullptr, &correct, errors);
}

}  // namespace troupe::kernels
