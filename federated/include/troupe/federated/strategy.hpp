#pragma once
/// @file
/// Server strategies: how the aggregate of a round's deltas (mean of trained - global) moves
/// the global model, and what the clients do differently while training.
///
///   fedavg       x += delta                                    (McMahan et al., 2017)
///   fedprox:MU   as fedavg; clients add MU * (w - x) to every gradient   (Li et al., 2020)
///   fedavgm      v = beta * v + delta; x += lr * v             (Hsu et al., 2019)
///   fedadagrad   m = b1 m + (1 - b1) delta; v = v + delta^2;
///   fedadam      v = b2 v + (1 - b2) delta^2;
///   fedyogi      v = v - (1 - b2) delta^2 sign(v - delta^2);
///                x += lr * m / (sqrt(v) + tau)                 (Reddi et al., 2021, Alg. 2)
///   qfedavg:Q    q-FedAvg (Li et al., 2020; fairness.hpp)
///   scaffold     option II control variates; clients step with g - c_i + c and send
///                (delta_y, delta_c); x += lr * mean(delta_y); c += |S|/N mean(delta_c)
///                                                              (Karimireddy et al., 2020)
///
/// Bias correction: Reddi et al. apply none, with v starting at tau^2 and m at 0; that is the
/// default here. Flower's FedAdam and FedYogi scale the step by sqrt(1 - b2^t) / (1 - b1^t);
/// `bias_correction = true` does the same (for fedadam, fedyogi and fedadagrad's m).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/update.hpp"

namespace troupe::federated {

struct strategy_options {
  /// < 0: the strategy's default: 1 for fedavg, fedavgm and scaffold, 0.1 for fedadagrad (its v
  /// only grows, so its steps shrink over the rounds), 0.01 for fedadam and fedyogi.
  double server_lr = -1;
  double momentum = 0.9;      ///< fedavgm
  double beta1 = 0.9, beta2 = 0.99, tau = 1e-3;  ///< fedadagrad, fedadam, fedyogi
  bool bias_correction = false;  ///< see the file comment
  /// qfedavg: the clients' learning rate (L = 1 / client_lr); a simulation sets it from its
  /// options.
  double client_lr = 0;
};

/// What the clients of a strategy do besides plain local SGD.
struct client_rule {
  double proximal_mu = 0;      ///< FedProx: gradient += mu * (w - global)
  bool control_variates = false;  ///< SCAFFOLD: gradient += c - c_i; update is [dy | dc]
  bool uniform_weights = false;   ///< weight every client 1 instead of its example count
  /// >= 0: q-FedAvg's q (fairness.hpp): the client measures its loss F at the global model
  /// before training, sends it as the update's last float and weighs F^q.
  double loss_power = -1;
};

/// Not thread-safe: one server uses it from one thread.
class server_strategy {
public:
  virtual ~server_strategy() = default;
  virtual std::string name() const = 0;
  virtual client_rule rule() const { return {}; }
  /// Floats per client update for a model of `dim` floats (SCAFFOLD: 2 * dim).
  virtual std::size_t update_floats(std::size_t dim) const { return dim; }
  /// Moves `global` (dim floats) by the round's aggregate (update_floats(dim) floats).
  virtual void apply(std::span<float> global, std::span<const float> aggregate,
                     const round_info& round) = 0;
  /// The server control variate broadcast to the clients (SCAFFOLD); empty otherwise.
  virtual std::span<const float> control() const { return {}; }
  /// True when the strategy sees each update of a round through observe(), in aggregation order,
  /// before apply() (FedGEN keeps the clients' heads). Only plain updates can be observed: the
  /// engine refuses such a strategy with mechanisms that encode or buffer them.
  virtual bool observes() const { return false; }
  virtual void observe(std::uint64_t /*client*/, double /*weight*/, std::span<const float> /*delta*/) {}
  /// What the clients train against besides the model (FedGEN's generator, as its parameters)
  /// and the weight of that term in round `round` (1-based); empty and 0 otherwise.
  virtual std::span<const float> generator() const { return {}; }
  virtual double generator_weight(int /*round*/) const { return 0; }
  /// The state carried between rounds (momentum, moments, control variate), for checkpoints;
  /// empty when none. load_state restores it and throws std::invalid_argument, changing nothing,
  /// for state that check_state refuses for the model the state implies.
  virtual std::vector<double> save_state() const { return {}; }
  virtual void load_state(std::span<const double> state);
  /// Throws std::invalid_argument when `state` is not what save_state could have written for a
  /// model of `dim` floats (its length, a value out of range); changes nothing. The default
  /// accepts only no state.
  virtual void check_state(std::span<const double> state, std::size_t dim) const;
};

/// Makes a strategy from its command-line spelling ("fedavg", "fedprox:0.01", "fedadam",
/// "scaffold", ...). Throws std::invalid_argument for an unknown or malformed name, and for
/// the robust aggregation rules (median, trimmed-mean:B, krum:F) while they are not available.
std::unique_ptr<server_strategy> make_strategy(const std::string& spec, const strategy_options& options = {});

/// The names make_strategy knows, for help texts.
std::string strategy_names();

}  // namespace troupe::federated
