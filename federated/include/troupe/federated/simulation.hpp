#pragma once
/// @file
/// A federated simulation on one host (what `troupe fedsim` runs).
///
/// Every client is an actor holding a view of its shard (a range of one shared index array),
/// an 8-byte generator and, only when its algorithm needs one, persistent state (SCAFFOLD's
/// control variate, a transform's residual): no model while idle. Working model copies exist
/// once per worker thread. Each round the server (the thread calling run_round) samples
/// clients with a seeded generator, asks them to train from the shared, immutable global
/// model, and adds their updates into the aggregator in sample order through a bounded
/// window of outstanding asks, so that the result is bit-identical at any thread count and at
/// most `window` updates exist at once.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "troupe/federated/rng.hpp"
#include "troupe/federated/strategy.hpp"
#include "troupe/federated/update.hpp"

namespace troupe {
struct labelled_data;
using fashion_mnist = labelled_data;  // as troupe/kernels/data.hpp declares it
}

namespace troupe::federated {

class contribution_tracker;

/// The largest population a simulation takes: each client is an actor with its own state, about
/// 250 bytes even with the noop trainer (10 million: 2.5 GB).
constexpr std::size_t max_clients = 10'000'000;

struct simulation_options {
  std::size_t clients = 100;  ///< at most max_clients
  std::size_t per_round = 10;     ///< clients sampled per round (unless fraction > 0)
  double fraction = 0;            ///< > 0: sample round(fraction * clients) ...
  std::size_t min_per_round = 1;  ///< ... but at least this many
  int rounds = 200;
  int local_epochs = 1;
  /// > 0: each client takes exactly this many steps per round instead (batches drawn through its
  /// shard in a fresh order each pass, as a data loader cycles), whatever its shard's size.
  int local_steps = 0;
  int batch = 10;
  double lr = 0.05;               ///< clients' learning rate
  /// The clients' optimizer: "sgd" (plain SGD: no state), "adam" or "adamw" (betas 0.9 and
  /// 0.999, eps 1e-8, no weight decay). Adam's moments are each client's own: kept between the
  /// rounds it is sampled in, idle clients holding only them, stored as `client_state` says.
  std::string client_optimizer = "sgd";
  /// Storage of a stateful client optimizer's moments: "fp32", "bf16" or "int8" (8-bit blocks of
  /// 256 with fp32 scales; tensors under 4096 elements stay fp32; see kernels/optim.hpp).
  std::string client_state = "fp32";
  /// Where the clients' steps run: "cpu", or "cuda" / "cuda:N" (the layers and the fused
  /// optimizer on that GPU, every worker's client actors sharing it; the server evaluates there
  /// too). FedProx's and SCAFFOLD's gradient terms need "cpu".
  std::string device = "cpu";
  /// "mlp:784-100-10", or any layer description kernels::make_layer reads
  /// ("sequential(linear(784->64), gelu, linear(64->10))").
  std::string model = "mlp:784-100-10";
  std::string partition = "dirichlet:0.5";  ///< see partition.hpp
  std::string strategy = "fedavg";          ///< see strategy.hpp
  /// Clients of different architectures: "SPEC,SPEC,..." assigned to the clients round-robin,
  /// trained with strategy fedavg (within each architecture), feddf or fedmd; run_heterogeneous
  /// (distillation.hpp) runs them, a simulation refuses them. Empty: every client has `model`.
  std::string client_models;
  std::size_t public_examples = 5000;  ///< with client_models: training examples held out as the server's public data
  int distill_steps = 100;             ///< feddf: the server's distillation steps (batches of 64) per round
  strategy_options server;
  std::uint64_t seed = 0;
  int eval_every = 10;            ///< evaluate every N rounds (and after the last one)
  /// Per-client evaluation (fairness.hpp): a seeded 20% of each client's shard is held out (never
  /// trained on) as its local test set, and every evaluation adds the mean, standard deviation,
  /// worst 10% and best 10% of the global model's accuracies on them ("client_accuracy_*").
  bool eval_clients = false;
  unsigned threads = 0;           ///< worker threads; 0: one per hardware thread
  std::string data_dir;           ///< empty: Debian's fashion-mnist location
  /// Another data set instead of Fashion-MNIST: "npz:FILE" (NumPy's .npz with x_train, y_train,
  /// x_test, y_test and optionally client_train, which then partitions the training set: one
  /// client per index, --clients must match) or "idx:DIR" (MNIST-style IDX files); see
  /// kernels/data.hpp.
  std::string data;
  /// "mlp" trains the model; "noop" returns a tiny update without training (measures the
  /// orchestration alone).
  std::string trainer = "mlp";
  std::size_t train_limit = 0;    ///< use only the first N training examples (0: all)
  std::size_t test_limit = 0;     ///< evaluate on the first N test examples (0: all)
  /// Faults and stragglers (seeded per client and round, or per dispatch under FedBuff). A
  /// sampled client fails with probability `dropout` (its update never arrives; under FedBuff
  /// its slot goes to another client when its update would have arrived). Each client takes simulated time
  /// speed * examples * epochs * sample_seconds + jitter, where speed is its own log-normal
  /// factor (sigma 0.5) and jitter is exponential with mean 0.1 s; with a `deadline` (simulated
  /// seconds, 0: none) later updates are discarded. `over_select` samples that fraction more
  /// clients and keeps the first per-round ones to finish.
  double dropout = 0;
  double deadline = 0;
  double over_select = 0;
  double sample_seconds = 1e-3;
  /// The clients' speed factors: "lognormal:S" (each client's own factor exp(S N(0, 1)), fixed
  /// for the run) or "exponential:M" (each client's own factor drawn once from an exponential
  /// with mean M).
  std::string latency = "lognormal:0.5";
  /// "" (synchronous rounds) or "fedbuff:K": buffered asynchronous aggregation (Nguyen et al.,
  /// 2022). per_round clients train at once, each from the model version it was given; the
  /// server applies an update (one "round") every K arrivals, x += server_lr * strategy(sum of
  /// staleness_weight(s) * delta / K) with s = server version now - the client's version, and a
  /// client that finishes is replaced at once. A virtual clock (the latency model above, per
  /// dispatch) orders the arrivals, so the run is deterministic at any thread count. With a
  /// robust rule or differential privacy the aggregator receives the K staleness-weighted
  /// updates of each step (see docs/federated/time.md); deadlines, over-selection, SCAFFOLD, secure
  /// aggregation and adaptive clipping are refused.
  std::string async;
  /// Asks outstanding at once; 0: from the update size (about 16 MB of updates, at least
  /// 4 per thread, at most 256).
  std::size_t window = 0;

  // Mechanisms (mechanisms.hpp), installed by the constructor. `strategy` may also name a robust
  // aggregation rule (median, trimmed-mean:B, krum:F, multi-krum:F:M): the server then moves the
  // model by that rule's aggregate, as FedAvg does by the mean.
  bool secagg = false;            ///< SecAgg+ (the server sees only the sum)
  double secagg_dropout = 0;      ///< fraction of each round's clients lost after masking
  double dp_clip = 0;             ///< > 0 with dp_noise: DP-FedAvg with this clipping bound
  double dp_noise = 0;            ///< DP-FedAvg's noise multiplier z
  double dp_delta = 1e-5;         ///< δ of the reported ε
  bool dp_adaptive = false;       ///< adaptive clipping (dp_clip is the initial bound)
  std::string compress;           ///< "", "topk:F" or "qsgd:L"
  std::string attack;             ///< "", "sign-flip:P", "scale:P:X", "label-flip:P" or "backdoor:P:T"
  /// > 0: every client proves in zero knowledge that its update's L2 norm is at most this bound
  /// (zkproof.hpp, on verify_bits-bit coordinates) and the server aggregates only the updates
  /// whose proof verifies (make_norm_verification, mechanisms.hpp).
  double verify_norm = 0;
  int verify_bits = 16;           ///< k of the norm proofs: 8, 16 or 32
  /// Attested aggregation (tee.hpp): "sim" runs the aggregator as a simulated enclave in a
  /// process of its own, which the clients attest before sealing their updates to it; "" none.
  std::string tee;
  /// The root the clients accept quotes under: "test" (the simulated platform's test root, the
  /// only one --tee sim can give). Empty: no root, so --tee sim is refused.
  std::string tee_root;
  /// With tee and topk compression: the enclave densifies sparse updates obliviously.
  bool tee_oblivious = false;
  /// The enclave node's program, run as `PROGRAM tee-enclave --head HOST:PORT`; empty: this
  /// process's own executable (the troupe command).
  std::string tee_program;

  /// Fine-tuning: the initial global model is the one saved in this path instead of a fresh
  /// one: a `--checkpoint` directory of an earlier run (its fedsim.ckpt, saved with the same
  /// --model) or a weights file written by `troupe train --save` (kernels/weights.hpp). Empty:
  /// none.
  std::string finetune_from;
  /// A shift of the data, applied to the training and the test images alike: "rot90" (each
  /// square image turned a quarter counter-clockwise) or "brightness:C" (every u8 pixel times
  /// C, rounded and clipped to 0..255 before normalization). Empty: none.
  std::string shift;
  /// LoRA fine-tuning (lora.hpp, src/lora.cpp): "R" or "R1,R2,..." (client c trains adapters of
  /// rank R[c % n] on every linear layer, the model's own parameters frozen and only the adapters
  /// uploaded), aggregated by `lora_agg`: "fedit", "fedex", "flexlora" or "hetlora". Needs
  /// finetune_from. Empty: clients train the whole model.
  std::string lora;
  std::string lora_agg = "fedit";
  /// LoRA's alpha: the change is (alpha / rank) B A; 0: alpha = the client's rank (scale 1).
  double lora_alpha = 0;

  /// Concept drift (drift.hpp, src/drift_swap.cpp): "swap:ROUND:FRACTION:A-B" makes a seeded
  /// FRACTION of the clients train (and report errors) on their examples with labels A and B
  /// swapped from round ROUND on. Empty: none.
  std::string drift;
  /// "ddm" or "adwin": each client runs that detector on its stream of local errors (the 0/1
  /// errors of the model it is sent, on its shard, before it trains, read in a seeded order
  /// drawn afresh each round) and reports an alarm with its update. Empty: no detection.
  std::string drift_detect;
  /// What an alarm does: "" (reported only), "reset" (the client's detector, optimizer state
  /// and algorithm state start afresh) or "cluster" (the client moves to a second global model,
  /// trained by FedAvg among the alarmed clients from then on, as FedDrift does).
  std::string drift_response;

  /// Continual learning (continual.hpp): "permuted:T" or "split:T" trains T tasks one after
  /// another, each for task_rounds rounds (0: rounds / T); evaluations report the accuracy on each
  /// task seen so far. Empty: one task, the data as it is.
  std::string continual;
  /// With continual: "none", "ewc:LAMBDA" or "gpm:THRESHOLD".
  std::string cl;
  int task_rounds = 0;

  /// run_simulation's checkpoints: a directory (empty: none). The whole state is saved there
  /// after every evaluated round, or every `checkpoint_every` rounds when > 0, and a run that
  /// finds a checkpoint there resumes from it (bit-identical to a run never stopped).
  std::string checkpoint;
  int checkpoint_every = 0;

  /// Client contributions (contribution.hpp): "exact", "mc:P" or "gtg:EPS" values each round's
  /// participants by their Shapley values, the utility of a coalition being the accuracy, on
  /// `validation` training examples held out of every client's shard, of the starting model plus
  /// the weighted mean of the coalition's updates, minus that of the starting model. Empty: none.
  std::string contribution;
  std::size_t validation = 500;    ///< with contribution: the last N training examples are held out
  /// A coalition's model (contribution_tracker): "mean" (the weighted mean of its updates) or
  /// "share" (its share of the round's FedAvg sum; a client that sends no change is worth 0).
  std::string coalition_model = "mean";
  std::string contributions_file;  ///< run_simulation writes each client's cumulative values there (CSV)
  /// "B[:FLOOR_FRACTION]": each round B is paid out from the values (budget_rewards). Empty: none.
  std::string reward_budget;

  /// Unlearning (unlearn.hpp): "attackers" (the clients --attack makes malicious) or
  /// "ID,ID,...". run_simulation trains `unlearn_at` rounds with every client, removes those
  /// clients' contribution by `unlearn_method` ("retrain", "pga[:K]", "calibrate[:DT]"), and
  /// trains on without them up to `rounds`. Empty: none.
  std::string unlearn;
  int unlearn_at = 0;
  std::string unlearn_method = "retrain";
  /// Clients that stay in the population (their shards, their place in every seeded draw) but are
  /// never sampled: the sampler draws as it would, and drops them from the draw. A run with these
  /// excluded from its first round is "a run that never had them". Empty: none.
  std::vector<std::uint64_t> excluded;
};

/// A test-set evaluation.
struct evaluation {
  double accuracy = 0;  ///< NaN when the trainer measures none (noop)
  double loss = 0;      ///< NaN likewise
  std::vector<std::pair<std::string, double>> metrics;  ///< more measures (e.g. backdoor_success)
};

/// One client's local work in a round.
struct local_job {
  std::uint64_t client = 0;
  std::span<const float> global;            ///< the model broadcast this round
  std::span<const std::uint32_t> shard;     ///< indices into the training set
  int epochs = 1;
  int steps = 0;                            ///< > 0: exactly this many steps instead of epochs
  int batch = 10;
  double lr = 0.05;
  double proximal_mu = 0;                   ///< FedProx: gradient += mu * (w - global)
  std::span<const float> correction;        ///< empty, or dim floats added to every gradient
  /// The client's own optimizer state when the options give clients a stateful optimizer (null
  /// otherwise): on entry what the client kept from its last round (empty the first time), on
  /// return what it keeps for the next (as kernels::optimizer::save_state writes it).
  std::vector<std::byte>* optimizer_state = nullptr;
  /// FedGEN (fedgen.hpp): the server's generator of latent features and the weight of the
  /// clients' term on it this round; empty and 0 otherwise.
  std::span<const float> generator;
  double generator_weight = 0;
  /// q-FedAvg: measure the mean loss on the whole shard at job.global before training
  /// (local_result::start_loss).
  bool start_loss = false;
  int round = 0;                            ///< the round (1-based) the job belongs to
};

struct local_result {
  double loss = 0;        ///< mean training loss
  std::int64_t steps = 0; ///< optimizer steps taken
  std::int64_t samples = 0;
  /// Steps the optimizer refused because the gradients were not finite: the client's training
  /// diverged, and its update ends the run (as a non-finite update does).
  std::int64_t skipped = 0;
  /// With local_job::start_loss: the mean loss of job.global on the shard (0 for an empty one);
  /// NaN when the trainer measures none.
  double start_loss = std::numeric_limits<double>::quiet_NaN();
};

/// What a client does in a round. The engine makes one per worker thread (plus one for the
/// server's evaluations), so an instance may keep scratch buffers; it is used by one thread
/// at a time.
class local_trainer {
public:
  virtual ~local_trainer() = default;
  /// Floats in the model.
  virtual std::size_t dim() const = 0;
  /// Writes the initial global model.
  virtual void initialize(std::span<float> model, std::uint64_t seed) = 0;
  /// Trains `model` (a copy of job.global on entry) in place; draws only from `rng`.
  virtual local_result train(const local_job& job, std::span<float> model, splitmix64& rng) = 0;
  /// dim() floats the trainer trains in when they are what train() is handed (its model's own
  /// parameters: no copy in and out); empty: the engine keeps a working model per worker.
  virtual std::span<float> working_model() { return {}; }
  /// Test accuracy and mean loss of `model`.
  virtual evaluation evaluate(std::span<const float> model) = 0;
  /// Accuracy and mean loss of `model` on these rows of the training set (a client's held-out
  /// examples under --eval-clients); NaN for no rows. The default throws std::logic_error:
  /// a trainer that measures nothing (noop) cannot.
  virtual evaluation evaluate_rows(std::span<const float> /*model*/, std::span<const std::uint32_t> /*rows*/) {
    throw std::logic_error("this trainer does not measure accuracy on the clients' examples");
  }
  /// The 0/1 errors (1: the prediction is not the label) of `model` on the examples of
  /// job.shard, in shard order, into `out` (resized): what a client's drift detector reads, in a
  /// seeded order (simulation_options::drift_detect). The default throws std::invalid_argument:
  /// the trainer measures none.
  virtual void errors(const local_job& job, std::span<const float> model, std::vector<std::uint8_t>& out) {
    (void)job, (void)model, (void)out;
    throw std::invalid_argument("this trainer measures no per-example errors (drift detection needs --trainer mlp)");
  }
  /// Throws std::invalid_argument, saying why, for optimizer state that train() could not take
  /// (a checkpoint's, checked before it is restored). Trainers that keep none accept only empty.
  virtual void check_optimizer_state(std::span<const std::byte> state) {
    if (!state.empty()) throw std::invalid_argument("this trainer keeps no optimizer state");
  }
};

/// The data a simulation trains on, shared read-only by every client.
using shared_data = std::shared_ptr<const fashion_mnist>;
/// Makes a trainer for `data`; called once per worker thread.
using trainer_factory = std::function<std::unique_ptr<local_trainer>(const shared_data& data)>;

/// The built-in trainers: "mlp" (SGD on the options' model: kernels' layers trained by a
/// kernels::optimizer through kernels::classifier) and "noop".
trainer_factory make_trainer_factory(const simulation_options& options);

struct round_report {
  int round = 0;
  std::size_t sampled = 0;       ///< clients sampled (over-selection included)
  /// Their ids: in ascending order; under FedBuff (simulation_options::async) the clients whose
  /// update or failure the server step took, in arrival order.
  std::vector<std::uint64_t> sampled_clients;
  std::size_t dropped = 0;       ///< sampled clients that failed
  std::size_t late = 0;          ///< sampled clients past the deadline
  std::size_t participants = 0;  ///< updates aggregated
  double simulated_seconds = 0;  ///< the round's simulated duration (the latency model)
  double train_loss = 0;   ///< sample-weighted mean of the clients' training losses
  double seconds = 0;      ///< wall time of the round
  std::vector<std::pair<std::string, double>> metrics;  ///< from the transforms' end_round
  /// Bytes the round's updates took on the wire: 4 per float or word sent, or what a transform
  /// that encodes more tightly reports (client_update::wire_bytes).
  std::uint64_t uplink_bytes = 0;
  /// Clients whose drift detector alarmed in this round (simulation_options::drift_detect), in
  /// aggregation order.
  std::vector<std::uint64_t> drift_alarms;
  /// Clients whose update the aggregator refused (aggregator::rejected: a norm proof that
  /// failed), in aggregation order.
  std::vector<std::uint64_t> rejected;
  /// Non-empty when the aggregator gave the round up (round_aborted): why. The model is as it
  /// was before the round, and the metrics hold "aborted" 1.
  std::string aborted;
};

/// Not thread-safe: one thread drives it.
class simulation {
public:
  /// Loads the data (unless given), partitions it, initializes the model and spawns the
  /// clients. Throws std::invalid_argument for bad options (with what to change) and
  /// std::runtime_error for missing data.
  explicit simulation(simulation_options options, shared_data data = nullptr,
                      trainer_factory trainer = nullptr);
  ~simulation();
  simulation(const simulation&) = delete;
  simulation& operator=(const simulation&) = delete;

  /// Replaces the strategy (before the first round).
  void set_strategy(std::unique_ptr<server_strategy> strategy);
  /// Replaces the aggregator (default: make_weighted_mean()). Under FedBuff it then receives,
  /// at each server step, the K buffered updates, each scaled by its staleness weight, with
  /// the clients' own weights; without one the step is FedBuff's sum / K.
  void set_aggregator(std::unique_ptr<aggregator> aggregator);
  /// Appends a client-side transform (before the first round).
  void add_transform(std::unique_ptr<update_transform> transform);

  /// Runs the next round.
  round_report run_round();
  /// Evaluates the current global model on the test set.
  evaluation evaluate();

  int rounds_done() const noexcept;
  std::span<const float> global_model() const noexcept;
  std::size_t population() const noexcept;
  std::size_t sample_size() const noexcept;
  /// The most updates a synchronous round aggregates (the sample before over-selection).
  std::size_t cohort_size() const noexcept;
  /// FedBuff's K (updates per server step), or 0 for synchronous rounds.
  std::size_t buffer_size() const noexcept;
  /// The clients sampled in round `round` (1-based), in ascending order.
  std::vector<std::uint64_t> sample(int round) const;
  /// Of those, the clients whose updates round `round` aggregates (no failure, before the
  /// deadline, the first per-round to finish under over-selection), in aggregation order.
  std::vector<std::uint64_t> participants(int round, round_report* report = nullptr) const;
  /// Client `client`'s simulated time in round `round`, or a negative number when it fails.
  double simulated_latency(std::uint64_t client, int round) const;
  /// Bytes of persistent client state held (all clients together): the algorithm's (SCAFFOLD's
  /// control variate, the transforms') and the clients' optimizer state.
  std::size_t client_state_bytes() const noexcept;
  /// Clients that hold persistent state.
  std::size_t clients_with_state() const noexcept;
  /// Under --drift-response cluster: the clients moved to the second model (one flag per
  /// client; empty otherwise).
  const std::vector<char>& drift_cluster() const noexcept;
  /// Under --drift: the drifted clients (one flag per client; empty otherwise).
  const std::vector<char>& drifted() const noexcept;
  /// Simulated seconds since the start: the sum of the synchronous rounds' durations (each as
  /// long as its slowest kept client), or the virtual clock at the last asynchronous update.
  double simulated_seconds() const noexcept;
  /// The Shapley values so far (simulation_options::contribution); null without.
  const contribution_tracker* contributions() const noexcept;

  /// From the next round on, these clients are never sampled (simulation_options::excluded,
  /// which sets them from the first round). Throws std::invalid_argument for a client outside
  /// the population.
  void exclude_clients(std::span<const std::uint64_t> clients);
  /// Replaces the global model the next round starts from (unlearning's). Throws
  /// std::invalid_argument for a model of another size.
  void set_global_model(std::span<const float> model);
  /// The training rows of client `client`'s shard (those it trains on; under --eval-clients
  /// without its held-out ones).
  std::span<const std::uint32_t> client_rows(std::uint64_t client) const;
  /// The data the clients train on (null for a trainer without data).
  const shared_data& data() const noexcept;
  /// The trainer the server evaluates with (under a data attack it reports backdoor_success).
  local_trainer& server_trainer() noexcept;

  /// Writes everything the next rounds depend on (round counter, global model, strategy and
  /// transform state, every client's generator and persistent state; under FedBuff the server
  /// version, the dispatch counter and the clients in flight with their arrival times and
  /// finished updates, waiting for them first) with a version, the options that must match
  /// and a CRC-32, to `file` atomically: a temporary file beside it, fsync, rename. Throws
  /// std::runtime_error when it cannot write. Between rounds only.
  void save_checkpoint(const std::string& file) const;
  /// Continues from `file`. Throws std::runtime_error, changing nothing, for a file that is
  /// unreadable, truncated, corrupted, of another version or saved with other options (the
  /// message names the first that differs).
  void load_checkpoint(const std::string& file);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// FedBuff's weight of an update `staleness` server versions old: 1 / sqrt(1 + staleness).
double staleness_weight(std::int64_t staleness);

/// Reported by run_simulation after every round.
struct progress {
  const round_report* round = nullptr;
  int rounds = 0;
  bool evaluated = false;
  evaluation eval;          ///< when evaluated
  double seconds = 0;       ///< since the start, setup included
  double rounds_per_s = 0;  ///< rounds per second of round time so far (checkpoints included, evaluations excluded)
  double simulated_seconds = 0;  ///< simulation::simulated_seconds() after the round
  std::uint64_t uplink_bytes = 0;  ///< the clients' uplink bytes since the run (or its resumption) started
};

struct summary {
  int rounds = 0;
  double final_accuracy = 0;
  double final_loss = 0;
  double rounds_per_s = 0;  ///< rounds per second of round time (checkpoints included, evaluations excluded)
  double seconds = 0;       ///< wall time of the whole run
  double peak_rss_mb = 0;   ///< the process's peak resident memory
  std::uint32_t model_crc32 = 0;  ///< CRC-32 of the final global model's bytes
  int resumed_from = 0;     ///< the round of the checkpoint the run resumed from (0: none)
  /// Persistent state per client that holds any (its optimizer's moments and its algorithm's
  /// state), in bytes, at the end (0: none).
  double state_bytes_per_client = 0;
  /// Bytes the clients sent in the rounds this run ran (not those before a resumed checkpoint).
  std::uint64_t uplink_bytes = 0;
  /// The last evaluation's further measures (backdoor_success, client_accuracy_*...).
  std::vector<std::pair<std::string, double>> final_metrics;

  // With simulation_options::contribution:
  std::size_t contribution_rounds = 0;          ///< rounds whose participants were valued
  std::size_t contribution_rounds_skipped = 0;  ///< of those, rounds gtg did not value (gain below EPS)
  double contribution_seconds = 0;              ///< wall time spent valuing (in the rounds' time)
  std::size_t contribution_evaluations = 0;     ///< validation evaluations, the rounds' base models included
  /// With an attack: the AUC of the cumulative values for honest against malicious clients
  /// (the probability that an honest client's exceeds a malicious one's, ties one half), and
  /// the mean cumulative value of each group; NaN where a group is empty.
  double contribution_auc = 0, value_mean_honest = 0, value_mean_malicious = 0;
  double rewards_total = 0;  ///< with reward_budget: paid over the run, in units of the budget
  /// The drift detectors' alarms: (round, clients) for each round with any.
  std::vector<std::pair<int, std::vector<std::uint64_t>>> drift_alarms;
  /// Under --drift: the drifted clients, ascending.
  std::vector<std::uint64_t> drifted_clients;
  /// With simulation_options::continual: each task's accuracy right after its last round and at
  /// the end, ACC (the mean of the latter) and BWT (the mean over all tasks but the last of the
  /// latter minus the former), and the bytes the consolidations' messages took (in uplink_bytes too).
  std::vector<double> task_accuracy_after, task_accuracy_final;
  double acc = 0, bwt = 0;
  std::uint64_t consolidation_bytes = 0;
  /// The clients the aggregator refused: (round, clients) for each round with any.
  std::vector<std::pair<int, std::vector<std::uint64_t>>> rejected_clients;
};

/// Runs options.rounds rounds with evaluations every options.eval_every rounds (resuming from
/// and saving checkpoints in options.checkpoint).
summary run_simulation(const simulation_options& options,
                       const std::function<void(const progress&)>& report = {});

/// The process's peak resident set size in MB (getrusage).
double peak_rss_mb();

}  // namespace troupe::federated
