#include "troupe/federated/strategy.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <vector>

#include "spec.hpp"
#include "troupe/federated/fairness.hpp"

namespace troupe::federated {

namespace {

/// Throws unless `state` is empty or holds `dim` values that fit in a float (float state).
void check_float_state(const std::string& who, std::span<const double> state, std::size_t dim) {
  if (!state.empty() && state.size() != dim)
    throw std::invalid_argument("strategy '" + who + "': the checkpoint's state has " + std::to_string(state.size()) +
                                " values for a model of " + std::to_string(dim));
  for (std::size_t i = 0; i < state.size(); ++i)
    if (!(std::abs(state[i]) <= std::numeric_limits<float>::max()))
      throw std::invalid_argument("strategy '" + who + "': the checkpoint's state value " + std::to_string(i) + " (" +
                                  std::to_string(state[i]) + ") is not a finite float");
}

/// A restored state vector must fit the model.
void check_restored(std::size_t have, std::size_t dim) {
  if (have != 0 && have != dim)
    throw std::invalid_argument("the strategy's restored state has " + std::to_string(have) + " values for a model of " +
                                std::to_string(dim));
}

double lr_or(const strategy_options& o, double fallback) { return o.server_lr < 0 ? fallback : o.server_lr; }

void check_sizes(std::span<float> global, std::span<const float> aggregate, std::size_t want) {
  if (aggregate.size() != want)
    throw std::invalid_argument("the aggregate has " + std::to_string(aggregate.size()) + " floats; the strategy expects " +
                                std::to_string(want) + " for a model of " + std::to_string(global.size()));
}

class fedavg final : public server_strategy {
public:
  fedavg(double lr, double mu) : lr_(lr), mu_(mu) {}
  std::string name() const override { return mu_ > 0 ? "fedprox" : "fedavg"; }
  client_rule rule() const override { return {.proximal_mu = mu_}; }
  void apply(std::span<float> x, std::span<const float> delta, const round_info&) override {
    check_sizes(x, delta, x.size());
    const float lr = static_cast<float>(lr_);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += lr * delta[i];
  }

private:
  double lr_, mu_;
};

class fedavgm final : public server_strategy {
public:
  fedavgm(double lr, double beta) : lr_(lr), beta_(beta) {}
  std::string name() const override { return "fedavgm"; }
  void apply(std::span<float> x, std::span<const float> delta, const round_info&) override {
    check_sizes(x, delta, x.size());
    check_restored(v_.size(), x.size());
    if (v_.empty()) v_.assign(x.size(), 0.0f);
    const float lr = static_cast<float>(lr_), beta = static_cast<float>(beta_);
    for (std::size_t i = 0; i < x.size(); ++i) {
      v_[i] = beta * v_[i] + delta[i];
      x[i] += lr * v_[i];
    }
  }

  std::vector<double> save_state() const override { return {v_.begin(), v_.end()}; }
  void load_state(std::span<const double> state) override {
    check_state(state, state.size());
    v_.assign(state.begin(), state.end());  // float values: exact
  }
  void check_state(std::span<const double> state, std::size_t dim) const override {
    check_float_state(name(), state, dim);
  }

private:
  double lr_, beta_;
  std::vector<float> v_;
};

enum class adaptive_kind { adagrad, adam, yogi };

/// Reddi et al. (2021), Algorithm 2, in double precision state.
class fedopt final : public server_strategy {
public:
  fedopt(adaptive_kind kind, const strategy_options& o)
      : kind_(kind), lr_(lr_or(o, kind == adaptive_kind::adagrad ? 0.1 : 0.01)), b1_(o.beta1), b2_(o.beta2),
        tau_(o.tau), bias_correction_(o.bias_correction) {}
  std::string name() const override {
    return kind_ == adaptive_kind::adagrad ? "fedadagrad" : kind_ == adaptive_kind::adam ? "fedadam" : "fedyogi";
  }
  void apply(std::span<float> x, std::span<const float> delta, const round_info&) override {
    check_sizes(x, delta, x.size());
    check_restored(m_.size(), x.size());
    if (m_.empty()) {
      m_.assign(x.size(), 0.0);
      v_.assign(x.size(), tau_ * tau_);  // v_{-1} = tau^2 (the paper's lower bound)
    }
    ++t_;
    double lr = lr_;
    if (bias_correction_) {
      const double c1 = 1 - std::pow(b1_, t_);
      const double c2 = kind_ == adaptive_kind::adagrad ? 1.0 : 1 - std::pow(b2_, t_);
      lr = lr_ * std::sqrt(c2) / c1;
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double d = delta[i], d2 = d * d;
      m_[i] = b1_ * m_[i] + (1 - b1_) * d;
      switch (kind_) {
        case adaptive_kind::adagrad: v_[i] += d2; break;
        case adaptive_kind::adam: v_[i] = b2_ * v_[i] + (1 - b2_) * d2; break;
        case adaptive_kind::yogi: {
          const double diff = v_[i] - d2;
          v_[i] -= (1 - b2_) * d2 * (diff > 0 ? 1.0 : diff < 0 ? -1.0 : 0.0);
          break;
        }
      }
      x[i] = static_cast<float>(x[i] + lr * m_[i] / (std::sqrt(v_[i]) + tau_));
    }
  }

  // t, then m and v (empty before the first round).
  std::vector<double> save_state() const override {
    std::vector<double> out{static_cast<double>(t_)};
    out.insert(out.end(), m_.begin(), m_.end());
    out.insert(out.end(), v_.begin(), v_.end());
    return out;
  }
  void load_state(std::span<const double> state) override {
    const std::size_t n = state.empty() ? 0 : (state.size() - 1) / 2;
    check_state(state, n);
    t_ = static_cast<int>(state[0]);
    m_.assign(state.begin() + 1, state.begin() + 1 + static_cast<std::ptrdiff_t>(n));
    v_.assign(state.begin() + 1 + static_cast<std::ptrdiff_t>(n), state.end());
  }

  void check_state(std::span<const double> state, std::size_t dim) const override {
    // The step count below the largest int (the next step adds one), then m and v: none before
    // the first step, else one per model float.
    if (state.empty() || !(state[0] >= 0) || !(state[0] < 0x7fffffff) || state[0] != std::floor(state[0]))
      throw std::invalid_argument("strategy '" + name() + "': the checkpoint's step count is malformed");
    const std::size_t n = (state.size() - 1) / 2;
    if ((state.size() - 1) % 2 != 0 || (n != 0 && n != dim))
      throw std::invalid_argument("strategy '" + name() + "': the checkpoint's state has " + std::to_string(state.size()) +
                                  " values; a model of " + std::to_string(dim) + " needs 1 or " +
                                  std::to_string(1 + 2 * dim));
    // v starts at tau^2 and never goes below 0 (Yogi's step takes at most (1 - beta2) d^2 from a
    // v above d^2): a negative one would make sqrt(v) NaN in the next step.
    for (std::size_t i = 0; i < n; ++i)
      if (!(state[1 + n + i] >= 0))
        throw std::invalid_argument("strategy '" + name() + "': the checkpoint's second moment v[" + std::to_string(i) +
                                    "] is " + std::to_string(state[1 + n + i]) + ", not >= 0");
  }

private:
  adaptive_kind kind_;
  double lr_, b1_, b2_, tau_;
  bool bias_correction_;
  std::vector<double> m_, v_;
  int t_ = 0;
};

/// SCAFFOLD's server (Karimireddy et al., 2020, Algorithm 1): the aggregate is the uniform
/// mean of [delta_y | delta_c] over the sampled clients.
class scaffold final : public server_strategy {
public:
  explicit scaffold(double lr) : lr_(lr) {}
  std::string name() const override { return "scaffold"; }
  client_rule rule() const override { return {.control_variates = true, .uniform_weights = true}; }
  std::size_t update_floats(std::size_t dim) const override { return 2 * dim; }
  void apply(std::span<float> x, std::span<const float> agg, const round_info& round) override {
    check_sizes(x, agg, 2 * x.size());
    check_restored(c_.size(), x.size());
    if (c_.empty()) c_.assign(x.size(), 0.0f);
    if (round.population == 0) throw std::invalid_argument("scaffold needs the population size");
    const float lr = static_cast<float>(lr_);
    const float share = static_cast<float>(static_cast<double>(round.participants.size()) /
                                           static_cast<double>(round.population));
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] += lr * agg[i];
      c_[i] += share * agg[x.size() + i];
    }
  }
  std::span<const float> control() const override { return c_; }
  std::vector<double> save_state() const override { return {c_.begin(), c_.end()}; }
  void load_state(std::span<const double> state) override {
    check_state(state, state.size());
    c_.assign(state.begin(), state.end());
  }
  void check_state(std::span<const double> state, std::size_t dim) const override {
    check_float_state(name(), state, dim);
  }

private:
  double lr_;
  std::vector<float> c_;
};

double parse_number(const std::string& text, const std::string& spec) {
  return detail::spec_number(text, "strategy '" + spec + "'");
}

}  // namespace

void server_strategy::load_state(std::span<const double> state) { check_state(state, 0); }

void server_strategy::check_state(std::span<const double> state, std::size_t) const {
  if (!state.empty())
    throw std::invalid_argument("strategy '" + name() + "' keeps no state between rounds; the checkpoint has " +
                                std::to_string(state.size()) + " values for it");
}

std::string strategy_names() {
  return "fedavg, fedprox:MU, fedavgm, fedadagrad, fedadam, fedyogi, scaffold, fedgen[:ALPHA], qfedavg:Q; with --client-models: fedavg, feddf, fedmd";
}

std::unique_ptr<server_strategy> make_strategy(const std::string& spec, const strategy_options& o) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  auto no_argument = [&] {
    if (colon != std::string::npos)
      throw std::invalid_argument("strategy '" + spec + "' takes no parameter (write '" + name + "')");
  };
  if (!(o.server_lr < 0 || (o.server_lr > 0 && std::isfinite(o.server_lr))))
    throw std::invalid_argument("the server learning rate must be positive");
  // Checked whichever strategy reads them: a bad value is a mistake even where it is unused.
  if (!(o.momentum >= 0 && o.momentum < 1)) throw std::invalid_argument("fedavgm's momentum must be in [0, 1)");
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
    throw std::invalid_argument("the server betas must be in [0, 1)");
  if (!(o.tau > 0) || !std::isfinite(o.tau)) throw std::invalid_argument("tau must be a positive number");
  if (name == "fedavg") {
    no_argument();
    return std::make_unique<fedavg>(lr_or(o, 1.0), 0.0);
  }
  if (name == "fedprox") {
    if (arg.empty()) throw std::invalid_argument("fedprox needs its mu: fedprox:0.01");
    const double mu = parse_number(arg, spec);
    if (mu < 0) throw std::invalid_argument("fedprox's mu must be non-negative");
    return std::make_unique<fedavg>(lr_or(o, 1.0), mu);
  }
  if (name == "fedavgm") {
    no_argument();
    return std::make_unique<fedavgm>(lr_or(o, 1.0), o.momentum);
  }
  if (name == "fedadagrad" || name == "fedadam" || name == "fedyogi") {
    no_argument();
    const auto kind = name == "fedadagrad" ? adaptive_kind::adagrad
                      : name == "fedadam"  ? adaptive_kind::adam
                                           : adaptive_kind::yogi;
    return std::make_unique<fedopt>(kind, o);
  }
  if (name == "scaffold") {
    no_argument();
    return std::make_unique<scaffold>(lr_or(o, 1.0));
  }
  if (name == "qfedavg") {
    if (o.server_lr >= 0)
      throw std::invalid_argument("'" + spec + "' steps by sum(F^q delta) / sum(h): it takes no server learning rate");
    return make_qfedavg(parse_qfedavg(spec), o.client_lr);
  }
  if (name == "fedgen")
    throw std::invalid_argument("'" + spec + "' needs the model and the data: name it as a simulation's strategy "
                                "(simulation_options::strategy), which makes it (see fedgen.hpp)");
  if (name == "median" || name == "trimmed-mean" || name == "krum" || name == "multi-krum" || name == "alignins")
    throw std::invalid_argument("'" + spec + "' is a robust aggregation rule, not a server strategy: pass it as the "
                                "simulation's strategy, or set make_robust_aggregator('" + spec + "') as its aggregator");
  throw std::invalid_argument("unknown strategy '" + spec + "' (use " + strategy_names() +
                              "; a simulation also takes the robust rules median, trimmed-mean:B, krum:F and "
                              "multi-krum:F:M, and the backdoor defence alignins[:LAMBDA_T:LAMBDA_S])");
}

}  // namespace troupe::federated
