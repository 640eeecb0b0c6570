// Neural Cleanse: per label the smallest trigger that flips clean images to it, then the
// median-absolute-deviation test of the triggers' norms (neural_cleanse.hpp has the formulas).

#include "troupe/federated/neural_cleanse.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "engine.hpp"
#include "troupe/federated/rng.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::federated {

namespace {

double median_of(std::vector<double> v) {
  const std::size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (n % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

void check_options(const neural_cleanse_options& o) {
  if (o.images < 1) throw std::invalid_argument("neural cleanse: images must be at least 1");
  if (o.batch < 1) throw std::invalid_argument("neural cleanse: the batch must be at least 1");
  if (o.epochs < 1) throw std::invalid_argument("neural cleanse: epochs must be at least 1");
  if (o.steps_per_epoch < 0) throw std::invalid_argument("neural cleanse: steps per epoch must be >= 0");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw std::invalid_argument("neural cleanse: the learning rate must be positive");
  if (!(o.init_cost > 0) || !std::isfinite(o.init_cost))
    throw std::invalid_argument("neural cleanse: the initial cost must be positive");
  if (!(o.attack_success_threshold > 0 && o.attack_success_threshold <= 1))
    throw std::invalid_argument("neural cleanse: the attack success threshold must be in (0, 1]");
  if (o.patience < 1) throw std::invalid_argument("neural cleanse: the patience must be at least 1 epoch");
  if (o.early_stop_patience < 0)
    throw std::invalid_argument("neural cleanse: the early-stop patience must be >= 0 epochs (0: run every epoch)");
  if (!(o.cost_multiplier > 1) || !std::isfinite(o.cost_multiplier))
    throw std::invalid_argument("neural cleanse: the cost multiplier must be above 1");
  if (!(o.anomaly_threshold > 0) || !std::isfinite(o.anomaly_threshold))
    throw std::invalid_argument("neural cleanse: the anomaly threshold must be positive");
}

}  // namespace

anomaly_report mad_anomaly_index(std::span<const double> norms, double threshold) {
  if (norms.size() < 2) throw std::invalid_argument("the anomaly index needs at least two norms");
  for (double n : norms)
    if (!std::isfinite(n)) throw std::invalid_argument("the anomaly index needs finite norms");
  anomaly_report r;
  r.median = median_of({norms.begin(), norms.end()});
  std::vector<double> deviation;
  for (double n : norms) deviation.push_back(std::abs(n - r.median));
  r.mad = 1.4826 * median_of(deviation);
  for (std::size_t i = 0; i < norms.size(); ++i) {
    const double index = deviation[i] == 0 ? 0.0
                         : r.mad > 0      ? deviation[i] / r.mad
                                          : std::numeric_limits<double>::infinity();
    r.index.push_back(index);
    if (index > threshold && norms[i] < r.median) r.flagged.push_back(static_cast<int>(i));
  }
  return r;
}

double trigger_objective(kernels::sequential& model, std::span<const float> x01, int rows, float mean, float stddev,
                         int label, std::span<const float> mu, std::span<const float> pi, double cost,
                         std::span<float> grad_mu, std::span<float> grad_pi, std::int64_t* correct) {
  const std::size_t d = mu.size();
  if (rows < 1 || pi.size() != d || grad_mu.size() != d || grad_pi.size() != d || x01.size() != d * static_cast<std::size_t>(rows))
    throw std::invalid_argument("trigger_objective: the sizes of the images, mask and pattern do not agree");
  std::vector<float> m(d), p(d);
  for (std::size_t j = 0; j < d; ++j) {
    m[j] = sigmoid(mu[j]);
    p[j] = sigmoid(pi[j]);
  }
  tensor z = tensor::empty({rows, static_cast<std::int64_t>(d)});
  auto zs = z.data<float>();
  const float inv = 1.0f / stddev;
  for (std::size_t b = 0; b < static_cast<std::size_t>(rows); ++b)
    for (std::size_t j = 0; j < d; ++j) {
      const float x = x01[b * d + j];
      zs[b * d + j] = ((1.0f - m[j]) * x + m[j] * p[j] - mean) * inv;
    }
  tensor labels = tensor::empty({rows}, dtype::u8);
  for (auto& y : labels.data<std::uint8_t>()) y = static_cast<std::uint8_t>(label);
  kernels::saved_activations keep;
  const tensor logits = model.forward(z, keep, false);
  tensor dlogits;
  const double ce = kernels::softmax_cross_entropy(logits, labels, dlogits);
  if (correct) *correct = kernels::count_correct(logits, labels);
  const tensor dz = model.backward_input(dlogits, keep);
  keep.clear();
  // dL/dx' = dL/dz / stddev; x' = (1 - m) x + m p.
  const auto g = dz.data<float>();
  double l1 = 0;
  for (std::size_t j = 0; j < d; ++j) {
    double gm = 0, gp = 0;
    for (std::size_t b = 0; b < static_cast<std::size_t>(rows); ++b) {
      const double gx = static_cast<double>(g[b * d + j]) * inv;
      gm += gx * (p[j] - x01[b * d + j]);
      gp += gx * m[j];
    }
    gm += cost;  // d|m|_1/dm with m > 0
    l1 += m[j];
    grad_mu[j] = static_cast<float>(gm * m[j] * (1.0f - m[j]));
    grad_pi[j] = static_cast<float>(gp * p[j] * (1.0f - p[j]));
  }
  return ce + cost * l1;
}

reversed_trigger reverse_engineer_trigger(kernels::sequential& model, const tensor& images, float mean, float stddev,
                                          int label, const neural_cleanse_options& o) {
  check_options(o);
  if (images.type() != dtype::u8)
    throw std::invalid_argument("neural cleanse reverse-engineers a trigger in pixel space: it needs u8 images, not " +
                                images.str());
  if (images.rank() < 2 || images.dim(0) < 1) throw std::invalid_argument("neural cleanse: no images given");
  if (!(stddev > 0) || !std::isfinite(stddev) || !std::isfinite(mean))
    throw std::invalid_argument("neural cleanse: the normalization's stddev must be positive and finite");
  const int n = static_cast<int>(std::min<std::int64_t>(images.dim(0), o.images));
  const std::size_t d = static_cast<std::size_t>(images.numel() / images.dim(0));
  {
    kernels::saved_activations keep;
    tensor probe = tensor::zeros({1, static_cast<std::int64_t>(d)});
    tensor logits;
    try {
      logits = model.forward(probe, keep, false);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("the model " + model.describe() + " does not take images of " + std::to_string(d) +
                                  " pixels: " + e.what());
    }
    if (logits.rank() != 2 || label < 0 || label >= logits.dim(1))
      throw std::invalid_argument("the model " + model.describe() + " has no label " + std::to_string(label));
  }
  std::vector<float> x01(static_cast<std::size_t>(n) * d);
  const auto pixels = images.data<std::uint8_t>();
  for (std::size_t k = 0; k < x01.size(); ++k) x01[k] = static_cast<float>(pixels[k]) / 255.0f;

  // The raw parameters, initialized as the paper's code does: m and p uniform in (0, 1).
  splitmix64 g{derive_seed(o.seed, static_cast<std::uint64_t>(label))};
  kernels::parameter mu{"mask", tensor::empty({static_cast<std::int64_t>(d)}), tensor::zeros({static_cast<std::int64_t>(d)})};
  kernels::parameter pi{"pattern", tensor::empty({static_cast<std::int64_t>(d)}), tensor::zeros({static_cast<std::int64_t>(d)})};
  auto logit = [](double u) { return static_cast<float>(std::log(u / (1 - u))); };
  for (float& v : mu.value.data<float>()) v = logit(0.001 + 0.998 * g.uniform01());
  for (float& v : pi.value.data<float>()) v = logit(0.001 + 0.998 * g.uniform01());
  kernels::hyperparameters hp;
  hp.lr = o.lr;
  hp.beta1 = 0.5;
  hp.beta2 = 0.9;
  kernels::optimizer adam(kernels::optimizer_kind::adam, {kernels::param_group{{&mu, &pi}, hp}});

  const int batch = std::min(o.batch, n);
  const int steps = o.steps_per_epoch > 0 ? o.steps_per_epoch : std::max(1, n / batch);
  std::vector<std::uint32_t> order(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  std::size_t next = order.size();  // where the next batch starts; a reshuffle at the end
  std::vector<float> xb(static_cast<std::size_t>(batch) * d);

  auto current_mask = [&] {
    std::vector<float> m(d);
    for (std::size_t j = 0; j < d; ++j) m[j] = sigmoid(mu.value.data<float>()[j]);
    return m;
  };
  auto current_pattern = [&] {
    std::vector<float> p(d);
    for (std::size_t j = 0; j < d; ++j) p[j] = sigmoid(pi.value.data<float>()[j]);
    return p;
  };

  reversed_trigger out;
  out.label = label;
  double cost = 0;
  int set_counter = 0, up_counter = 0, down_counter = 0, early_counter = 0;
  bool went_up = false, went_down = false;
  double reg_best = std::numeric_limits<double>::infinity(), early_reg_best = reg_best;
  double last_success = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    double success_sum = 0, reg_sum = 0;
    for (int s = 0; s < steps; ++s) {
      for (int b = 0; b < batch; ++b) {
        if (next == order.size()) {
          for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[g.below(i)]);
          next = 0;
        }
        std::copy_n(x01.begin() + static_cast<std::ptrdiff_t>(order[next++] * d), d,
                    xb.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(b) * d));
      }
      std::int64_t correct = 0;
      double l1 = 0;
      for (float v : mu.value.data<float>()) l1 += sigmoid(v);
      trigger_objective(model, xb, batch, mean, stddev, label, mu.value.data<float>(), pi.value.data<float>(), cost,
                        mu.grad.data<float>(), pi.grad.data<float>(), &correct);
      success_sum += static_cast<double>(correct) / batch;
      reg_sum += l1;
      if (!adam.step())
        throw std::runtime_error("neural cleanse: the trigger's gradient for label " + std::to_string(label) +
                                 " is not finite (the model's outputs overflow)");
    }
    const double success = success_sum / steps, reg = reg_sum / steps;
    last_success = success;
    out.epochs = epoch + 1;
    if (success >= o.attack_success_threshold && reg < reg_best) {
      reg_best = reg;
      out.mask = current_mask();
      out.pattern = current_pattern();
      out.attack_success = success;
      out.reached = true;
    }
    if (reg_best < std::numeric_limits<double>::infinity()) {
      early_counter = reg_best >= early_reg_best ? early_counter + 1 : 0;
    }
    early_reg_best = std::min(reg_best, early_reg_best);
    if (o.early_stop_patience > 0 && went_up && went_down && early_counter >= o.early_stop_patience) break;
    // λ's schedule.
    if (cost == 0 && success >= o.attack_success_threshold) {
      if (++set_counter >= o.patience) {
        cost = o.init_cost;
        up_counter = down_counter = 0;
        went_up = went_down = false;
      }
    } else {
      set_counter = 0;
    }
    if (success >= o.attack_success_threshold) {
      ++up_counter;
      down_counter = 0;
    } else {
      up_counter = 0;
      ++down_counter;
    }
    if (up_counter >= o.patience) {
      up_counter = 0;
      cost *= o.cost_multiplier;
      went_up = true;
    } else if (down_counter >= o.patience) {
      down_counter = 0;
      cost /= std::pow(o.cost_multiplier, 1.5);
      went_down = true;
    }
  }
  if (!out.reached) {
    out.mask = current_mask();
    out.pattern = current_pattern();
    out.attack_success = last_success;
  }
  out.final_cost = cost;
  out.l1 = 0;
  for (float v : out.mask) out.l1 += v;
  return out;
}

neural_cleanse_result neural_cleanse(kernels::sequential& model, const labelled_data& data,
                                     const neural_cleanse_options& o) {
  check_options(o);
  const tensor& images = data.test.images;
  if (images.rank() < 2 || images.dim(0) < 1) throw std::invalid_argument("neural cleanse: the test split holds no images");
  const std::int64_t n = std::min<std::int64_t>(images.dim(0), o.images);
  const tensor clean = images.slice(0, n);
  std::int64_t classes = 0;
  {
    kernels::saved_activations keep;
    tensor probe = tensor::zeros({1, images.numel() / images.dim(0)});
    try {
      classes = model.forward(probe, keep, false).dim(1);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("the model " + model.describe() + " does not take these images (" +
                                  std::to_string(probe.dim(1)) + " pixels): " + e.what());
    }
  }
  if (classes < 2 || classes > 256)
    throw std::invalid_argument("the model " + model.describe() + " gives " + std::to_string(classes) +
                                " scores per image; neural cleanse needs a classifier of 2 to 256 labels");
  neural_cleanse_result r;
  std::vector<double> norms;
  for (int t = 0; t < classes; ++t) {
    r.triggers.push_back(reverse_engineer_trigger(model, clean, data.mean, data.stddev, t, o));
    norms.push_back(r.triggers.back().l1);
  }
  r.anomaly = mad_anomaly_index(norms, o.anomaly_threshold);
  return r;
}

std::unique_ptr<kernels::sequential> load_saved_model(const std::string& path, const std::string& spec) {
  return detail::load_model_from(path, spec, "--load");
}

}  // namespace troupe::federated
