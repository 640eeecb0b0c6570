// FedGEN: the generator of latent features, its losses and the server strategy that trains it
// (see fedgen.hpp for the definitions).

#include "troupe/federated/fedgen.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "troupe/federated/dp.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::federated {

double fedgen_options::weight(int round) const {
  if (alpha == 0 || round <= 1) return 0;
  return std::max(alpha * std::pow(decay, round - 1), 1e-4);
}

bool is_fedgen(const std::string& spec) { return spec == "fedgen" || spec.rfind("fedgen:", 0) == 0; }

fedgen_options parse_fedgen(const std::string& spec) {
  if (!is_fedgen(spec)) throw std::invalid_argument("'" + spec + "' is not fedgen");
  fedgen_options o;
  if (spec != "fedgen") {
    const std::string arg = spec.substr(7);
    std::size_t used = 0;
    double a = -1;
    try {
      a = std::stod(arg, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != arg.size() || !std::isfinite(a) || a < 0 || a > 1e6)
      throw std::invalid_argument("--strategy " + spec + ": ALPHA must be a number >= 0 (fedgen:ALPHA)");
    o.alpha = a;
  }
  return o;
}

double head_cross_entropy(head_view head, int classes, int latent, const float* z, const std::uint8_t* y, int rows,
                          const double* row_scale, float scale, float* gw, float* gb, float* dz) {
  std::vector<double> logit(static_cast<std::size_t>(classes));
  double total = 0;
  const double per_row = 1.0 / rows;
  for (int i = 0; i < rows; ++i) {
    const float* zi = z + static_cast<std::size_t>(i) * latent;
    double top = -INFINITY;
    for (int c = 0; c < classes; ++c) {
      const float* w = head.weight + static_cast<std::size_t>(c) * latent;
      double s = head.bias[c];
      for (int h = 0; h < latent; ++h) s += static_cast<double>(w[h]) * zi[h];
      logit[c] = s;
      top = std::max(top, s);
    }
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(logit[c] - top);
    const double log_sum = top + std::log(sum);
    const double rs = row_scale ? row_scale[y[i]] : 1.0;
    total += rs * (log_sum - logit[y[i]]);
    if (!gw && !gb && !dz) continue;
    float* dzi = dz ? dz + static_cast<std::size_t>(i) * latent : nullptr;
    for (int c = 0; c < classes; ++c) {
      const double p = std::exp(logit[c] - log_sum);
      const float d = static_cast<float>((p - (c == y[i] ? 1.0 : 0.0)) * rs * per_row * scale);
      if (d == 0) continue;
      const float* w = head.weight + static_cast<std::size_t>(c) * latent;
      if (gw) {
        float* g = gw + static_cast<std::size_t>(c) * latent;
        for (int h = 0; h < latent; ++h) g[h] += d * zi[h];
      }
      if (gb) gb[c] += d;
      if (dzi)
        for (int h = 0; h < latent; ++h) dzi[h] += d * w[h];
    }
  }
  return total * per_row;
}

double diversity_loss(const float* noise, int noise_dim, const float* g, int latent, int rows, float scale, float* dg) {
  const std::size_t n = static_cast<std::size_t>(rows);
  std::vector<double> nd(n * n);
  double mean = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double a = 0, b = 0;
      for (int k = 0; k < noise_dim; ++k) {
        const double d = static_cast<double>(noise[i * noise_dim + k]) - noise[j * noise_dim + k];
        a += d * d;
      }
      for (int h = 0; h < latent; ++h) b += std::fabs(static_cast<double>(g[i * latent + h]) - g[j * latent + h]);
      nd[i * n + j] = a / noise_dim;
      mean += nd[i * n + j] * (b / latent);
    }
  const double loss = std::exp(-mean / static_cast<double>(n * n));
  if (dg) {
    // d/dg_ih of -mean: pairs (i, j) and (j, i) each give nd_ij sign(g_ih - g_jh) / latent.
    const double k = -loss * 2.0 / (static_cast<double>(n * n) * latent) * scale;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        if (i == j) continue;
        const double w = k * nd[i * n + j];
        for (int h = 0; h < latent; ++h) {
          const float a = g[i * latent + h], b = g[j * latent + h];
          if (a != b) dg[i * latent + h] += static_cast<float>(a > b ? w : -w);
        }
      }
  }
  return loss;
}

struct feature_generator::nets {
  std::unique_ptr<kernels::layer> net;
  std::unique_ptr<kernels::optimizer> opt;
};

feature_generator::feature_generator(int classes, int latent, const fedgen_options& options, std::uint64_t seed)
    : classes_(classes), latent_(latent), options_(options), nets_(std::make_unique<nets>()) {
  if (classes < 2 || latent < 1 || options.noise < 1 || options.hidden < 1 || options.batch < 1)
    throw std::invalid_argument("feature_generator: classes >= 2, and a positive latent width, noise, hidden and batch");
  const std::string in = std::to_string(classes + options.noise), hidden = std::to_string(options.hidden);
  nets_->net = kernels::make_layer("sequential(linear(" + in + "->" + hidden + "), relu, linear(" + hidden + "->" +
                                   std::to_string(latent) + "))");
  nets_->net->initialize(seed);
  kernels::hyperparameters hp;
  hp.lr = options.lr;
  nets_->opt = std::make_unique<kernels::optimizer>(kernels::optimizer_kind::adam,
                                                    std::vector<kernels::param_group>{{nets_->net->parameters(), hp, {}}});
}

feature_generator::~feature_generator() = default;
feature_generator::feature_generator(feature_generator&&) noexcept = default;
feature_generator& feature_generator::operator=(feature_generator&&) noexcept = default;

std::size_t feature_generator::parameter_count() const {
  std::size_t n = 0;
  for (auto* p : nets_->net->parameters()) n += static_cast<std::size_t>(p->value.numel());
  return n;
}

std::vector<float> feature_generator::parameters() const {
  std::vector<float> flat;
  flat.reserve(parameter_count());
  for (auto* p : nets_->net->parameters())
    for (float v : std::as_const(p->value).data<float>()) flat.push_back(v);
  return flat;
}

void feature_generator::load(std::span<const float> flat) {
  if (flat.size() != parameter_count())
    throw std::invalid_argument("feature_generator: " + std::to_string(flat.size()) + " parameters given, " +
                                std::to_string(parameter_count()) + " expected");
  std::size_t at = 0;
  for (auto* p : nets_->net->parameters()) {
    auto v = p->value.data<float>();
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at), flat.begin() + static_cast<std::ptrdiff_t>(at + v.size()), v.begin());
    at += v.size();
  }
}

namespace {
/// [onehot(y) | eps] for `rows` labels, eps ~ N(0, 1) seeded from rng.
tensor generator_input(const std::uint8_t* labels, int rows, int classes, int noise, splitmix64& rng, float* keep_noise) {
  const std::size_t width = static_cast<std::size_t>(classes + noise);
  tensor x = tensor::zeros({rows, static_cast<std::int64_t>(width)});
  std::vector<float> eps(static_cast<std::size_t>(rows) * noise, 0.0f);
  add_gaussian_noise(eps, 1.0, rng.next());
  auto v = x.data<float>();
  for (int i = 0; i < rows; ++i) {
    if (labels[i] >= classes) throw std::invalid_argument("feature_generator: label " + std::to_string(labels[i]) + " out of range");
    v[static_cast<std::size_t>(i) * width + labels[i]] = 1.0f;
    std::copy_n(eps.data() + static_cast<std::size_t>(i) * noise, noise, v.data() + static_cast<std::size_t>(i) * width + classes);
  }
  if (keep_noise) std::copy(eps.begin(), eps.end(), keep_noise);
  return x;
}
}  // namespace

void feature_generator::generate(const std::uint8_t* labels, int rows, splitmix64& rng, float* out, float* noise) {
  kernels::saved_activations keep;
  const tensor g = nets_->net->forward(generator_input(labels, rows, classes_, options_.noise, rng, noise), keep, false);
  const auto v = g.data<float>();
  std::copy(v.begin(), v.end(), out);
}

feature_generator::losses feature_generator::run(std::span<const head_view> heads, std::span<const double> shares,
                                                 std::span<const std::uint8_t> labels, splitmix64& rng, bool step) {
  if (labels.empty()) throw std::invalid_argument("feature_generator: no labels to generate");
  if (shares.size() != heads.size() * static_cast<std::size_t>(classes_))
    throw std::invalid_argument("feature_generator: one share per head and class expected");
  const int rows = options_.batch;
  std::vector<std::uint8_t> y(static_cast<std::size_t>(rows));
  for (auto& l : y) l = labels[rng.below(labels.size())];
  std::vector<float> eps(static_cast<std::size_t>(rows) * options_.noise);
  kernels::saved_activations keep;
  const tensor g = nets_->net->forward(generator_input(y.data(), rows, classes_, options_.noise, rng, eps.data()), keep, step);
  tensor dg = tensor::zeros(g.shape());
  float* d = step ? dg.data<float>().data() : nullptr;
  const float* gv = g.data<float>().data();
  losses out;
  for (std::size_t k = 0; k < heads.size(); ++k)
    out.teacher += head_cross_entropy(heads[k], classes_, latent_, gv, y.data(), rows, shares.data() + k * classes_, 1.0f,
                                      nullptr, nullptr, d);
  out.diversity = diversity_loss(eps.data(), options_.noise, gv, latent_, rows, static_cast<float>(options_.diversity), d);
  if (step) {
    nets_->opt->zero_grad();
    (void)nets_->net->backward(dg, keep);
    (void)nets_->opt->step();
  }
  return out;
}

feature_generator::losses feature_generator::train_step(std::span<const head_view> heads, std::span<const double> shares,
                                                        std::span<const std::uint8_t> labels, splitmix64& rng) {
  return run(heads, shares, labels, rng, true);
}

feature_generator::losses feature_generator::evaluate(std::span<const head_view> heads, std::span<const double> shares,
                                                      std::span<const std::uint8_t> labels, splitmix64 rng) {
  return run(heads, shares, labels, rng, false);
}

std::vector<std::byte> feature_generator::save_optimizer() const { return nets_->opt->save_state(); }
void feature_generator::load_optimizer(std::span<const std::byte> state) { nets_->opt->load_state(state); }

namespace {

/// FedGEN's server (see the file comment of fedgen.hpp).
class fedgen_strategy final : public server_strategy {
public:
  fedgen_strategy(const fedgen_options& o, int classes, int latent, std::size_t head_offset, label_counter counts,
                  std::uint64_t seed, double server_lr)
      : options_(o), lr_(static_cast<float>(server_lr)), classes_(classes), latent_(latent), head_offset_(head_offset), counts_(std::move(counts)),
        generator_(classes, latent, o, seed), flat_(generator_.parameters()) {}
  std::string name() const override { return "fedgen"; }
  bool observes() const override { return true; }
  void observe(std::uint64_t client, double, std::span<const float> delta) override {
    const std::size_t head = head_floats();
    if (delta.size() < head_offset_ + head)
      throw std::invalid_argument("fedgen: an update of " + std::to_string(delta.size()) + " floats has no head at " +
                                  std::to_string(head_offset_));
    clients_.push_back(client);
    heads_.insert(heads_.end(), delta.begin() + static_cast<std::ptrdiff_t>(head_offset_),
                  delta.begin() + static_cast<std::ptrdiff_t>(head_offset_ + head));
  }
  void apply(std::span<float> x, std::span<const float> agg, const round_info& round) override {
    if (x.size() != agg.size()) throw std::invalid_argument("fedgen: aggregate and model sizes differ");
    if (x.size() < head_offset_ + head_floats()) throw std::invalid_argument("fedgen: the model has no head there");
    if (!clients_.empty()) train_generator(x, round);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += lr_ * agg[i];
    clients_.clear();
    heads_.clear();
  }
  std::span<const float> generator() const override { return flat_; }
  double generator_weight(int round) const override { return options_.weight(round); }

  // State: the generator's parameters, then its optimizer's state one byte per value.
  std::vector<double> save_state() const override {
    std::vector<double> s(flat_.begin(), flat_.end());
    for (std::byte b : generator_.save_optimizer()) s.push_back(static_cast<double>(std::to_integer<unsigned>(b)));
    return s;
  }
  void load_state(std::span<const double> state) override {
    check_state(state, 0);
    if (state.empty()) return;
    const std::size_t n = flat_.size();
    std::vector<float> flat(state.begin(), state.begin() + static_cast<std::ptrdiff_t>(n));
    std::vector<std::byte> bytes;
    for (std::size_t i = n; i < state.size(); ++i) bytes.push_back(static_cast<std::byte>(static_cast<unsigned>(state[i])));
    feature_generator g(classes_, latent_, options_, 0);
    g.load(flat);
    try {
      g.load_optimizer(bytes);
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(std::string("fedgen: the checkpoint's generator optimizer: ") + e.what());
    }
    generator_ = std::move(g);
    flat_ = std::move(flat);
  }
  void check_state(std::span<const double> state, std::size_t) const override {
    if (state.empty()) return;  // a run saved before the first round
    if (state.size() < flat_.size())
      throw std::invalid_argument("fedgen: the checkpoint holds " + std::to_string(state.size()) +
                                  " values, fewer than the generator's " + std::to_string(flat_.size()) + " parameters");
    for (std::size_t i = 0; i < state.size(); ++i) {
      const double v = state[i];
      const bool ok = i < flat_.size() ? std::isfinite(v) : (v >= 0 && v <= 255 && v == std::floor(v));
      if (!ok) throw std::invalid_argument("fedgen: the checkpoint's generator state has " + std::to_string(v) + " at " + std::to_string(i));
    }
  }

private:
  std::size_t head_floats() const { return static_cast<std::size_t>(classes_) * (latent_ + 1); }

  void train_generator(std::span<const float> x, const round_info& round) {
    const std::size_t head = head_floats(), k = clients_.size(), c = static_cast<std::size_t>(classes_);
    // Each client's trained head: the global one plus its update.
    for (std::size_t i = 0; i < k; ++i)
      for (std::size_t p = 0; p < head; ++p) heads_[i * head + p] += x[head_offset_ + p];
    std::vector<head_view> views(k);
    for (std::size_t i = 0; i < k; ++i)
      views[i] = {heads_.data() + i * head, heads_.data() + i * head + c * static_cast<std::size_t>(latent_)};
    std::vector<std::uint32_t> n(k * c);
    for (std::size_t i = 0; i < k; ++i) counts_(clients_[i], std::span<std::uint32_t>(n.data() + i * c, c));
    std::vector<double> shares(k * c, 0.0);
    std::vector<std::uint8_t> labels;
    for (std::size_t y = 0; y < c; ++y) {
      double total = 0;
      for (std::size_t i = 0; i < k; ++i) total += n[i * c + y];
      if (total == 0) continue;
      labels.push_back(static_cast<std::uint8_t>(y));
      for (std::size_t i = 0; i < k; ++i) shares[i * c + y] = n[i * c + y] / total;
    }
    if (labels.empty()) return;
    splitmix64 rng{derive_seed(round.seed, 0xfed6e4)};
    for (int s = 0; s < options_.steps; ++s) (void)generator_.train_step(views, shares, labels, rng);
    flat_ = generator_.parameters();
  }

  fedgen_options options_;
  float lr_;
  int classes_, latent_;
  std::size_t head_offset_;
  label_counter counts_;
  feature_generator generator_;
  std::vector<float> flat_;
  std::vector<std::uint64_t> clients_;
  std::vector<float> heads_;  // the round's updates' head slices, then the trained heads
};

}  // namespace

std::unique_ptr<server_strategy> make_fedgen_strategy(const fedgen_options& options, int classes, int latent,
                                                      std::size_t head_offset, label_counter counts, std::uint64_t seed,
                                                      double server_lr) {
  if (!counts) throw std::invalid_argument("make_fedgen_strategy: no label counter");
  if (!(server_lr > 0) || !std::isfinite(server_lr)) throw std::invalid_argument("fedgen: the server learning rate must be positive");
  return std::make_unique<fedgen_strategy>(options, classes, latent, head_offset, std::move(counts), seed, server_lr);
}

}  // namespace troupe::federated
