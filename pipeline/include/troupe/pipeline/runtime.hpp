#pragma once
/// @file
/// The pipeline runtime: one actor per rank runs a schedule's actions on real layers.
///
///   troupe::actor_system sys{{.threads = 2}};
///   auto s = pipeline::generate("1f1b", 4, 8);   // 4 ranks, 8 microbatches
///   pipeline::trainer t(sys, s, std::move(stages), {.optimizer = kernels::optimizer_kind::adamw});
///   auto r = t.step(x, labels);          // one training step on a batch
///
/// Each rank actor owns its stages' layers (kernels::sequential, one per stage, in model order)
/// and one optimizer over their parameters. A step splits the batch into the schedule's
/// microbatches and sends each rank its share; the rank walks its action list in order: F, B, I
/// and W run its layers (the split backward of zero-bubble schedules is the layers' own
/// backward_input/backward_weight), SEND_F/SEND_B move the activation or gradient tensor into
/// the neighbour rank's mailbox, and RECV_F/RECV_B wait for it there. The last stage computes the
/// softmax cross-entropy of its output. The loss is the batch mean: each microbatch's gradient
/// is scaled by 1/microbatches, so a step equals one step on the whole batch. With clipping
/// (training_options::clip) each rank reports its gradients' squared sums, and the driver sends
/// every rank the one coefficient of the global norm with the order to step.
///
/// A step is all or nothing: the optimizers run only once every rank has finished its actions
/// and every gradient is finite. A rank that fails (a shape that does not fit, a bad label)
/// aborts the step on every rank; step() then throws its error and no weight has changed.
/// (One exception: a rank whose node is lost between reporting its actions done and stepping
/// its optimizer; the others have stepped, and step() says which rank was lost.) Schedules are
/// validated first (pipeline::validate), so a step cannot deadlock.
///
/// The ranks may live on other nodes of a cluster (see the constructor): the same messages then
/// cross TCP, and a rank whose node is lost fails the step (after aborting it everywhere). The
/// ranks watch the trainer's driver actor and stop when it is gone (its process killed, say).
///
/// Activation checkpointing (pipeline::with_checkpointing): a stage's forward of a microbatch
/// that the schedule recomputes keeps only its input; RECOMPUTE runs that forward again, drawing
/// the same random numbers (dropout), right before the backward. The weights come out the same,
/// to the bit, and the rank holds less between the two.
///
/// Stages may live on CUDA devices (kernels::move_to before they are given): a rank computes
/// where its stages' parameters live (they must share one device, as its one optimizer does),
/// moves what arrives there, and its optimizer steps there. Tensors between ranks go through
/// host memory (no NCCL yet).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/core/tensor.hpp"
#include "troupe/kernels/checkpoint.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/lm.hpp"
#include "troupe/kernels/optim.hpp"
#include "troupe/kernels/train.hpp"
#include "troupe/pipeline/schedule.hpp"
#include "troupe/pipeline/timeline.hpp"

namespace troupe {
class actor_system;
}

namespace troupe::pipeline {

/// How every rank trains its stages.
struct training_options {
  kernels::optimizer_kind optimizer = kernels::optimizer_kind::adamw;
  kernels::hyperparameters hp{};
  kernels::state_options state{};
  /// 0: a constant learning rate; otherwise (a finite number >= 1) it follows
  /// kernels::cosine_lr(cosine_steps).
  double cosine_steps = 0;
  /// Seconds a step may take: past them the step is aborted on every rank and step() throws
  /// (nothing is applied). A safety net for a message lost between live nodes; 0 (or 1e9 and
  /// more): no limit.
  double step_timeout = 600;
  /// Stochastic rounding's seed (kernels::optimizer_options::seed): each rank's optimizer rounds
  /// each tensor as an optimizer of the whole model with this seed would.
  std::uint64_t seed = 0;
  /// >= 0 (with cosine_steps): the lr follows kernels::warmup_cosine(hp.lr, min_lr, warmup,
  /// cosine_steps) instead, a GPT's schedule; -1: as cosine_steps says.
  std::int64_t warmup = -1;
  double min_lr = 0;
  /// Weight decay only on parameters of more than one row (kernels::decay_matrices_only), as a
  /// GPT trains; false: on every parameter.
  bool decay_matrices_only = false;
  /// > 0: clip the gradients to this global norm, the norm over every rank's gradients (summed
  /// in model order, as kernels::clip_grad_norm sums them); 0: none.
  double clip = 0;
  /// Each rank records when each of its actions ran (step_result::timeline): two clock reads
  /// an action, into a buffer allocated once. false: step_result::timeline stays empty.
  bool record_timeline = true;
  /// The directories the ranks write their checkpoint shards into and read them from
  /// (trainer::save_shards, load_shards), as the driver names them: absolute, without `.` or `..`.
  /// A rank refuses any other directory, a file not named as its own shard, and a shard that is a
  /// symbolic link, whoever asks. Empty: no shard is written or read.
  std::vector<std::string> checkpoint_dirs{};
};

/// What one step did.
struct step_result {
  double loss = 0;       ///< mean softmax cross-entropy over the batch
  bool applied = true;   ///< false: a gradient was not finite, and no weight changed
  double seconds = 0;    ///< wall time of the step
  /// Per rank: time spent in F, B, I and W, and the most activation bytes held at once.
  std::vector<double> busy_seconds;
  std::vector<std::size_t> peak_activation_bytes;
  /// Per rank, every action of trainer::plan() as it ran (see timeline.hpp); empty without
  /// training_options::record_timeline.
  step_timeline timeline;
};

/// Trains a model split into stages with a pipeline schedule, one actor per rank.
class trainer {
public:
  /// Spawns one actor per rank of `s` in `sys` (which must outlive the trainer) and gives each
  /// its stages of `stages` (stage i is the model's i-th piece; the last one's output are the
  /// logits). Throws std::invalid_argument when the stage count differs from the schedule's, a
  /// stage is null, or the optimizer options (or cosine_steps, step_timeout) are refused,
  /// and pipeline::schedule_error when the schedule cannot run.
  ///
  /// `nodes` empty: every rank lives in this process. Otherwise rank r is spawned on node
  /// nodes[r] of `sys`'s cluster (0: the node the head picks), and the stages travel there as
  /// their descriptions, parameter values and random state: they must be made of layers that
  /// kernels::make_layer rebuilds (any of troupe's; a layer defined elsewhere is an
  /// std::invalid_argument). Activations and gradients then go straight from rank to rank.
  trainer(actor_system& sys, const schedule& s, std::vector<std::unique_ptr<kernels::sequential>> stages,
          training_options options = {}, std::vector<std::uint32_t> nodes = {});
  /// Stops the rank actors.
  ~trainer();
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// One training step on the batch `x` [N, features] with class labels `labels` [N] (u8, i32 or
  /// i64), split into the schedule's microbatches. Throws std::invalid_argument when N does not
  /// divide into them, and the first error of a rank when a rank fails (nothing changed then).
  /// It blocks until the step ends: troupe::error(errc::would_deadlock) on an actor's thread.
  /// On a test_system it drives the system while it waits.
  step_result step(const tensor& x, const tensor& labels);

  /// The model's output for `x` (no training: dropout off), through every stage in order.
  tensor predict(const tensor& x);

  /// Copies of every parameter value, stage by stage in model order.
  std::vector<tensor> parameters();

  /// Between steps: each rank writes its own shard of a checkpoint, `dir`/kernels::shard_name(rank,
  /// slot), with kernels::write_shard (its stages' values and random state, its optimizer's step
  /// count and moments in their storage), on the file system of its node. Returns the shards in
  /// rank order; throws std::runtime_error naming the rank when one cannot write its shard.
  std::vector<kernels::shard_info> save_shards(const std::string& dir, const std::string& slot);
  /// Before the first step: rank r reads `dir`/shards[r].file (kernels::read_shard: its size and
  /// CRC-32 as `shards[r]` says, its stages and tensors those of the rank). Throws
  /// std::runtime_error naming the rank and the file of the first rank that cannot.
  void load_shards(const std::string& dir, const std::vector<kernels::shard_info>& shards);
  /// Which rank holds each stage, and each stage's parameter tensors.
  kernels::shard_layout layout() const;

  const schedule& plan() const noexcept;
  std::int64_t steps() const noexcept;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// What one trainer step means, run plainly on the whole model in this thread: each of the
/// `microbatches` equal microbatches of `x` in order, its mean softmax cross-entropy counted
/// 1/microbatches, the gradients summed, one step of `opt`. Returns the batch's mean loss. The
/// reference the runtime is tested against (to the bit when each stage adds its weight gradients
/// in microbatch order, as every generated schedule does).
double whole_model_step(kernels::sequential& model, kernels::optimizer& opt, const tensor& x, const tensor& labels,
                        int microbatches);

/// Cuts an MLP laid out as kernels::make_mlp makes it (`sizes`: its layer sizes; linear layers
/// with ReLU between them) into `stages` contiguous stages of whole linear layers, balanced by
/// parameter count (partition_by_parameters), holding copies of `model`'s values under the
/// model's names ("2.weight" stays "2.weight" in the stage that holds it). Throws
/// std::invalid_argument when the model has fewer linear layers than stages or does not match
/// `sizes`.
std::vector<std::unique_ptr<kernels::sequential>> cut_mlp(kernels::sequential& model,
                                                          const std::vector<std::int64_t>& sizes, int stages);

/// Cuts any sequential into `stages` contiguous stages of its top-level layers, balanced by
/// parameter count (partition_by_parameters). A layer with parameters begins a piece, and the
/// layers without parameters after it go with it (an MLP's ReLU with its linear layer, a GPT's
/// dropout with its embedding); layers without parameters before the first one go with that.
/// So a GPT's embedding, blocks, final norm and head, or an MLP's linear layers, are what stages
/// are made of. The stages hold copies of `model`'s layers (rebuilt by kernels::make_layer),
/// values, names ("3.1.weight" stays so) and random state. Throws std::invalid_argument when
/// the model has fewer pieces than stages, or a layer make_layer cannot rebuild.
std::vector<std::unique_ptr<kernels::sequential>> cut_sequential(kernels::sequential& model, int stages);

/// The top-level layers of `model` that begin a piece of cut_sequential (those with parameters).
int pieces_of(kernels::sequential& model);

/// Called by the engines below after every step, on the training thread, with the trainer's
/// plan (lowered) and what the step did (its measured timeline included). The step is applied
/// when it is called: an exception it throws is logged (once per engine) and training goes on.
using step_observer = std::function<void(const schedule& plan, const step_result& step)>;

/// An engine for kernels::train: the model cut into the schedule's stages (cut_mlp) and trained
/// by a trainer whose rank actors live in `sys` (on `nodes`, as the trainer's constructor
/// takes them); batches split into the schedule's microbatches. `observe` (when set) sees
/// every step.
kernels::engine_factory pipeline_engine(actor_system& sys, schedule s, std::vector<std::uint32_t> nodes = {},
                                        step_observer observe = {});

/// An engine for kernels::train_lm: the GPT cut into the schedule's stages (cut_sequential), each
/// rank with its AdamW over its stages (the setup's state storage, weight decay on matrices,
/// warmup + cosine), the gradients clipped by the norm over every rank; the schedule's
/// microbatches must be the setup's. The weights equal kernels::lm_in_thread's, to the bit.
/// `observe` (when set) sees every step.
kernels::lm_engine_factory lm_pipeline_engine(actor_system& sys, schedule s, std::vector<std::uint32_t> nodes = {},
                                              step_observer observe = {});

}  // namespace troupe::pipeline
