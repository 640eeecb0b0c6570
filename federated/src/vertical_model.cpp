// Split learning's pieces: how an MLP splits into two bottoms and a top, the bottoms and the
// top as trainable objects, the parties' features, and the AUC of the label-leakage attack.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "troupe/federated/vertical.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {
namespace {

std::unique_ptr<kernels::optimizer> sgd(kernels::sequential& model, double lr) {
  kernels::hyperparameters hp;
  hp.lr = lr;
  return std::make_unique<kernels::optimizer>(kernels::optimizer_kind::sgd,
                                              std::vector<kernels::param_group>{{model.parameters(), hp, {}}});
}

}  // namespace

vertical_shape split_shape(const std::string& model, std::int64_t features) {
  if (model.rfind("mlp:", 0) != 0)
    throw std::invalid_argument("--vertical needs an MLP (--model mlp:IN-H1-...-OUT), not '" + model + "'");
  const auto sizes = kernels::mlp_sizes(model);
  if (sizes.size() < 3)
    throw std::invalid_argument("--vertical needs an MLP with a hidden layer (mlp:IN-H1-OUT at least), not '" + model + "'");
  if (sizes[0] != features)
    throw std::invalid_argument("model '" + model + "' takes " + std::to_string(sizes[0]) + " inputs but the data has " +
                                std::to_string(features) + " features");
  if (sizes[0] % 2 != 0 || sizes[1] % 2 != 0)
    throw std::invalid_argument("--vertical splits the first layer in two halves: model '" + model +
                                "' needs an even input and first hidden width");
  vertical_shape s;
  s.in_a = s.in_b = sizes[0] / 2;
  s.cut = sizes[1] / 2;
  s.top = "mlp:" + std::to_string(sizes[1]);
  for (std::size_t i = 2; i < sizes.size(); ++i) s.top += "-" + std::to_string(sizes[i]);
  return s;
}

split_bottom::split_bottom(std::int64_t in, std::int64_t cut, std::uint64_t seed, double lr)
    : model_(std::make_unique<kernels::sequential>()) {
  model_->add(kernels::make_linear(in, cut));
  model_->add(kernels::make_relu());
  model_->initialize(seed);
  opt_ = sgd(*model_, lr);
}

tensor split_bottom::forward(const tensor& x) { return model_->forward(x, keep_, true); }

void split_bottom::backward(const tensor& dh) {
  // The input's gradient is not needed, but a sequential computes each layer's before its
  // weights' (the layers' dy pass through it).
  model_->backward(dh, keep_);
}

void split_bottom::step() {
  opt_->step();
  opt_->zero_grad();
}

split_top::split_top(const vertical_shape& shape, std::uint64_t seed, double lr) : model_(kernels::make_mlp(shape.top)) {
  model_->initialize(seed);
  opt_ = sgd(*model_, lr);
}

split_top::outcome split_top::forward_backward(const tensor& h, const tensor& labels) {
  const tensor logits = model_->forward(h, keep_, true);
  tensor dlogits;
  outcome out;
  out.loss_sum = kernels::softmax_cross_entropy(logits, labels, dlogits) * static_cast<double>(h.dim(0));
  out.dh = model_->backward(dlogits, keep_);
  return out;
}

tensor split_top::logits(const tensor& h) {
  kernels::saved_activations scratch;
  return model_->forward(h, scratch, false);
}

void split_top::step() {
  opt_->step();
  opt_->zero_grad();
}

std::unique_ptr<kernels::sequential> block_diagonal_model(const vertical_shape& shape, split_bottom& a,
                                                          split_bottom& b, split_top& top) {
  const std::int64_t in = shape.in_a + shape.in_b, c = shape.cut;
  std::string spec = "mlp:" + std::to_string(in) + "-" + shape.top.substr(4);
  auto whole = kernels::make_mlp(spec);
  auto wp = whole->parameters();
  auto pa = a.model().parameters(), pb = b.model().parameters(), pt = top.model().parameters();
  // The first layer: weight [2c, in] zero but for the blocks, bias [A's | B's].
  auto w = wp[0]->value.data<float>();
  std::fill(w.begin(), w.end(), 0.0f);
  auto wa = pa[0]->value.data<float>(), wb = pb[0]->value.data<float>();
  for (std::int64_t i = 0; i < c; ++i) {
    std::copy_n(wa.begin() + i * shape.in_a, shape.in_a, w.begin() + i * in);
    std::copy_n(wb.begin() + i * shape.in_b, shape.in_b, w.begin() + (c + i) * in + shape.in_a);
  }
  auto bias = wp[1]->value.data<float>();
  std::copy_n(pa[1]->value.data<float>().begin(), c, bias.begin());
  std::copy_n(pb[1]->value.data<float>().begin(), c, bias.begin() + c);
  if (wp.size() != pt.size() + 2) throw std::logic_error("block_diagonal_model: the top does not match the model");
  for (std::size_t k = 0; k < pt.size(); ++k) {
    auto from = pt[k]->value.data<float>();
    std::copy(from.begin(), from.end(), wp[k + 2]->value.data<float>().begin());
  }
  for (auto* p : wp) {
    auto g = p->grad.data<float>();
    std::fill(g.begin(), g.end(), 0.0f);
  }
  return whole;
}

void mask_off_block_gradients(kernels::sequential& whole, const vertical_shape& shape) {
  const std::int64_t in = shape.in_a + shape.in_b, c = shape.cut;
  auto g = whole.parameters().at(0)->grad.data<float>();
  for (std::int64_t i = 0; i < c; ++i) {
    std::fill_n(g.begin() + i * in + shape.in_a, shape.in_b, 0.0f);
    std::fill_n(g.begin() + (c + i) * in, shape.in_a, 0.0f);
  }
}

tensor concat_columns(const tensor& a, const tensor& b) {
  if (a.rank() != 2 || b.rank() != 2 || a.dim(0) != b.dim(0))
    throw std::invalid_argument("concat_columns: " + a.str() + " and " + b.str() + " are not rows of one batch");
  const std::int64_t rows = a.dim(0), ca = a.dim(1), cb = b.dim(1);
  tensor out = tensor::empty({rows, ca + cb});
  auto o = out.data<float>();
  auto x = a.data<float>();
  auto y = b.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + r * ca, ca, o.begin() + r * (ca + cb));
    std::copy_n(y.begin() + r * cb, cb, o.begin() + r * (ca + cb) + ca);
  }
  return out;
}

tensor columns_of(const tensor& x, std::int64_t begin, std::int64_t end) {
  if (x.rank() != 2 || begin < 0 || end > x.dim(1) || begin > end)
    throw std::invalid_argument("columns_of: no columns [" + std::to_string(begin) + ", " + std::to_string(end) + ") in " + x.str());
  const std::int64_t rows = x.dim(0), cols = x.dim(1), w = end - begin;
  tensor out = tensor::empty({rows, w});
  auto o = out.data<float>();
  auto in = x.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) std::copy_n(in.begin() + r * cols + begin, w, o.begin() + r * w);
  return out;
}

feature_split split_features(const labelled_data& data) {
  const auto& images = data.train.images;
  feature_split s;
  if (images.rank() == 3) {
    const std::int64_t h = images.dim(1), w = images.dim(2);
    if (w % 2 != 0) throw std::invalid_argument("--vertical splits each image's columns in two halves: the images are " +
                                                std::to_string(w) + " columns wide");
    for (std::int64_t r = 0; r < h; ++r)
      for (std::int64_t c = 0; c < w; ++c) (c < w / 2 ? s.a : s.b).push_back(r * w + c);
    return s;
  }
  const std::int64_t d = data.train.size() > 0 ? images.numel() / data.train.size() : 0;
  if (d < 2 || d % 2 != 0)
    throw std::invalid_argument("--vertical splits the features in two halves: the data has " + std::to_string(d));
  for (std::int64_t i = 0; i < d; ++i) (i < d / 2 ? s.a : s.b).push_back(i);
  return s;
}

double roc_auc(std::span<const double> scores, std::span<const std::uint8_t> positive) {
  if (scores.size() != positive.size())
    throw std::invalid_argument("roc_auc: " + std::to_string(scores.size()) + " scores but " +
                                std::to_string(positive.size()) + " labels");
  for (double v : scores)
    if (std::isnan(v)) throw std::invalid_argument("roc_auc: a score is NaN");
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) { return scores[i] < scores[j]; });
  // Ranks from 1, a run of ties sharing their mean rank: U = (sum of the positives' ranks) -
  // P (P + 1) / 2 counts the (positive, negative) pairs ordered right, a tie as one half.
  double rank_sum = 0;
  std::size_t pos = 0;
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (std::size_t k = i; k < j; ++k)
      if (positive[order[k]]) {
        rank_sum += mean_rank;
        ++pos;
      }
    i = j;
  }
  const std::size_t neg = scores.size() - pos;
  if (pos == 0 || neg == 0) throw std::invalid_argument("roc_auc: the labels need both a positive and a negative");
  const double p = static_cast<double>(pos);
  return (rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(neg));
}

}  // namespace troupe::federated
