// The pipeline's rank actor and what travels between it and the driver: internal to the
// pipeline runtime (runtime.cpp), in a header so that tests can call a rank as another node would.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cmath>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "troupe/actors/remote.hpp"
#include "troupe/core/device.hpp"
#include "troupe/core/log.hpp"
#include "troupe/pipeline/partition.hpp"
#include "troupe/pipeline/runtime.hpp"
#include "troupe/pipeline/simulator.hpp"

namespace troupe::pipeline::detail {

using clock_type = std::chrono::steady_clock;

/// A tensor on its way to a stage: the activation for its forward or the gradient for its
/// backward, of one microbatch of one step.
struct transfer {
  std::uint64_t step = 0;
  bool gradient = false;
  int stage = 0;
  int microbatch = 0;
  tensor value;
};

/// What a rank gets for one step: the microbatches of the inputs when it holds the first stage,
/// of the labels when it holds the last.
struct step_plan {
  std::uint64_t step = 0;
  std::vector<tensor> inputs;
  std::vector<tensor> labels;
};

/// How a rank's part of a step ended.
enum class outcome : std::uint8_t {
  done,
  bad_input,  ///< std::invalid_argument: a shape, a label (the driver rethrows it as such)
  failed,     ///< any other error
  aborted     ///< another rank failed first
};

struct rank_report {
  double loss_sum = 0;  ///< of the microbatch means, when the rank holds the last stage
  bool finite = true;   ///< every gradient of the rank's parameters
  double busy_seconds = 0;
  std::uint64_t peak_activation_bytes = 0;
  outcome result = outcome::done;
  std::string why;  ///< when not done
  /// With clipping: each parameter's kernels::grad_square_sum, stage by stage in model order.
  std::vector<double> square_sums;
  /// With training_options::record_timeline: when the rank's part began (steady clock, ns since
  /// its epoch), and per action of its list, its start and end in ns from then.
  std::int64_t began_ns = 0;
  std::vector<std::int64_t> times;
};

/// A stage as it travels to another node: its description (what make_layer reads), its
/// parameters' names and values (as host copies) and its generators' state, and the device its
/// parameters live on (the same device number there).
struct portable_stage {
  std::string layers;
  std::vector<std::string> names;
  std::vector<tensor> values;
  std::vector<std::string> random;
  bool on_cuda = false;
  int cuda_index = 0;
};

/// Where a stage computes: where its parameters live (the host when it has none).
inline device device_of(kernels::sequential& stage) {
  const auto params = stage.parameters();
  return params.empty() ? device::cpu() : params.front()->value.where();
}

/// A copy of `t` on the host.
inline tensor host_copy(const tensor& t) { return t.where().is_cpu() ? t.clone() : t.to(device::cpu()); }

using cell_key = std::pair<int, int>;  // (stage, microbatch)
using stage_holder = std::shared_ptr<std::vector<std::unique_ptr<kernels::sequential>>>;

/// The stage rebuilt from its portable form (the same layers, values and random state).
inline std::unique_ptr<kernels::sequential> from_portable(const portable_stage& p) {
  // What was sent must fill the description before anything is built (a few bytes of
  // description may stand for a gigabyte of parameters).
  std::int64_t sent = 0;
  for (const auto& v : p.values) sent += static_cast<std::int64_t>(v.numel());
  if (const auto wanted = kernels::parameter_count(p.layers); sent != wanted)
    throw std::invalid_argument("a stage came as '" + p.layers + "' (" + std::to_string(wanted) +
                                " parameter values) with " + std::to_string(sent) + " values");
  auto built = kernels::make_layer(p.layers);
  auto* seq = dynamic_cast<kernels::sequential*>(built.get());
  if (seq == nullptr) throw std::invalid_argument("a stage came as '" + p.layers + "', which is not a sequential");
  std::unique_ptr<kernels::sequential> stage(seq);
  built.release();
  const auto params = stage->parameters();
  if (params.size() != p.values.size() || params.size() != p.names.size())
    throw std::invalid_argument("a stage came with " + std::to_string(p.values.size()) + " values and " +
                                std::to_string(p.names.size()) + " names for " + std::to_string(params.size()) +
                                " parameters");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (p.values[i].shape() != params[i]->value.shape() || p.values[i].type() != params[i]->value.type())
      throw std::invalid_argument("a stage's parameter " + std::to_string(i) + " came as " + p.values[i].str() +
                                  ", not " + params[i]->value.str());
    params[i]->value = p.values[i];
    params[i]->name = p.names[i];
  }
  std::size_t next = 0;
  stage->load_random_state(p.random, next);
  if (next != p.random.size())
    throw std::invalid_argument("a stage came with " + std::to_string(p.random.size()) + " random states for " +
                                std::to_string(next) + " generators");
  if (p.on_cuda) {
    if (p.cuda_index < 0 || p.cuda_index >= cuda_device_count())
      throw std::invalid_argument("a stage's parameters live on cuda:" + std::to_string(p.cuda_index) +
                                  ", and this node has " + std::to_string(cuda_device_count()) + " CUDA devices");
    kernels::move_to(*stage, device::cuda(p.cuda_index));
  }
  return stage;
}

/// The stage as it travels. Throws std::invalid_argument for a layer that make_layer cannot
/// rebuild (one defined outside troupe's kernels).
inline portable_stage to_portable(kernels::sequential& stage, int index) {
  const device where = device_of(stage);
  portable_stage out{stage.describe(), {}, {}, {}, !where.is_cpu(), where.index};
  for (auto* p : stage.parameters()) {
    out.names.push_back(p->name);
    out.values.push_back(p->value.to(device::cpu()));
  }
  stage.save_random_state(out.random);
  try {
    auto here = out;
    here.on_cuda = false;  // (the device is the other node's to check)
    (void)from_portable(here);  // it must come back as it went
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("stage " + std::to_string(index) + " cannot go to another node: " + e.what());
  }
  return out;
}

/// `dir` as a checkpoint directory a rank may hold shards in: absolute and without `.` or `..`
/// (its lexically normal form, without a trailing `/`); std::invalid_argument otherwise.
inline std::string checkpoint_dir(const std::string& dir) {
  const std::filesystem::path p(dir);
  if (dir.empty() || !p.is_absolute())
    throw std::invalid_argument("a checkpoint directory must be an absolute path, not '" + dir + "'");
  for (const auto& part : p)
    if (part == "." || part == "..")
      throw std::invalid_argument("a checkpoint directory must not hold '.' or '..', not '" + dir + "'");
  std::string out = p.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

/// Throws std::invalid_argument for options that no rank could follow (the optimizer's own are
/// checked where it is made).
inline void check_options(const training_options& o) {
  if (!(o.step_timeout >= 0) || !std::isfinite(o.step_timeout))
    throw std::invalid_argument("step_timeout must be a number of seconds >= 0 (0: no limit)");
  if (o.cosine_steps != 0 && (!(o.cosine_steps >= 1) || !std::isfinite(o.cosine_steps)))
    throw std::invalid_argument("cosine_steps must be 0 (a constant learning rate) or a number of steps >= 1, not " +
                                std::to_string(o.cosine_steps));
  if (o.warmup < -1 || (o.warmup >= 0 && (o.cosine_steps < 1 || o.cosine_steps > 9e15)))
    throw std::invalid_argument("warmup must be -1 (none) or a number of steps >= 0 with cosine_steps, not " +
                                std::to_string(o.warmup));
  if (!(o.min_lr >= 0) || !std::isfinite(o.min_lr)) throw std::invalid_argument("min_lr must be a number >= 0");
  if (!(o.clip >= 0) || !std::isfinite(o.clip)) throw std::invalid_argument("clip must be a number >= 0 (0: none)");
  for (const auto& dir : o.checkpoint_dirs) checkpoint_dir(dir);
}

/// Lives with the trainer, in the driver's process: the ranks watch it, and a rank whose driver
/// is gone (its process killed, its node lost) stops, instead of staying on its node for good.
struct driver_actor {
  /// Nothing to do: a rank needs only to know that the driver is there.
  void here() {}
};

/// One rank: its stages, its optimizer, and the state of the step in flight.
class rank_actor {
public:
  /// In this process: `holder` holds the rank's stages in model order; the actor takes them
  /// (spawn keeps its arguments copyable for restarts, so they travel in a holder emptied here).
  /// `first_params[i]`: the place in the whole model of the i-th stage's first parameter.
  rank_actor(int rank, std::shared_ptr<const schedule> plan, stage_holder holder, training_options options,
             std::vector<std::uint64_t> first_params)
      : rank_(rank), plan_(std::move(plan)) {
    auto stages = std::move(*holder);
    check_place(stages.size());
    setup(std::move(stages), options, first_params);
  }

  /// On another node: the schedule as its name and CSV, the stages as they travel.
  /// Everything here came over the network: the schedule is checked as the driver checks it,
  /// and the rank, the stage count and the options before any stage is built.
  rank_actor(int rank, std::string name, std::string csv, std::vector<portable_stage> stages, training_options options,
             std::vector<std::uint64_t> first_params)
      : rank_(rank), plan_(read_plan(csv, std::move(name))) {
    check_place(stages.size());
    check_options(options);
    std::vector<std::unique_ptr<kernels::sequential>> built;
    for (const auto& p : stages) built.push_back(from_portable(p));
    setup(std::move(built), options, first_params);
  }

  /// The other ranks, and the driver to watch.
  void connect(std::vector<actor_ref<rank_actor>> ranks, actor_ref<driver_actor> driver) {
    ranks_ = std::move(ranks);
    this_actor::monitor(driver);
  }

  /// The driver is gone (the only actor a rank watches): no step will come, so stop.
  void on_down(const down_notice&) { this_actor::stop(); }

  /// Runs the rank's actions for one step; the gradients wait for apply(). Never throws: how
  /// it ended is in the report (so that it crosses nodes intact).
  task<rank_report> run(step_plan plan) {
    rank_report report;
    if (running_ || plan.step <= step_) {
      // A second run while one waits, or one older than the last: not a step to take part in.
      report.result = outcome::aborted;
      report.why = "rank " + std::to_string(rank_) + " is already past step " + std::to_string(plan.step);
      co_return report;
    }
    const auto began = clock_type::now();
    times_.clear();  // (its capacity stays: setup() reserved every action's place)
    try {
      begin(plan.step);
      check_plan(plan);
      optimizer_->zero_grad();
      for (const auto& a : plan_->ranks[static_cast<std::size_t>(rank_)]) {
        if (!a) continue;
        const auto action_start = record_ ? clock_type::now() : began;
        const cell_key at{a->stage, a->microbatch};
        switch (a->kind) {
          case op::recv_f: inputs_[at] = co_await receive(false, at); break;
          case op::recv_b: grads_[at] = co_await receive(true, at); break;
          case op::send_f: send(false, a->stage + 1, a->microbatch, take(outputs_, at, "SEND_F")); break;
          case op::send_b: send(true, a->stage - 1, a->microbatch, take(input_grads_, at, "SEND_B")); break;
          default: {
            const auto t0 = clock_type::now();
            compute(*a, plan, report);
            report.busy_seconds += std::chrono::duration<double>(clock_type::now() - t0).count();
            report.peak_activation_bytes = std::max(report.peak_activation_bytes, held_bytes());
          }
        }
        if (record_) {
          times_.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(action_start - began).count());
          times_.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - began).count());
        }
      }
      if (!keeps_.empty() || !checkpoints_.empty() || !inputs_.empty() || !grads_.empty() || !outputs_.empty() ||
          !input_grads_.empty())
        throw std::logic_error("rank " + std::to_string(rank_) + " ended its step with tensors left over");
      report.finite = optimizer_->gradients_finite();
      if (clip_ > 0)
        for (const auto& [index, stage] : stages_)
          for (auto* p : stage->parameters())
            report.square_sums.push_back(kernels::grad_square_sum(p->grad.where().is_cpu() ? p->grad : host_copy(p->grad)));
      done_step_ = plan.step;
      if (record_) {
        report.began_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(began.time_since_epoch()).count();
        report.times = times_;
      }
    } catch (const aborted& e) {
      report.result = outcome::aborted;
      report.why = e.what();
    } catch (const std::invalid_argument& e) {
      report.result = outcome::bad_input;
      report.why = e.what();
    } catch (const std::exception& e) {
      report.result = outcome::failed;
      report.why = e.what();
    }
    if (report.result != outcome::done && report.result != outcome::aborted) fail_step(report.why);
    end_step();
    co_return report;
  }

  /// A tensor for one of this rank's stages, from the neighbour rank.
  void deliver(transfer t) {
    if (t.step < step_) return;  // of a step that was aborted; its successor has begun
    if (!stages_.contains(t.stage) || t.microbatch < 0 || t.microbatch >= plan_->microbatches) {
      troupe::log().warn("pipeline rank {}: dropped {} for stage {}, microbatch {}, which is not one of its cells", rank_,
                         t.gradient ? "a gradient" : "an activation", t.stage, t.microbatch);
      return;
    }
    const cell_key at{t.stage, t.microbatch};
    if (t.step == step_ && running_) {
      auto& waiting = t.gradient ? waiting_grads_ : waiting_inputs_;
      if (auto it = waiting.find(at); it != waiting.end()) {
        auto p = std::move(it->second);
        waiting.erase(it);
        p.set_value(std::move(t.value));
        return;
      }
    }
    arrived_[{t.step, t.gradient, t.stage, t.microbatch}] = std::move(t.value);
  }

  /// Step `step` failed elsewhere: stop this rank's part of it too.
  void abort(std::uint64_t step, std::string why) {
    if (step < step_ || (step == step_ && !running_)) return;  // over already
    aborted_step_ = step;
    aborted_why_ = std::move(why);
    if (step == step_) fail_waiting();
  }

  /// After step `step`, which every rank finished: step the optimizer, once, and only for the
  /// step this rank finished last (anything else would apply a partial or an old gradient).
  /// `keep` false: drop the step's gradients; a step that is running or is not this rank's last
  /// has none here to drop (a rank asked to run while it still ran the one before).
  /// `scale`: what clipping multiplies the gradients by first (1: nothing).
  void apply(std::uint64_t step, bool keep, double scale) {
    if (!keep) {
      if (!running_ && step == step_) {
        optimizer_->zero_grad();
        done_step_.reset();
      }
      return;
    }
    if (running_ || step != step_)
      throw std::invalid_argument("rank " + std::to_string(rank_) + " cannot apply step " + std::to_string(step) +
                                  (running_ ? ": step " + std::to_string(step_) + " is running"
                                            : ": its last step is " + std::to_string(step_)));
    if (done_step_ != step)
      throw std::invalid_argument("rank " + std::to_string(rank_) + " has no gradient of step " + std::to_string(step) +
                                  " to apply (it did not finish the step, or applied it already)");
    if (!(scale > 0 && scale <= 1)) throw std::invalid_argument("a gradient scale must be in (0, 1], not " + std::to_string(scale));
    if (scale != 1)
      for (const auto& [index, stage] : stages_)
        for (auto* p : stage->parameters()) {
          if (p->grad.where().is_cpu()) {
            kernels::scale_gradient(p->grad, scale);
          } else {
            tensor g = host_copy(p->grad);
            kernels::scale_gradient(g, scale);
            p->grad = g.to(p->grad.where());
          }
        }
    optimizer_->step();
    optimizer_->zero_grad();
    done_step_.reset();
  }

  tensor infer(int stage, tensor x) {
    kernels::saved_activations keep;
    return stage_at(stage).forward(x.to(where_), keep, false);
  }

  /// Writes this rank's shard of a checkpoint (between steps: the driver asks no step meanwhile).
  /// The path may come from another node: only a file named as this rank's shard is written.
  kernels::shard_info save_shard(std::string path) {
    check_shard_path(path);
    if (running_) throw std::logic_error("rank " + std::to_string(rank_) + " cannot save its shard during a step");
    return kernels::write_shard(path, shard_stages(), *optimizer_);
  }

  /// Reads this rank's shard of a checkpoint (before its first step).
  void load_shard(std::string path, kernels::shard_info expected) {
    check_shard_path(path);
    if (running_) throw std::logic_error("rank " + std::to_string(rank_) + " cannot load a shard during a step");
    kernels::read_shard(path, expected, shard_stages(), *optimizer_);
  }

  /// Host copies.
  std::vector<tensor> parameter_values(int stage) {
    std::vector<tensor> out;
    for (auto* p : stage_at(stage).parameters()) out.push_back(host_copy(p->value));
    return out;
  }

private:
  /// The path may come from any peer that holds the cluster's token: only this rank's shard, in
  /// a checkpoint directory the driver named when it made the rank (training_options::
  /// checkpoint_dirs), and never through a symbolic link (write_file_atomically would follow one;
  /// read_shard reads the file the link names).
  void check_shard_path(const std::string& path) const {
    const std::filesystem::path p(path);
    const auto name = p.filename().string();
    if (name != kernels::shard_name(rank_, "a") && name != kernels::shard_name(rank_, "b"))
      throw std::invalid_argument("rank " + std::to_string(rank_) + " writes and reads only its own shard (" +
                                  kernels::shard_name(rank_, "a") + " or " + kernels::shard_name(rank_, "b") + "), not " + path);
    std::string dir;
    try {
      dir = checkpoint_dir(p.parent_path().string());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("rank " + std::to_string(rank_) + " refuses the shard " + path + ": " + e.what());
    }
    if (std::find(checkpoint_dirs_.begin(), checkpoint_dirs_.end(), dir) == checkpoint_dirs_.end())
      throw std::invalid_argument("rank " + std::to_string(rank_) + " writes and reads shards only in the checkpoint " +
                                  "directories the trainer was given, not in " + dir);
    std::error_code ec;
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(p, ec)))
      throw std::invalid_argument("rank " + std::to_string(rank_) + " refuses the shard " + path +
                                  ": it is a symbolic link");
  }

  std::vector<kernels::shard_stage> shard_stages() {
    std::vector<kernels::shard_stage> out;
    for (const auto& [index, stage] : stages_) out.push_back({index, stage.get()});  // in model order
    return out;
  }

  /// Why a rank stopped its part of a step that another rank failed.
  class aborted : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
  };

  /// After check_place: the stages are as many as the schedule gives this rank.
  void setup(std::vector<std::unique_ptr<kernels::sequential>> stages, const training_options& options,
             const std::vector<std::uint64_t>& first_params) {
    const auto mine = plan_->place.stages_of(rank_);
    if (first_params.size() != mine.size())
      throw std::invalid_argument("rank " + std::to_string(rank_) + " got " + std::to_string(first_params.size()) +
                                  " parameter offsets for its " + std::to_string(mine.size()) + " stages");
    for (const auto& a : plan_->ranks.at(static_cast<std::size_t>(rank_)))
      if (a && a->kind == op::recompute) recomputed_.insert({a->stage, a->microbatch});
    record_ = options.record_timeline;
    for (const auto& dir : options.checkpoint_dirs) checkpoint_dirs_.push_back(checkpoint_dir(dir));
    if (record_) times_.reserve(2 * plan_->ranks.at(static_cast<std::size_t>(rank_)).size());
    std::vector<kernels::parameter*> params;
    std::vector<std::uint64_t> keys;  // each tensor's place in the whole model
    for (std::size_t i = 0; i < mine.size(); ++i) {
      stages_.emplace(mine[i], std::move(stages[i]));
      std::uint64_t j = 0;
      for (auto* p : stages_.at(mine[i])->parameters()) {
        keys.push_back(first_params[i] + j++);
        params.push_back(p);
      }
    }
    // Of the parameters kept in fp32, those of this rank's stages (the trainer checked that each
    // is some rank's).
    auto state = options.state;
    std::erase_if(state.fp32_params, [&](const std::string& name) {
      return std::none_of(params.begin(), params.end(), [&](const auto* p) { return p->name == name; });
    });
    // One optimizer thread: the ranks are the parallelism (results do not depend on threads).
    std::vector<kernels::param_group> groups{{params, options.hp, state}};
    if (options.decay_matrices_only) {
      std::vector<std::uint64_t> ordered;
      groups = kernels::decay_matrices_only(params, keys, options.hp, state, ordered);
      keys = std::move(ordered);
    }
    optimizer_.emplace(options.optimizer, std::move(groups),
                       kernels::optimizer_options{.threads = 1, .seed = options.seed, .tensor_keys = std::move(keys)});
    where_ = params.empty() ? device::cpu() : optimizer_->where();
    if (options.warmup >= 0)
      optimizer_->set_lr_schedule(kernels::warmup_cosine(options.hp.lr, options.min_lr, options.warmup,
                                                         static_cast<std::int64_t>(options.cosine_steps)));
    else if (options.cosine_steps != 0)
      optimizer_->set_lr_schedule(kernels::cosine_lr(options.cosine_steps));
    clip_ = options.clip;
  }

  static std::shared_ptr<const schedule> read_plan(const std::string& csv, std::string name) {
    auto plan = std::make_shared<schedule>(lower(from_csv(csv, std::move(name))));
    validate(*plan);
    return plan;
  }

  /// This rank is one of the schedule's, and `stages` is how many the schedule gives it.
  void check_place(std::size_t stages) const {
    if (rank_ < 0 || rank_ >= plan_->place.ranks)
      throw std::invalid_argument("rank " + std::to_string(rank_) + " is not one of the schedule's " +
                                  std::to_string(plan_->place.ranks) + " ranks");
    if (const auto mine = plan_->place.stages_of(rank_); stages != mine.size())
      throw std::invalid_argument("rank " + std::to_string(rank_) + " got " + std::to_string(stages) +
                                  " stages; the schedule '" + plan_->name + "' gives it " + std::to_string(mine.size()));
  }

  /// A step's inputs go to the rank of the first stage and its labels to that of the last, one
  /// tensor per microbatch, all of as many rows.
  void check_plan(const step_plan& p) const {
    const auto check = [&](const std::vector<tensor>& given, bool wanted, const char* what) {
      if (!wanted && given.empty()) return;
      if (!wanted)
        throw std::invalid_argument("rank " + std::to_string(rank_) + " holds no stage that takes the " + what);
      if (given.size() != static_cast<std::size_t>(plan_->microbatches))
        throw std::invalid_argument("rank " + std::to_string(rank_) + " got " + std::to_string(given.size()) +
                                    " microbatches of " + what + " for a schedule of " +
                                    std::to_string(plan_->microbatches));
      for (const auto& t : given)
        if (t.rank() < 1 || t.dim(0) != given.front().dim(0))
          throw std::invalid_argument(std::string("the microbatches of ") + what + " must have as many rows each, not " +
                                      given.front().str() + " and " + t.str());
    };
    check(p.inputs, stages_.contains(0), "inputs");
    check(p.labels, stages_.contains(plan_->stages() - 1), "labels");
  }

  kernels::sequential& stage_at(int stage) {
    auto it = stages_.find(stage);
    if (it == stages_.end()) throw std::invalid_argument("rank " + std::to_string(rank_) + " holds no stage " + std::to_string(stage));
    return *it->second;
  }

  void begin(std::uint64_t step) {
    step_ = step;
    keeps_.clear();
    checkpoints_.clear();
    inputs_.clear();
    grads_.clear();
    outputs_.clear();
    input_grads_.clear();
    weight_grads_.clear();
    // Tensors of earlier (aborted) steps are of no use now; those of this step stay.
    std::erase_if(arrived_, [step](const auto& kv) { return std::get<0>(kv.first) < step; });
    if (aborted_step_ == step) throw aborted(aborted_why_);
    running_ = true;
  }

  void end_step() {
    running_ = false;
    keeps_.clear();
    checkpoints_.clear();
  }

  /// Activation bytes held between forwards and backwards: what the layers keep, and the
  /// inputs that checkpointed forwards keep instead.
  std::uint64_t held_bytes() const {
    std::uint64_t held = 0;
    for (const auto& [key, keep] : keeps_) held += keep.bytes();
    for (const auto& [key, c] : checkpoints_) held += c.input.nbytes();
    return held;
  }

  void fail_step(const std::string& why) {
    // The other ranks may wait for what this one will never send: stop them.
    aborted_step_ = step_;
    aborted_why_ = "rank " + std::to_string(rank_) + " failed: " + why;
    for (std::size_t r = 0; r < ranks_.size(); ++r)
      if (static_cast<int>(r) != rank_) ranks_[r].tell(&rank_actor::abort, step_, aborted_why_);
    fail_waiting();
  }

  void fail_waiting() {
    for (auto* waiting : {&waiting_inputs_, &waiting_grads_}) {
      for (auto& [key, p] : *waiting) p.set_exception(std::make_exception_ptr(aborted(aborted_why_)));
      waiting->clear();
    }
  }

  future<tensor> receive(bool gradient, cell_key at) {
    if (aborted_step_ == step_) throw aborted(aborted_why_);
    promise<tensor> p;
    auto f = p.get_future();
    const auto key = std::make_tuple(step_, gradient, at.first, at.second);
    if (auto it = arrived_.find(key); it != arrived_.end()) {
      p.set_value(std::move(it->second));
      arrived_.erase(it);
    } else {
      (gradient ? waiting_grads_ : waiting_inputs_).emplace(at, std::move(p));
    }
    return f;
  }

  void send(bool gradient, int to_stage, int microbatch, tensor value) {
    ranks_.at(static_cast<std::size_t>(plan_->place.rank_of(to_stage)))
        .tell(&rank_actor::deliver, transfer{step_, gradient, to_stage, microbatch, std::move(value)});
  }

  template <class Map>
  static typename Map::mapped_type take(Map& m, cell_key at, const char* what) {
    auto it = m.find(at);
    if (it == m.end())
      throw std::logic_error(std::string(what) + " of stage " + std::to_string(at.first) + ", microbatch " +
                             std::to_string(at.second) + " has nothing to work on");
    auto t = std::move(it->second);
    m.erase(it);
    return t;
  }

  /// F, B, I or W of one (stage, microbatch).
  void compute(const action& a, const step_plan& plan, rank_report& report) {
    const cell_key at{a.stage, a.microbatch};
    auto& layers = stage_at(a.stage);
    const int last = plan_->stages() - 1;
    switch (a.kind) {
      case op::F: {
        const tensor x =
            (a.stage == 0 ? plan.inputs.at(static_cast<std::size_t>(a.microbatch)) : take(inputs_, at, "F")).to(where_);
        tensor y;
        if (recomputed_.count(at)) {
          // Activation checkpointing: keep only the input (and where the random draws stood);
          // RECOMPUTE runs the forward again before the backward.
          checkpoint c{x, {}};
          layers.save_random_state(c.random);
          kernels::saved_activations dropped;
          y = layers.forward(x, dropped, true);
          checkpoints_.emplace(at, std::move(c));
        } else {
          y = layers.forward(x, keeps_[at], true);
        }
        if (a.stage == last) {
          // The loss is the batch mean: each microbatch's mean counts 1/microbatches.
          const tensor logits = y.to(device::cpu());
          tensor dlogits;
          const double loss = kernels::softmax_cross_entropy(
              logits, plan.labels.at(static_cast<std::size_t>(a.microbatch)), dlogits);
          const float scale = 1.0f / static_cast<float>(plan_->microbatches);
          for (float& g : dlogits.data<float>()) g *= scale;
          report.loss_sum += loss;
          grads_[at] = dlogits.to(y.where());
        } else if (plan_->place.rank_of(a.stage + 1) == rank_) {
          inputs_[{a.stage + 1, a.microbatch}] = std::move(y);
        } else {
          outputs_[at] = std::move(y);
        }
        break;
      }
      case op::B:
      case op::I: {
        tensor dy = take(grads_, at, a.kind == op::B ? "B" : "I").to(where_);
        auto keep = keeps_.find(at);
        if (keep == keeps_.end()) throw std::logic_error("backward before forward");
        tensor dx;
        if (a.kind == op::B) {
          dx = layers.backward(dy, keep->second);
          keeps_.erase(keep);
        } else {
          dx = layers.backward_input(dy, keep->second);
          weight_grads_[at] = std::move(dy);
        }
        if (a.stage == 0) break;  // nothing before the first stage
        if (plan_->place.rank_of(a.stage - 1) == rank_)
          grads_[{a.stage - 1, a.microbatch}] = std::move(dx);
        else
          input_grads_[at] = std::move(dx);
        break;
      }
      case op::recompute: {
        // The same forward again, drawing what it drew (dropout), now keeping what the backward
        // needs; the output is the one F sent on already.
        checkpoint c = take(checkpoints_, at, "RECOMPUTE");
        std::vector<std::string> now;
        layers.save_random_state(now);
        auto restore = [&layers](const std::vector<std::string>& state) {
          std::size_t next = 0;
          layers.load_random_state(state, next);
        };
        restore(c.random);
        try {
          layers.forward(c.input, keeps_[at], true);
        } catch (...) {
          restore(now);
          throw;
        }
        restore(now);
        break;
      }
      case op::W: {
        tensor dy = take(weight_grads_, at, "W");
        auto keep = keeps_.find(at);
        if (keep == keeps_.end()) throw std::logic_error("W before I");
        layers.backward_weight(dy, keep->second);
        keeps_.erase(keep);
        break;
      }
      default: break;
    }
  }

  int rank_;
  bool record_ = false;               // training_options::record_timeline
  std::vector<std::string> checkpoint_dirs_;  // training_options::checkpoint_dirs, as checkpoint_dir gives them
  std::vector<std::int64_t> times_;   // the step's action times as they are recorded
  double clip_ = 0;  // > 0: report the gradients' square sums for the global norm
  device where_;  // where the rank's stages compute (they share one device)
  std::shared_ptr<const schedule> plan_;
  std::map<int, std::unique_ptr<kernels::sequential>> stages_;
  std::optional<kernels::optimizer> optimizer_;
  std::vector<actor_ref<rank_actor>> ranks_;

  std::uint64_t step_ = 0;
  bool running_ = false;
  std::optional<std::uint64_t> done_step_;  // finished and not yet applied
  std::optional<std::uint64_t> aborted_step_;
  std::string aborted_why_;
  /// What a checkpointed forward keeps for its RECOMPUTE.
  struct checkpoint {
    tensor input;
    std::vector<std::string> random;  // the stage's random state before the forward
  };
  std::set<cell_key> recomputed_;  // this rank's cells whose forward is recomputed
  std::map<cell_key, kernels::saved_activations> keeps_;  // F (or RECOMPUTE) until B or W
  std::map<cell_key, checkpoint> checkpoints_;            // checkpointed F until RECOMPUTE
  std::map<cell_key, tensor> inputs_;                     // a stage's input, before its F
  std::map<cell_key, tensor> grads_;                      // a stage's output gradient, before B or I
  std::map<cell_key, tensor> outputs_;                    // F's output, before SEND_F
  std::map<cell_key, tensor> input_grads_;                // B's or I's input gradient, before SEND_B
  std::map<cell_key, tensor> weight_grads_;               // I's output gradient, kept for W
  std::map<std::tuple<std::uint64_t, bool, int, int>, tensor> arrived_;  // before their RECV
  std::map<cell_key, promise<tensor>> waiting_inputs_, waiting_grads_;   // RECVs waiting
};

}  // namespace troupe::pipeline::detail

// ---- how the rank's messages cross nodes ---------------------------------------------------

namespace troupe {

namespace pipeline::detail {

// The fields of each message type, in wire order: one list serves encoding and decoding.
template <class T>
auto fields(T& t) requires std::same_as<std::remove_const_t<T>, transfer> {
  return std::tie(t.step, t.gradient, t.stage, t.microbatch, t.value);
}
template <class T>
auto fields(T& p) requires std::same_as<std::remove_const_t<T>, portable_stage> {
  return std::tie(p.layers, p.names, p.values, p.random, p.on_cuda, p.cuda_index);
}
template <class T>
auto fields(T& p) requires std::same_as<std::remove_const_t<T>, step_plan> {
  return std::tie(p.step, p.inputs, p.labels);
}
template <class T>
auto fields(T& p) requires std::same_as<std::remove_const_t<T>, rank_report> {
  return std::tie(p.loss_sum, p.finite, p.busy_seconds, p.peak_activation_bytes, p.result, p.why, p.square_sums,
                  p.began_ns, p.times);
}
template <class T>
auto fields(T& s) requires std::same_as<std::remove_const_t<T>, kernels::shard_info> {
  return std::tie(s.file, s.crc, s.bytes);
}
template <class T>
auto fields(T& o) requires std::same_as<std::remove_const_t<T>, training_options> {
  auto& h = o.hp;
  auto& s = o.state;
  return std::tie(o.optimizer, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.momentum, h.dampening, h.nesterov,
                  h.amsgrad, s.storage, s.block_size, s.min_8bit_elements, s.first_moment_fp32, s.stochastic_rounding,
                  s.percentile_scale, s.percentile_clipping, s.fp32_params, o.cosine_steps, o.step_timeout, o.seed,
                  o.warmup, o.min_lr, o.decay_matrices_only, o.clip, o.record_timeline, o.checkpoint_dirs);
}

/// Encodes and decodes T field by field, in the order fields() lists them.
template <class T>
struct field_codec {
  static void encode(byte_writer& w, const T& t) {
    std::apply([&w](const auto&... f) { (codec<std::decay_t<decltype(f)>>::encode(w, f), ...); }, fields(t));
  }
  static T decode(byte_reader& r) {
    T t;
    std::apply([&r](auto&... f) { ((f = codec<std::decay_t<decltype(f)>>::decode(r)), ...); }, fields(t));
    return t;
  }
};

}  // namespace pipeline::detail

template <>
struct codec<pipeline::detail::transfer> : pipeline::detail::field_codec<pipeline::detail::transfer> {};
template <>
struct codec<pipeline::detail::portable_stage> : pipeline::detail::field_codec<pipeline::detail::portable_stage> {};
template <>
struct codec<pipeline::detail::step_plan> : pipeline::detail::field_codec<pipeline::detail::step_plan> {};
template <>
struct codec<kernels::shard_info> : pipeline::detail::field_codec<kernels::shard_info> {};
template <>
struct codec<pipeline::training_options> : pipeline::detail::field_codec<pipeline::training_options> {};
template <>
struct enum_bounds<pipeline::detail::outcome> {
  static constexpr auto last = pipeline::detail::outcome::aborted;
};
template <>
struct codec<pipeline::detail::rank_report> : pipeline::detail::field_codec<pipeline::detail::rank_report> {};

}  // namespace troupe

TROUPE_REMOTE(troupe::pipeline::detail::rank_actor, connect, run, deliver, abort, apply, infer, parameter_values, save_shard,
              load_shard)
TROUPE_REMOTE(troupe::pipeline::detail::driver_actor, here)
