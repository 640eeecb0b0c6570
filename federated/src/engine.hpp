#pragma once
// The state a simulation's clients read during a round, shared by the units of the engine:
// the round engine (simulation.cpp), the client actor (client.cpp), FedBuff's asynchronous
// rounds (async.cpp), checkpoints (checkpoint.cpp) and the options' checks (engine.cpp).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "troupe/federated/contribution.hpp"
#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/partition.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/layers.hpp"

namespace troupe::federated::detail {

using clock_type = std::chrono::steady_clock;
inline double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Seed streams: each random choice draws from its own stream of the run's seed.
inline constexpr std::uint64_t stream_model = 1;
inline constexpr std::uint64_t stream_partition = 2;
inline constexpr std::uint64_t stream_sample = 1ull << 32;   // + round
inline constexpr std::uint64_t stream_client = 2ull << 32;   // + client
inline constexpr std::uint64_t stream_transform = 3ull << 32;
inline constexpr std::uint64_t stream_speed = 4ull << 32;    // + client
inline constexpr std::uint64_t stream_fault = 5ull << 32;    // + round, then client
inline constexpr std::uint64_t stream_async = 6ull << 32;    // + dispatch: which idle client goes
inline constexpr std::uint64_t stream_dispatch = 7ull << 32; // + dispatch: its latency
inline constexpr std::uint64_t stream_async_fault = 8ull << 32;  // + dispatch: whether it fails
inline constexpr std::uint64_t stream_generator = 9;               // FedGEN's generator
inline constexpr std::uint64_t stream_holdout = 10;                // --eval-clients' held-out rows
inline constexpr std::uint64_t stream_contribution = 11;           // + round: the Shapley estimators' orders
// 12: the drifted clients (drift.cpp)
inline constexpr std::uint64_t stream_graph = 13;                  // the graph's nodes' clients; its stream 1: the labelled nodes (fedgcn.cpp)
inline constexpr std::uint64_t stream_continual = 14;  // the tasks' permutations, GPM's examples
inline constexpr std::uint64_t stream_unlearn = 15;                // unlearning: the ascent's order, the rows membership inference reads
inline constexpr std::uint64_t stream_drift_order = 16ull << 32;   // + client, then round: the order a detector reads its errors in

/// The clients' speed factors (simulation_options::latency).
struct latency_model {
  bool exponential = false;
  double parameter = 0.5;
};

struct worker_slot {
  std::unique_ptr<local_trainer> trainer;
  /// The model a client trains: the trainer's own parameters when it offers them
  /// (local_trainer::working_model), else `own`. One copy per worker, so that two workers'
  /// models and scratch share the caches they have.
  std::span<float> model;
  std::vector<float> own, correction;
  std::vector<std::uint8_t> errors;  // a client's errors for its drift detector
};

inline std::atomic<std::uint64_t> next_engine_id{1};

/// What every client reads during a round (and the per-worker scratch).
struct engine_state {
  simulation_options options;
  shared_data data;
  trainer_factory factory;
  partition part;      // what the clients train on
  partition holdout;   // --eval-clients: each client's held-out rows (empty otherwise)
  std::size_t dim = 0;
  std::unique_ptr<server_strategy> strategy;
  client_rule rule;
  std::vector<std::unique_ptr<update_transform>> transforms;
  std::vector<std::size_t> transform_offset;  // into a client's state, after SCAFFOLD's c_i
  std::size_t state_floats = 0;
  /// SCAFFOLD's c_i+ - c_i is kept within this, as secure aggregation's encoding keeps what it
  /// sums: c_i moves by what the server adds into c (infinite: no bound).
  double control_bound = std::numeric_limits<double>::infinity();
  latency_model latency;
  /// The clients keep optimizer state between their rounds (options.client_optimizer is not sgd).
  bool stateful_optimizer = false;
  /// Drift detection (options.drift_detect): each client runs a detector on its errors.
  bool detect_drift = false;
  bool reset_on_alarm = false;    // options.drift_response is reset
  bool cluster_on_alarm = false;  // options.drift_response is cluster
  std::atomic<std::size_t> state_bytes{0};
  std::atomic<std::size_t> state_holders{0};  // clients holding persistent state
  const std::uint64_t id = next_engine_id.fetch_add(1);

  std::mutex workers_mutex;
  std::map<std::thread::id, std::unique_ptr<worker_slot>> workers;

  // Update buffers go back and forth between the clients and the server rather than being
  // allocated per update: fresh 300 KB blocks cost a page fault per 4 KB.
  std::mutex buffers_mutex;
  std::vector<std::vector<float>> buffers;
  std::vector<std::vector<std::uint32_t>> word_buffers;  // encoded updates (masked under SecAgg)

  /// A buffer of n floats (contents unspecified). @threadsafe
  std::vector<float> take_buffer(std::size_t n) {
    std::vector<float> b;
    {
      std::lock_guard lock(buffers_mutex);
      if (!buffers.empty()) {
        b = std::move(buffers.back());
        buffers.pop_back();
      }
    }
    b.resize(n);
    return b;
  }
  /// @threadsafe
  void give_back(std::vector<float>&& b) {
    if (b.capacity() == 0) return;
    std::lock_guard lock(buffers_mutex);
    buffers.push_back(std::move(b));
  }
  /// An empty word vector, with the capacity of one given back earlier when there is one. @threadsafe
  std::vector<std::uint32_t> take_words() {
    std::vector<std::uint32_t> w;
    std::lock_guard lock(buffers_mutex);
    if (!word_buffers.empty()) {
      w = std::move(word_buffers.back());
      word_buffers.pop_back();
    }
    w.clear();
    return w;
  }
  /// @threadsafe
  void give_back(std::vector<std::uint32_t>&& w) {
    if (w.capacity() == 0) return;
    std::lock_guard lock(buffers_mutex);
    word_buffers.push_back(std::move(w));
  }

  /// The calling thread's scratch: one per worker thread, made on its first use.
  worker_slot& worker() {
    thread_local std::uint64_t cached_engine = 0;
    thread_local worker_slot* cached = nullptr;
    if (cached_engine == id) return *cached;
    std::lock_guard lock(workers_mutex);
    auto& slot = workers[std::this_thread::get_id()];
    if (!slot) {
      slot = std::make_unique<worker_slot>();
      slot->trainer = factory(data);
      slot->model = slot->trainer->working_model();
      if (slot->model.size() != dim) {
        slot->own.resize(dim);
        slot->model = slot->own;
      }
    }
    cached_engine = id;
    cached = slot.get();
    return *slot;
  }
};

struct round_context {
  engine_state* engine = nullptr;
  std::shared_ptr<const std::vector<float>> global;
  std::vector<float> control;  // SCAFFOLD's server control variate
  std::vector<float> generator;  // FedGEN's generator, when its term is on this round
  /// --drift-response cluster: the second model and which clients train from it (fixed during
  /// the round; null before the first alarm).
  std::shared_ptr<const std::vector<float>> second;
  const std::vector<char>* cluster = nullptr;
  double generator_weight = 0;
  std::vector<std::uint64_t> participants;
  round_info info;
  /// The clients keep what they had before training until the round's outcome (client::settle):
  /// a round the server gives up leaves their persistent state as it was.
  bool provisional = false;
};

/// A diverged client (too large a learning rate) ends the run with its name, on the server's
/// thread, before its NaN reaches the aggregate (where it would only show as a NaN model).
inline void check_finite(const client_update& u, const std::string& when) {
  if (u.diverged)
    throw std::runtime_error(when + " diverged: client " + std::to_string(u.client) +
                             "'s training is no longer finite (lower --lr, or check the attack settings)");
}


/// The bytes `u` takes on the wire (client_update::wire_bytes, else 4 per float or word).
inline std::uint64_t uplink_bytes(const client_update& u) {
  if (u.wire_bytes) return u.wire_bytes;
  return 4 * static_cast<std::uint64_t>(u.words.empty() ? u.delta.size() : u.words.size());
}

// ---- the options (engine.cpp) ----------------------------------------------------------------

latency_model parse_latency(const std::string& spec);
/// "cpu", "cuda" or "cuda:N"; throws std::invalid_argument for anything else and for a CUDA
/// device this process cannot use.
device parse_device(const std::string& spec);
/// FedBuff's K, or 0 for synchronous rounds.
std::size_t parse_async(const std::string& spec);
/// Throws std::invalid_argument, saying what to change, for options that cannot run.
void check_options(const simulation_options& o);
/// What FedBuff's buffer must hold for the mechanisms `o` installs (see engine.cpp).
void check_async_mechanisms(const simulation_options& o, std::size_t in_flight, std::size_t k);
/// The options' data set (Fashion-MNIST from o.data_dir, cut to o.train_limit).
shared_data load_data(const simulation_options& o);

/// The model `spec` describes: "mlp:784-100-10" (kernels::make_mlp) or any layer description
/// kernels::make_layer reads. Throws std::invalid_argument (from the kernels) for anything else.
std::unique_ptr<kernels::sequential> make_model(const std::string& spec);

// ---- fine-tuning (finetune.cpp) and LoRA (lora.cpp) ----------------------------------------

/// The model saved at `path`: the global model of a `troupe fedsim --checkpoint` directory (whose
/// --model must be `spec` unless `spec` is empty) or a `troupe train --save` weights file of
/// `spec`. `flag` names the option in the messages. Throws std::invalid_argument naming the path
/// and what does not fit.
std::unique_ptr<kernels::sequential> load_model_from(const std::string& path, const std::string& spec, const std::string& flag);
/// Writes into `model` the parameters of `spec` saved at `path` (simulation_options::
/// finetune_from). Throws std::invalid_argument naming the path and what does not fit.
void load_base_model(const std::string& path, const std::string& spec, std::span<float> model);
/// Applies simulation_options::shift to the training and test images of a copy of `data`.
shared_data shift_data(const shared_data& data, const std::string& spec);
/// The global model saved in the checkpoint `file` and the options it was saved with (one
/// "name=value" a line). Throws std::runtime_error as load_checkpoint does for a file that is not
/// a sound checkpoint.
std::vector<float> read_checkpoint_model(const std::string& file, std::string& options);
/// The LoRA trainer (simulation_options::lora).
trainer_factory make_lora_trainer_factory(const simulation_options& o);
/// Installs LoRA's server side and its uplink encoding into `sim`.
void install_lora(simulation& sim, const simulation_options& o);
/// Throws std::invalid_argument, saying what to change, for LoRA options that cannot run or
/// cannot combine with the others.
void check_lora_options(const simulation_options& o);

// ---- client contributions (contribution_engine.cpp) ------------------------------------------

/// Throws std::invalid_argument, saying what to change, for contribution options that cannot run
/// or cannot combine with the others (and for --contributions or --reward-budget without it).
void check_contribution_options(const simulation_options& o);
/// With --contribution: the first training row of the validation set (the last o.validation
/// rows), which the partition leaves out; 0 without. Throws for a validation set as large as the data.
std::size_t hold_out_validation(const simulation_options& o, const shared_data& data);
/// The tracker valuing each round on the training rows [first_row, n).
std::unique_ptr<contribution_tracker> make_contribution_tracker(const engine_state& e, bool custom_trainer,
                                                                std::size_t first_row);
/// The contribution figures of a run's summary (the AUC when --attack names malicious clients).
void summarize_contributions(const contribution_tracker& t, const simulation_options& o, summary& s);
/// Whether --attack makes `client` malicious.
bool is_attacker(const simulation_options& o, std::uint64_t client);

// ---- concept drift (drift_swap.cpp, drift_engine.cpp) ---------------------------------------

/// Wraps a trainer factory so that, from the drift's round on, the drifted clients train on their
/// examples with the two labels swapped (simulation_options::drift); evaluations add
/// "swapped_accuracy", on the test set with the labels swapped.
trainer_factory drift_training(trainer_factory inner, const simulation_options& o);
/// Throws std::invalid_argument, saying what to change, for drift options that cannot run or
/// cannot combine with the others.
void check_drift_options(const simulation_options& o);

// ---- continual learning (continual_engine.cpp, continual_trainer.cpp) ------------------------

struct continual_state;
/// --continual's trainer (continual_trainer.hpp).
trainer_factory make_continual_trainer_factory(const simulation_options& o);
/// Throws std::invalid_argument, saying what to change, for continual options that cannot run or
/// cannot combine with the others (and for --cl or --task-rounds without --continual).
void check_continual_options(const simulation_options& o);
/// Rounds per task (--task-rounds, else --rounds / T); 0 without --continual.
int continual_task_rounds(const simulation_options& o);
/// The state `t` shares with the other trainers of its factory, or null when `t` is not a
/// continual trainer.
std::shared_ptr<continual_state> continual_state_of(local_trainer& t);
/// Before round `round`: evaluations report every task up to the round's.
void continual_begin_round(continual_state& s, int round);
/// After round `round`: at the end of a task before the last, the consolidation (EWC's Fisher,
/// GPM's bases) from `clients` (the round's participants, each on its own shard in `part`) at
/// `global`, computed with `trainer`. Returns the bytes the clients sent for it (0 otherwise).
std::uint64_t continual_end_round(continual_state& s, local_trainer& trainer, const partition& part,
                                  std::span<const std::uint64_t> clients, std::span<const float> global, int round);

// ---- per-client quantities (engine.cpp) ------------------------------------------------------

/// Sizes each client's persistent state: SCAFFOLD's c_i, then every transform's slice.
void size_client_state(engine_state& e);
/// A client's simulated time for one piece of work: its own speed factor times its examples,
/// epochs and sample_seconds, plus exponential jitter (mean 0.1 s) drawn from `g`.
double work_seconds(const engine_state& e, std::uint64_t client, splitmix64& g);
/// The bounds on the weights the clients will send (client::train): 1 each when the strategy
/// weighs clients uniformly, else their shard sizes; a round holds at most `per_round` of them.
weight_bounds client_weight_bounds(const engine_state& e, std::size_t per_round);

}  // namespace troupe::federated::detail
