#pragma once
/// @file
/// Decentralized federated learning: no server. Every client is a peer actor that keeps its own
/// model, trains it on its shard and averages it with its neighbours in a graph by sending its
/// model to them in messages.
///
///   gossip     randomized gossip (Boyd, Ghosh, Prabhakar and Shah, 2006): after its local
///              training (--local-epochs or --local-steps, as in FedAvg), `clients` random edges
///              are activated one after another, each (i, j) chosen as a uniform client i and a
///              uniform neighbour j; both ends take the pair's average. Edges that share no peer
///              run at the same time, with the result of the sequential order.
///   dpsgd      D-PSGD (Lian et al., NeurIPS 2017): each iteration every peer computes one SGD
///              step's change g_i at its model x_i, and x_i <- sum_j W_ij x_j + g_i with the
///              Metropolis–Hastings weights W_ij = 1 / (1 + max(d_i, d_j)) on the edges and
///              W_ii = 1 - sum_j W_ij. A round is --local-steps iterations (default: the steps of
///              one pass over the mean shard).
///   allreduce  local training as in gossip, then the exact mean of all models by the ring
///              all-reduce of troupe::actors (collective.hpp): FedAvg with every client, equal weights.
///
/// The consensus error of models x_1..x_n with mean x̄ is sqrt((1/n) sum_i ||x_i - x̄||²), the
/// root-mean-square Euclidean distance of the models to their mean; the accuracy reported is the
/// mean model's on the test set.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "troupe/federated/simulation.hpp"

namespace troupe::federated {

/// An undirected graph on clients 0..n-1: each one's neighbours, ascending, without itself.
struct topology {
  std::string name;
  std::vector<std::vector<std::uint32_t>> neighbours;
  std::size_t size() const noexcept { return neighbours.size(); }
};

/// "ring" (n >= 3), "torus" (an R×C grid with wrap-around, R the largest divisor of n with
/// 3 <= R <= sqrt(n), C = n / R >= 3), "random-regular:D" (a uniform-ish D-regular graph drawn
/// from `seed`, redrawn until connected; 1 <= D < n, n·D even) or "complete". Throws
/// std::invalid_argument for another spec or a size the graph cannot have.
topology make_topology(const std::string& spec, std::size_t n, std::uint64_t seed);

/// True when every client reaches every other.
bool is_connected(const topology& g);

/// Metropolis–Hastings weights: row i's weight of itself and of each neighbour (in
/// g.neighbours[i]'s order). Symmetric and doubly stochastic.
struct mixing_row {
  double self = 1;
  std::vector<double> neighbour;
};
std::vector<mixing_row> metropolis_weights(const topology& g);

/// sqrt((1/n) sum_i ||x_i - x̄||²) over the rows of `models` (n rows of equal length).
double consensus_error(const std::vector<std::vector<float>>& models);

/// One averaging step x_i <- W_ii x_i + sum_j W_ij x_j for every i (neighbours in ascending
/// order, float32 accumulation): the plain reference of the peers' messages.
std::vector<std::vector<float>> metropolis_step(const topology& g, const std::vector<mixing_row>& w,
                                                const std::vector<std::vector<float>>& models);

/// The edges randomized gossip activates in a round: `count` pairs (i, j), i uniform, j a
/// uniform neighbour of i, drawn from `seed`.
std::vector<std::pair<std::uint32_t, std::uint32_t>> gossip_edges(const topology& g, std::size_t count,
                                                                  std::uint64_t seed);

struct decentralized_options {
  simulation_options base;       ///< clients, rounds, data, model, partition, lr, batch, seed, ...
  std::string topology = "ring";
  std::string mode = "dpsgd";    ///< "gossip", "dpsgd" or "allreduce"
};

struct decentralized_report {
  int round = 0;
  bool evaluated = false;
  double accuracy = 0, loss = 0;  ///< the mean model's, when evaluated
  double consensus_error = 0;     ///< after the round
  double train_loss = 0;          ///< mean of the peers' training losses in the round
  std::uint64_t bytes = 0;        ///< model bytes the peers sent one another so far
  double seconds = 0;
};

struct decentralized_summary {
  int rounds = 0;
  double final_accuracy = 0, final_loss = 0, consensus_error = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  std::vector<float> mean_model;
};

/// Runs decentralized training (on `data` when given, else the options' data set; `trainer`
/// when given, else the built-in one). Throws std::invalid_argument for options it cannot run.
decentralized_summary run_decentralized(const decentralized_options& options, shared_data data = nullptr,
                                        trainer_factory trainer = nullptr,
                                        const std::function<void(const decentralized_report&)>& report = {});

/// Pure averaging without training, as the peers do it: `steps` Metropolis steps ("dpsgd"'s
/// averaging) or gossip rounds of `models.size()` edges ("gossip"), by messages between peer
/// actors on `threads` workers; the models after each step (entry 0: the input).
std::vector<std::vector<std::vector<float>>> run_averaging(const topology& g, const std::string& mode,
                                                           std::vector<std::vector<float>> models, int steps,
                                                           std::uint64_t seed, unsigned threads = 1);

}  // namespace troupe::federated
