#pragma once
/// @file
/// FedGEN (Zhu, Hong and Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
/// Learning", ICML 2021): knowledge distilled without data through a generator of latent
/// features, the input of the model's last linear layer (its "head").
///
///   server, each round, after the clients trained (the paper's Algorithm 1, as its code runs it):
///     w_k(y) = n_k(y) / sum_j n_j(y)            label shares of the round's clients
///     L(G)   = sum_k mean_i w_k(y_i) CE(head_k(G(y_i, eps_i)), y_i)  +  eta * L_div
///     L_div  = exp(-mean_{i,j} |eps_i - eps_j|^2 / d_eps * |G_i - G_j|_1 / d_G)
///     `steps` Adam steps on G (labels drawn uniformly from those some client holds), then FedAvg.
///   client k, each local step:
///     loss = CE(model(x), y) + alpha_t * B_gen / B * mean CE(head(G(y_s, eps)), y_s),
///     y_s drawn uniformly from the labels client k holds, alpha_t = max(alpha * decay^(t-1), 1e-4);
///     the first round has no generator term (the generator is untrained).
///
/// G(y, eps) = linear(C + d_eps -> hidden), relu, linear(hidden -> latent) on [onehot(y) | eps],
/// eps ~ N(0, I): the paper's generator without its batch normalization (kernels have none).
/// The client's term is the paper's teacher loss; its second regularizer (beta, a KL between the
/// model's outputs and the head's on generated features) is not applied.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/rng.hpp"
#include "troupe/federated/strategy.hpp"

namespace troupe::federated {

struct fedgen_options {
  double alpha = 10;      ///< the clients' weight of the generator term at round 1
  double decay = 0.98;    ///< per round
  int noise = 32;         ///< d_eps
  int hidden = 256;
  int steps = 50;         ///< generator steps per round
  int batch = 32;         ///< generated rows per step (server and clients)
  double lr = 3e-4;       ///< the generator's Adam
  double diversity = 1;   ///< eta
  /// alpha_t for round `round` (1-based): 0 in round 1, else max(alpha * decay^(round-1), 1e-4),
  /// and 0 whenever alpha is 0.
  double weight(int round) const;
};

/// True for "fedgen" and "fedgen:...".
bool is_fedgen(const std::string& spec);
/// "fedgen" or "fedgen:ALPHA" (ALPHA >= 0; 0 is FedAvg with an idle generator). Throws
/// std::invalid_argument for anything else.
fedgen_options parse_fedgen(const std::string& spec);

/// A linear head as kernels' linear layer holds it: weight [classes, latent] row-major, bias
/// [classes].
struct head_view {
  const float* weight = nullptr;
  const float* bias = nullptr;
};

/// The mean over `rows` rows of scale_i * CE(z_i W^T + b, y_i), scale_i = row_scale[y_i] (1 when
/// row_scale is null). When not null: adds `scale` times its gradient to gw [classes, latent] and
/// gb [classes], and its gradient with respect to z, times `scale`, to dz [rows, latent].
double head_cross_entropy(head_view head, int classes, int latent, const float* z, const std::uint8_t* y, int rows,
                          const double* row_scale, float scale, float* gw, float* gb, float* dz);

/// The paper's diversity loss of features g [rows, latent] made from noise [rows, noise_dim]
/// (see the file comment); adds `scale` times its gradient with respect to g to dg when not null.
double diversity_loss(const float* noise, int noise_dim, const float* g, int latent, int rows, float scale, float* dg);

/// The server's generator with its Adam optimizer.
class feature_generator {
public:
  feature_generator(int classes, int latent, const fedgen_options& options, std::uint64_t seed);
  ~feature_generator();
  feature_generator(feature_generator&&) noexcept;
  feature_generator& operator=(feature_generator&&) noexcept;

  int classes() const noexcept { return classes_; }
  int latent() const noexcept { return latent_; }
  const fedgen_options& options() const noexcept { return options_; }
  std::size_t parameter_count() const;
  /// The parameters as one flat vector (kernels' parameters() order).
  std::vector<float> parameters() const;
  /// Throws std::invalid_argument unless `flat` holds parameter_count() floats.
  void load(std::span<const float> flat);

  /// Features for `rows` labels into out [rows, latent]; the noise is drawn from `rng` (and
  /// kept in `noise` [rows, options.noise] when not null).
  void generate(const std::uint8_t* labels, int rows, splitmix64& rng, float* out, float* noise = nullptr);

  struct losses {
    double teacher = 0;
    double diversity = 0;
  };
  /// One Adam step on L(G) against `heads`, head k weighting label y by shares[k * classes + y];
  /// labels drawn uniformly from `labels`. Returns the losses before the step.
  losses train_step(std::span<const head_view> heads, std::span<const double> shares,
                    std::span<const std::uint8_t> labels, splitmix64& rng);
  /// The losses of a fixed draw (no step), for tests: the same labels and noise as a
  /// train_step from a copy of `rng`.
  losses evaluate(std::span<const head_view> heads, std::span<const double> shares,
                  std::span<const std::uint8_t> labels, splitmix64 rng);

  /// The optimizer's state (kernels::optimizer::save_state) and its restoration.
  std::vector<std::byte> save_optimizer() const;
  void load_optimizer(std::span<const std::byte> state);

private:
  struct nets;
  losses run(std::span<const head_view> heads, std::span<const double> shares, std::span<const std::uint8_t> labels,
             splitmix64& rng, bool step);
  int classes_ = 0, latent_ = 0;
  fedgen_options options_;
  std::unique_ptr<nets> nets_;
};

/// The label counts of client `client` (classes entries).
using label_counter = std::function<void(std::uint64_t client, std::span<std::uint32_t> counts)>;

/// FedGEN's server: FedAvg's step (x += server_lr * aggregate) after training the generator against the heads of the round's
/// clients (observed with observe()). `head_offset` is where the last linear layer's weight
/// starts in the flat model (its bias follows).
std::unique_ptr<server_strategy> make_fedgen_strategy(const fedgen_options& options, int classes, int latent,
                                                      std::size_t head_offset, label_counter counts, std::uint64_t seed,
                                                      double server_lr = 1);

}  // namespace troupe::federated
