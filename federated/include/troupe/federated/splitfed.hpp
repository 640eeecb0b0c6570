#pragma once
/// @file
/// SplitFed (Thapa et al., AAAI 2022): split learning across K clients with horizontally
/// partitioned data. Each client holds a bottom model (the MLP's first layer and its ReLU) and
/// a shard of the training set; the server holds the top (the rest of the MLP). In a round
/// every client walks its shard once in batches (in a fresh random order): it sends the cut
/// layer's activations and the labels, the server steps the top and sends back the cut layer's
/// gradient, the client steps its bottom. The server serves the clients one after another on
/// its one top (SplitFed's sequential server, as in its "V2"); after the round the client bottoms
/// are averaged by FedAvg (weighted by shard size) into the bottom every client starts the
/// next round from. The clients are actors (each builds its bottom for a round and frees it
/// after); the server is the caller's thread. With one client this is plain SGD on the whole
/// MLP, bit for bit (splitfed_reference).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/federated/simulation.hpp"

namespace troupe::federated {

struct splitfed_options {
  std::string model = "mlp:784-100-10";  ///< an MLP with a hidden layer
  std::size_t clients = 10;
  std::string partition = "iid";         ///< "iid" or "dirichlet:A"
  int rounds = 5;
  int batch = 10;
  double lr = 0.05;
  std::uint64_t seed = 0;
  int eval_every = 1;
  unsigned threads = 0;  ///< the client actors' worker threads (0: one per hardware thread)
  std::size_t train_limit = 0, test_limit = 0;
  std::string data_dir, data;
};

struct splitfed_summary {
  double final_accuracy = 0, final_loss = 0;
  std::int64_t steps = 0;
  double bytes_per_step = 0;  ///< activations and labels up, the cut gradient down
  double seconds = 0;
  std::vector<float> model;   ///< the averaged bottom then the top, in the MLP's parameter order
};

struct splitfed_progress {
  int round = 0, rounds = 0;
  double accuracy = 0, loss = 0, train_loss = 0, seconds = 0;
};

/// Runs SplitFed (on `data` when given, else the options' data set). Throws
/// std::invalid_argument for options that cannot run.
splitfed_summary run_splitfed(const splitfed_options& options, shared_data data = nullptr,
                              const std::function<void(const splitfed_progress&)>& report = {});

/// The plain-SGD definition for one client: the whole MLP from the same initial weights, stepped
/// on the same batches in the same order. Its parameters, in the MLP's order. Throws
/// std::invalid_argument unless options.clients is 1.
std::vector<float> splitfed_reference(const splitfed_options& options, shared_data data);

}  // namespace troupe::federated
