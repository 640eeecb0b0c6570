// Knowledge distillation's pieces: the model list, the distillation losses, the consensus of
// logits and the distiller (a model with its own Adam). The runner is heterogeneous.cpp.

#include "troupe/federated/distillation.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine.hpp"
#include "troupe/kernels/classifier.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::federated {

std::vector<std::string> split_model_list(const std::string& list) {
  std::vector<std::string> out;
  std::string piece;
  int depth = 0;
  auto finish = [&] {
    const auto a = piece.find_first_not_of(' '), b = piece.find_last_not_of(' ');
    if (a == std::string::npos) throw std::invalid_argument("--client-models '" + list + "': an empty model in the list");
    out.push_back(piece.substr(a, b - a + 1));
    piece.clear();
  };
  for (char c : list) {
    if (c == '(') ++depth;
    if (c == ')' && --depth < 0) throw std::invalid_argument("--client-models '" + list + "': a ')' without its '('");
    if (c == ',' && depth == 0) {
      finish();
      continue;
    }
    piece += c;
  }
  if (depth != 0) throw std::invalid_argument("--client-models '" + list + "': a '(' without its ')'");
  finish();
  return out;
}

namespace {
/// softmax(v / T) of one row into p; returns log(sum exp(v / T)).
double softmax_row(const float* v, int classes, double temperature, double* p) {
  double top = -INFINITY;
  for (int c = 0; c < classes; ++c) top = std::max(top, v[c] / temperature);
  double sum = 0;
  for (int c = 0; c < classes; ++c) sum += (p[c] = std::exp(v[c] / temperature - top));
  for (int c = 0; c < classes; ++c) p[c] /= sum;
  return top + std::log(sum);
}
}  // namespace

double kl_distillation(const float* student, const float* teacher, int rows, int classes, double temperature, float* ds) {
  if (!(temperature > 0)) throw std::invalid_argument("kl_distillation: the temperature must be positive");
  std::vector<double> ps(static_cast<std::size_t>(classes)), pt(static_cast<std::size_t>(classes));
  double total = 0;
  const double t2 = temperature * temperature;
  for (int i = 0; i < rows; ++i) {
    const float* s = student + static_cast<std::size_t>(i) * classes;
    const float* t = teacher + static_cast<std::size_t>(i) * classes;
    const double ls = softmax_row(s, classes, temperature, ps.data());
    const double lt = softmax_row(t, classes, temperature, pt.data());
    double kl = 0;
    for (int c = 0; c < classes; ++c)
      if (pt[c] > 0) kl += pt[c] * ((t[c] / temperature - lt) - (s[c] / temperature - ls));
    total += t2 * kl;
    if (ds)  // d/ds of T^2 KL / rows = T (p_s - p_t) / rows
      for (int c = 0; c < classes; ++c)
        ds[static_cast<std::size_t>(i) * classes + c] = static_cast<float>(temperature * (ps[c] - pt[c]) / rows);
  }
  return total / rows;
}

double l1_distillation(const float* student, const float* teacher, int rows, int classes, float* ds) {
  const std::size_t n = static_cast<std::size_t>(rows) * classes;
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = student[i] - teacher[i];
    total += std::fabs(static_cast<double>(d));
    if (ds) ds[i] = d > 0 ? 1.0f / static_cast<float>(n) : d < 0 ? -1.0f / static_cast<float>(n) : 0.0f;
  }
  return total / static_cast<double>(n);
}

void mean_logits(std::span<const std::vector<float>> blocks, std::vector<float>& out) {
  if (blocks.empty()) throw std::invalid_argument("mean_logits: no logits");
  const std::size_t n = blocks.front().size();
  std::vector<double> sum(n, 0.0);
  for (const auto& b : blocks) {
    if (b.size() != n) throw std::invalid_argument("mean_logits: blocks of different sizes");
    for (std::size_t i = 0; i < n; ++i) sum[i] += b[i];
  }
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(sum[i] / static_cast<double>(blocks.size()));
}

struct distiller::impl {
  std::unique_ptr<kernels::sequential> net;
  std::unique_ptr<kernels::optimizer> opt;
  std::unique_ptr<kernels::optimizer> scratch;  // never stepped: the classifier needs one
  std::unique_ptr<kernels::classifier> flat;     // parameters as one flat block, loads and stores
  std::int64_t inputs = 0;
  double lr = 0;
  std::vector<float> dlogits;
};

distiller::distiller(const std::string& spec, std::int64_t inputs, double lr) : impl_(std::make_unique<impl>()) {
  impl_->net = detail::make_model(spec);
  impl_->inputs = inputs;
  impl_->lr = lr;
  reset();
  kernels::hyperparameters hp;
  impl_->scratch = std::make_unique<kernels::optimizer>(kernels::optimizer_kind::sgd,
                                                        std::vector<kernels::param_group>{{impl_->net->parameters(), hp, {}}});
  try {
    impl_->flat = std::make_unique<kernels::classifier>(*impl_->net, *impl_->scratch, inputs);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("model '" + spec + "': " + e.what());
  }
  classes_ = static_cast<int>(impl_->flat->classes());
}

distiller::~distiller() = default;

void distiller::reset() {
  kernels::hyperparameters hp;
  hp.lr = impl_->lr;
  impl_->opt = std::make_unique<kernels::optimizer>(kernels::optimizer_kind::adam,
                                                    std::vector<kernels::param_group>{{impl_->net->parameters(), hp, {}}});
}

std::size_t distiller::parameter_count() const { return impl_->flat->parameter_count(); }

void distiller::load(std::span<const float> flat) {
  if (flat.size() != parameter_count()) throw std::invalid_argument("distiller: wrong number of parameters");
  impl_->flat->load_flat(flat.data());
}

void distiller::store(std::span<float> flat) const {
  if (flat.size() != parameter_count()) throw std::invalid_argument("distiller: wrong number of parameters");
  impl_->flat->store_flat(flat.data());
}

void distiller::logits(const float* x, int rows, std::vector<float>& out) {
  kernels::saved_activations keep;
  const tensor in = tensor::from(std::span<const float>(x, static_cast<std::size_t>(rows) * impl_->inputs), {rows, impl_->inputs});
  const tensor y = impl_->net->forward(in, keep, false);
  const auto v = y.data<float>();
  out.assign(v.begin(), v.end());
}

double distiller::step(const float* x, const float* teacher, int rows, loss kind, double temperature) {
  kernels::saved_activations keep;
  const tensor in = tensor::from(std::span<const float>(x, static_cast<std::size_t>(rows) * impl_->inputs), {rows, impl_->inputs});
  const tensor y = impl_->net->forward(in, keep, true);
  tensor dy = tensor::zeros(y.shape());
  float* d = dy.data<float>().data();
  const float* s = y.data<float>().data();
  const double l = kind == loss::kl ? kl_distillation(s, teacher, rows, classes_, temperature, d)
                                    : l1_distillation(s, teacher, rows, classes_, d);
  impl_->opt->zero_grad();
  (void)impl_->net->backward(dy, keep);
  (void)impl_->opt->step();
  return l;
}

}  // namespace troupe::federated
