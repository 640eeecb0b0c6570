#include "troupe/pipeline/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "troupe/actors/remote.hpp"
#include "troupe/core/device.hpp"
#include "troupe/pipeline/partition.hpp"
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
device device_of(kernels::sequential& stage) {
  const auto params = stage.parameters();
  return params.empty() ? device::cpu() : params.front()->value.where();
}

/// A copy of `t` on the host.
tensor host_copy(const tensor& t) { return t.where().is_cpu() ? t.clone() : t.to(device::cpu()); }

using cell_key = std::pair<int, int>;  // (stage, microbatch)
using stage_holder = std::shared_ptr<std::vector<std::unique_ptr<kernels::sequential>>>;

/// The stage rebuilt from its portable form (the same layers, values and random state).
std::unique_ptr<kernels::sequential> from_portable(const portable_stage& p) {
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
portable_stage to_portable(kernels::sequential& stage, int index) {
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
  rank_actor(int rank, std::shared_ptr<const schedule> plan, stage_holder holder, training_options options)
      : rank_(rank), plan_(std::move(plan)) {
    auto stages = std::move(*holder);
    setup(std::move(stages), options);
  }

  /// On another node: the schedule as its name and CSV, the stages as they travel.
  rank_actor(int rank, std::string name, std::string csv, std::vector<portable_stage> stages, training_options options)
      : rank_(rank), plan_(std::make_shared<const schedule>(lower(from_csv(csv, std::move(name))))) {
    std::vector<std::unique_ptr<kernels::sequential>> built;
    for (const auto& p : stages) built.push_back(from_portable(p));
    setup(std::move(built), options);
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
    try {
      begin(plan.step);
      optimizer_->zero_grad();
      for (const auto& a : plan_->ranks[static_cast<std::size_t>(rank_)]) {
        if (!a) continue;
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
      }
      if (!keeps_.empty() || !checkpoints_.empty() || !inputs_.empty() || !grads_.empty() || !outputs_.empty() ||
          !input_grads_.empty())
        throw std::logic_error("rank " + std::to_string(rank_) + " ended its step with tensors left over");
      report.finite = optimizer_->gradients_finite();
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

  /// After a step every rank finished: step the optimizer, or (`keep` false) drop the gradients.
  void apply(bool keep) {
    if (keep) optimizer_->step();
    optimizer_->zero_grad();
  }

  tensor infer(int stage, tensor x) {
    kernels::saved_activations keep;
    return stage_at(stage).forward(x.to(where_), keep, false);
  }

  /// Host copies.
  std::vector<tensor> parameter_values(int stage) {
    std::vector<tensor> out;
    for (auto* p : stage_at(stage).parameters()) out.push_back(host_copy(p->value));
    return out;
  }

private:
  /// Why a rank stopped its part of a step that another rank failed.
  class aborted : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
  };

  void setup(std::vector<std::unique_ptr<kernels::sequential>> stages, const training_options& options) {
    const auto mine = plan_->place.stages_of(rank_);
    if (stages.size() != mine.size()) throw std::logic_error("a rank got the wrong number of stages");
    for (const auto& a : plan_->ranks.at(static_cast<std::size_t>(rank_)))
      if (a && a->kind == op::recompute) recomputed_.insert({a->stage, a->microbatch});
    std::vector<kernels::parameter*> params;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      stages_.emplace(mine[i], std::move(stages[i]));
      for (auto* p : stages_.at(mine[i])->parameters()) params.push_back(p);
    }
    // Of the parameters kept in fp32, those of this rank's stages (the trainer checked that each
    // is some rank's).
    auto state = options.state;
    std::erase_if(state.fp32_params, [&](const std::string& name) {
      return std::none_of(params.begin(), params.end(), [&](const auto* p) { return p->name == name; });
    });
    // One optimizer thread: the ranks are the parallelism (results do not depend on threads).
    optimizer_.emplace(options.optimizer, std::vector<kernels::param_group>{{params, options.hp, state}},
                       kernels::optimizer_options{.threads = 1});
    where_ = params.empty() ? device::cpu() : optimizer_->where();
    if (options.cosine_steps > 0) optimizer_->set_lr_schedule(kernels::cosine_lr(options.cosine_steps));
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
  device where_;  // where the rank's stages compute (they share one device)
  std::shared_ptr<const schedule> plan_;
  std::map<int, std::unique_ptr<kernels::sequential>> stages_;
  std::optional<kernels::optimizer> optimizer_;
  std::vector<actor_ref<rank_actor>> ranks_;

  std::uint64_t step_ = 0;
  bool running_ = false;
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
  return std::tie(p.loss_sum, p.finite, p.busy_seconds, p.peak_activation_bytes, p.result, p.why);
}
template <class T>
auto fields(T& o) requires std::same_as<std::remove_const_t<T>, training_options> {
  auto& h = o.hp;
  auto& s = o.state;
  return std::tie(o.optimizer, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.momentum, h.dampening, h.nesterov,
                  h.amsgrad, s.storage, s.block_size, s.min_8bit_elements, s.first_moment_fp32, s.stochastic_rounding,
                  s.percentile_scale, s.percentile_clipping, s.fp32_params, o.cosine_steps, o.step_timeout);
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
struct codec<pipeline::training_options> : pipeline::detail::field_codec<pipeline::training_options> {};
template <>
struct enum_bounds<pipeline::detail::outcome> {
  static constexpr auto last = pipeline::detail::outcome::aborted;
};
template <>
struct codec<pipeline::detail::rank_report> : pipeline::detail::field_codec<pipeline::detail::rank_report> {};

}  // namespace troupe

TROUPE_REMOTE(troupe::pipeline::detail::rank_actor, connect, run, deliver, abort, apply, infer, parameter_values)
TROUPE_REMOTE(troupe::pipeline::detail::driver_actor, here)

namespace troupe::pipeline {

using detail::clock_type;
using detail::outcome;
using detail::rank_actor;
using detail::rank_report;

struct trainer::impl {
  actor_system* sys = nullptr;
  double step_timeout = 0;
  std::shared_ptr<const schedule> plan;
  std::vector<actor_ref<rank_actor>> ranks;
  actor_ref<detail::driver_actor> driver;  // the ranks watch it
  std::uint64_t steps = 0;

  /// What the monitors of ranks on other nodes share with the driver: a rank whose node is lost
  /// may already have reported its part of the step while a neighbour still waits for its last
  /// tensor; its monitor aborts the step in flight on every rank and says why.
  struct watch_state {
    std::mutex mu;
    std::uint64_t step = 0;  // in flight
    std::string lost;        // the first rank lost, and how
  };
  std::shared_ptr<watch_state> watch = std::make_shared<watch_state>();

  void watch_remote_ranks() {
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (!ranks[r].is_remote()) continue;
      sys->monitor(ranks[r]).then(
          [w = watch, all = ranks, r](const down_notice& n) {
            std::uint64_t step;
            std::string why;
            {
              std::lock_guard lock(w->mu);
              if (w->lost.empty()) w->lost = "rank " + std::to_string(r) + " is gone: " + n.what;
              step = w->step;
              why = w->lost;
            }
            for (const auto& other : all) other.tell(&rank_actor::abort, step, why);
          },
          [](std::exception_ptr) {});
    }
  }

  /// The rank actors go with the trainer, and the driver actor they watch. This stops each and
  /// waits (a little) until it is gone: a process that exits next must not drop the stops (its
  /// ranks on other nodes would stop only once their nodes lost this one).
  void stop_ranks() noexcept {
    std::vector<future<down_notice>> gone;
    auto stop = [&](const auto& actor) {
      try {
        gone.push_back(sys->monitor(actor));
        actor.stop();
      } catch (const std::exception&) {  // its node is gone already
      }
    };
    for (auto& r : ranks) stop(r);
    if (driver) stop(driver);
    for (auto& g : gone) {
      try {
        std::move(g).timeout(std::chrono::seconds(2)).get();
      } catch (const std::exception&) {  // lost, or too slow to say
      }
    }
  }
};

trainer::trainer(actor_system& sys, const schedule& s, std::vector<std::unique_ptr<kernels::sequential>> stages,
                 training_options options, std::vector<std::uint32_t> nodes)
    : impl_(std::make_unique<impl>()) {
  if (static_cast<int>(stages.size()) != s.stages())
    throw std::invalid_argument("the schedule '" + s.name + "' has " + std::to_string(s.stages()) + " stages; " +
                                std::to_string(stages.size()) + " were given");
  for (std::size_t i = 0; i < stages.size(); ++i)
    if (!stages[i]) throw std::invalid_argument("stage " + std::to_string(i) + " is null");
  // One optimizer per rank, over parameters that live on one device.
  for (int r = 0; r < s.place.ranks; ++r) {
    std::optional<std::pair<int, device>> first;  // (stage, device)
    for (const int stage : s.place.stages_of(r))
      for (auto* p : stages[static_cast<std::size_t>(stage)]->parameters()) {
        if (!first) first.emplace(stage, p->value.where());
        for (const auto* t : {&p->value, &p->grad})
          if (t->where() != first->second)
            throw std::invalid_argument("rank " + std::to_string(r) + " holds stage " + std::to_string(first->first) +
                                        " on " + first->second.str() + " and stage " + std::to_string(stage) +
                                        " with the " + (t == &p->value ? "value" : "gradient") + " of parameter '" +
                                        p->name + "' on " + t->where().str() +
                                        ": a rank's stages must live on one device");
      }
  }
  auto plan = std::make_shared<schedule>(lower(s));
  validate(*plan);
  impl_->sys = &sys;
  impl_->plan = plan;
  if (!(options.step_timeout >= 0) || !std::isfinite(options.step_timeout))
    throw std::invalid_argument("step_timeout must be a number of seconds >= 0 (0: no limit)");
  // Past a billion seconds (32 years) a limit is no limit (and would overflow the clock).
  impl_->step_timeout = options.step_timeout >= 1e9 ? 0 : options.step_timeout;
  const int ranks = plan->place.ranks;
  if (!nodes.empty() && static_cast<int>(nodes.size()) != ranks)
    throw std::invalid_argument("the schedule has " + std::to_string(ranks) + " ranks; " +
                                std::to_string(nodes.size()) + " nodes were given");
  // The optimizer options are checked here, where a bad one is a clear error, not in an actor.
  {
    kernels::parameter probe{"probe", tensor::zeros({1}), tensor::zeros({1})};
    auto state = options.state;
    state.fp32_params.clear();
    kernels::optimizer check(options.optimizer, {{{&probe}, options.hp, state}});
    for (const auto& name : options.state.fp32_params) {
      bool found = false;
      for (const auto& stage : stages)
        for (const auto* p : stage->parameters()) found = found || p->name == name;
      if (!found)
        throw std::invalid_argument("fp32_params names '" + name + "', which is no parameter of any stage");
    }
  }
  // A rank that cannot be spawned or does not answer fails the constructor; the ranks made so
  // far are stopped (no destructor will).
  try {
    impl_->driver = sys.spawn<detail::driver_actor>();
    if (nodes.empty()) {
      for (int r = 0; r < ranks; ++r) {
        auto holder = std::make_shared<std::vector<std::unique_ptr<kernels::sequential>>>();
        for (const int stage : plan->place.stages_of(r)) holder->push_back(std::move(stages[static_cast<std::size_t>(stage)]));
        impl_->ranks.push_back(sys.spawn<rank_actor>(spawn_options{.reentrant = true}, r,
                                                     std::shared_ptr<const schedule>(plan), holder, options));
      }
    } else {
      // The schedule travels as CSV: check that it reads back as the same plan.
      const std::string csv = to_csv(s);
      if (lower(from_csv(csv, s.name)).ranks != plan->ranks)
        throw std::invalid_argument("the schedule '" + s.name + "' does not survive its CSV form, so it cannot go to other nodes");
      std::vector<std::vector<detail::portable_stage>> portable(static_cast<std::size_t>(ranks));
      for (int r = 0; r < ranks; ++r)
        for (const int stage : plan->place.stages_of(r))
          portable[static_cast<std::size_t>(r)].push_back(
              detail::to_portable(*stages[static_cast<std::size_t>(stage)], stage));
      for (int r = 0; r < ranks; ++r)
        impl_->ranks.push_back(sys.spawn_on<rank_actor>(nodes[static_cast<std::size_t>(r)], spawn_options{.reentrant = true},
                                                        r, s.name, csv, std::move(portable[static_cast<std::size_t>(r)]),
                                                        options));
    }
    // Every rank answers before any step: a rank on another node exists only once its node has
    // handled the spawn, and a neighbour's first activation must not reach its node before that.
    std::vector<future<void>> connected;
    for (auto& r : impl_->ranks) connected.push_back(r.ask(&rank_actor::connect, impl_->ranks, impl_->driver));
    for (auto& f : connected) f.get();
    impl_->watch_remote_ranks();
  } catch (...) {
    impl_->stop_ranks();
    throw;
  }
}

trainer::~trainer() { impl_->stop_ranks(); }

const schedule& trainer::plan() const noexcept { return *impl_->plan; }
std::int64_t trainer::steps() const noexcept { return static_cast<std::int64_t>(impl_->steps); }

step_result trainer::step(const tensor& x, const tensor& labels) {
  const auto& plan = *impl_->plan;
  if (x.rank() != 2) throw std::invalid_argument("the batch must be [N, features], not " + x.str());
  if (labels.rank() != 1 || labels.dim(0) != x.dim(0))
    throw std::invalid_argument("the labels must be [" + std::to_string(x.dim(0)) + "], not " + labels.str());
  if (x.dim(0) % plan.microbatches != 0)
    throw std::invalid_argument("a batch of " + std::to_string(x.dim(0)) + " does not split into " +
                                std::to_string(plan.microbatches) + " equal microbatches");
  if (troupe::detail::tls_current_cell() != nullptr || troupe::detail::tls_on_worker())
    throw error(errc::would_deadlock, "pipeline::trainer::step blocks until the step ends: call it outside actors");
  const auto t0 = clock_type::now();
  const std::uint64_t id = ++impl_->steps;
  {
    std::lock_guard lock(impl_->watch->mu);
    impl_->watch->step = id;
  }
  const auto xs = x.split(plan.microbatches);
  const auto ys = labels.split(plan.microbatches);
  const int ranks = plan.place.ranks;
  const int first_rank = plan.place.rank_of(0), last_rank = plan.place.rank_of(plan.stages() - 1);

  // Every rank answers, with its report or (its node lost, say) an error. An error aborts the
  // step on the other ranks, which may be waiting for what the failed one would have sent; so
  // the replies are collected as they come, not in rank order.
  struct collected {
    std::mutex mu;
    int pending = 0;
    std::vector<std::optional<rank_report>> reports;
    std::string error;  // the first call that failed outright
    promise<void> all_in;
  };
  auto c = std::make_shared<collected>();
  c->pending = ranks;
  c->reports.resize(static_cast<std::size_t>(ranks));
  c->all_in = impl_->sys->make_promise<void>();
  auto all_in = c->all_in.get_future();
  auto all_ranks = impl_->ranks;
  for (int r = 0; r < ranks; ++r) {
    detail::step_plan p{.step = id, .inputs = {}, .labels = {}};
    if (r == first_rank) p.inputs = xs;
    if (r == last_rank) p.labels = ys;
    auto done = [c](int rank, std::optional<rank_report> report, std::string error) {
      std::lock_guard lock(c->mu);
      c->reports[static_cast<std::size_t>(rank)] = std::move(report);
      if (!error.empty() && c->error.empty()) c->error = "rank " + std::to_string(rank) + ": " + error;
      if (--c->pending == 0) c->all_in.set_value();
    };
    auto fail = [done, r, id, all_ranks](std::exception_ptr e) {
      std::string why = "failed";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        why = ex.what();
      }
      for (const auto& other : all_ranks) other.tell(&rank_actor::abort, id, "rank " + std::to_string(r) + ": " + why);
      done(r, std::nullopt, why);
    };
    try {
      impl_->ranks[static_cast<std::size_t>(r)]
          .ask(&rank_actor::run, std::move(p))
          .then([done, r](rank_report report) { done(r, std::move(report), {}); }, fail);
    } catch (...) {  // the call could not even be sent: the ranks already running stop too
      fail(std::current_exception());
    }
  }
  try {
    // (get() drives a test_system while it waits; the callbacks' writes come before it.)
    if (impl_->step_timeout > 0)
      std::move(all_in).timeout(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::duration<double>(impl_->step_timeout)))
          .get();
    else
      all_in.get();
  } catch (const error& e) {
    if (e.code_value() != errc::timeout) throw;
    // Some rank did not answer in time: stop the step everywhere. Nothing is applied; the next
    // step starts afresh on every rank (a rank still in this one leaves it on the abort).
    const std::string why = "step " + std::to_string(id) + " did not finish within " +
                            std::to_string(impl_->step_timeout) + " s";
    for (const auto& r : impl_->ranks) r.tell(&rank_actor::abort, id, why);
    throw std::runtime_error("the step failed: " + why + "; it was aborted on every rank");
  }

  // The first rank that failed by itself names the error; the others only followed it.
  std::optional<rank_report> failure;
  for (const auto& r : c->reports)
    if (r && r->result != outcome::done && r->result != outcome::aborted && !failure) failure = r;
  // (A call that failed outright left its report empty; a rank that failed reported so.)
  const bool all_done = std::all_of(c->reports.begin(), c->reports.end(),
                                    [](const auto& r) { return r && r->result == outcome::done; });
  const bool finite =
      all_done && std::all_of(c->reports.begin(), c->reports.end(), [](const auto& r) { return r->finite; });
  // Every rank that answered steps its optimizer or drops its gradients (a rank that could not
  // answer is gone with its node).
  std::vector<std::pair<int, future<void>>> applied;
  for (int r = 0; r < ranks; ++r)
    if (c->reports[static_cast<std::size_t>(r)])
      applied.emplace_back(r, impl_->ranks[static_cast<std::size_t>(r)].ask(&rank_actor::apply, finite));
  for (auto& [r, f] : applied) {
    try {
      f.get();
    } catch (const std::exception& e) {
      if (c->error.empty()) c->error = "rank " + std::to_string(r) + ": " + e.what();
    }
  }
  if (failure && failure->result == outcome::bad_input) throw std::invalid_argument(failure->why);
  if (failure) throw std::runtime_error(failure->why);
  if (!c->error.empty()) throw std::runtime_error("the step failed: " + c->error);
  if (!all_done) {
    std::lock_guard lock(impl_->watch->mu);
    throw std::runtime_error("the step failed: " + (impl_->watch->lost.empty() ? std::string("aborted") : impl_->watch->lost));
  }

  step_result result;
  for (const auto& r : c->reports) {
    result.loss += r->loss_sum / plan.microbatches;
    result.busy_seconds.push_back(r->busy_seconds);
    result.peak_activation_bytes.push_back(static_cast<std::size_t>(r->peak_activation_bytes));
  }
  result.applied = finite;
  result.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  return result;
}

tensor trainer::predict(const tensor& x) {
  const auto& plan = *impl_->plan;
  tensor y = x;
  for (int s = 0; s < plan.stages(); ++s)
    y = impl_->ranks[static_cast<std::size_t>(plan.place.rank_of(s))].ask(&rank_actor::infer, s, y).get();
  return y.to(device::cpu());
}

std::vector<tensor> trainer::parameters() {
  const auto& plan = *impl_->plan;
  std::vector<tensor> out;
  for (int s = 0; s < plan.stages(); ++s)
    for (auto& t :
         impl_->ranks[static_cast<std::size_t>(plan.place.rank_of(s))].ask(&rank_actor::parameter_values, s).get())
      out.push_back(std::move(t));
  return out;
}

double whole_model_step(kernels::sequential& model, kernels::optimizer& opt, const tensor& x, const tensor& labels,
                        int microbatches) {
  if (microbatches < 1) throw std::invalid_argument("whole_model_step: microbatches must be at least 1");
  opt.zero_grad();
  const auto xs = x.split(microbatches), ys = labels.split(microbatches);
  const float scale = 1.0f / static_cast<float>(microbatches);
  double loss = 0;
  for (int j = 0; j < microbatches; ++j) {
    kernels::saved_activations keep;
    tensor logits = model.forward(xs[static_cast<std::size_t>(j)], keep, true);
    tensor dlogits;
    loss += kernels::softmax_cross_entropy(logits, ys[static_cast<std::size_t>(j)], dlogits) / microbatches;
    for (float& g : dlogits.data<float>()) g *= scale;
    model.backward(dlogits, keep);
  }
  opt.step();
  return loss;
}

std::vector<std::unique_ptr<kernels::sequential>> cut_mlp(kernels::sequential& model,
                                                          const std::vector<std::int64_t>& sizes, int stages) {
  const auto params = model.parameters();
  const std::size_t layers = sizes.size() < 2 ? 0 : sizes.size() - 1;
  auto bad = [&](const std::string& why) { throw std::invalid_argument("cut_mlp: " + why); };
  if (params.size() != 2 * layers) bad("the model does not have the layers of its sizes");
  for (std::size_t i = 0; i < layers; ++i)
    if (params[2 * i]->value.shape() != tensor::shape_type{sizes[i + 1], sizes[i]} ||
        params[2 * i + 1]->value.shape() != tensor::shape_type{1, sizes[i + 1]})
      bad("layer " + std::to_string(i) + " is not linear(" + std::to_string(sizes[i]) + "->" +
          std::to_string(sizes[i + 1]) + ")");
  // The parameters fit; so must the layers between them (ReLU, nothing else): the stages are
  // built that way.
  std::string expected = "sequential(";
  for (std::size_t i = 0; i < layers; ++i)
    expected += (i ? ", relu, linear(" : "linear(") + std::to_string(sizes[i]) + "->" + std::to_string(sizes[i + 1]) + ")";
  expected += ")";
  if (const std::string given = model.describe(); given != expected)
    bad("the model is " + given + ", not " + expected + " (linear layers with ReLU between them, as make_mlp makes)");
  if (stages < 1 || static_cast<std::size_t>(stages) > layers)
    bad("a model of " + std::to_string(layers) + " linear layers cannot fill " + std::to_string(stages) +
        " stages (give it more layers, or use fewer ranks or stages per rank)");
  std::vector<std::uint64_t> counts;
  for (std::size_t i = 0; i < layers; ++i)
    counts.push_back(static_cast<std::uint64_t>(sizes[i + 1] * sizes[i] + sizes[i + 1]));
  const auto cuts = partition_by_parameters(counts, static_cast<std::size_t>(stages));
  std::vector<std::unique_ptr<kernels::sequential>> out;
  for (std::size_t s = 0; s < cuts.stages(); ++s) {
    auto stage = std::make_unique<kernels::sequential>();
    for (std::size_t i = cuts.boundaries[s]; i < cuts.boundaries[s + 1]; ++i) {
      stage->add(kernels::make_linear(sizes[i], sizes[i + 1]));
      if (i + 1 < layers) stage->add(kernels::make_relu());
    }
    // The stage's parameters are the model's, by value and by name ("2.weight", not the stage's "0.weight").
    const auto mine = stage->parameters();
    for (std::size_t k = 0; k < mine.size(); ++k) {
      mine[k]->value = params[2 * cuts.boundaries[s] + k]->value.clone();
      mine[k]->name = params[2 * cuts.boundaries[s] + k]->name;
    }
    out.push_back(std::move(stage));
  }
  return out;
}

namespace {
class engine final : public kernels::train_engine {
public:
  engine(actor_system& sys, const schedule& s, const std::vector<std::uint32_t>& nodes, const kernels::engine_setup& setup)
      : microbatches_(s.microbatches),
        trainer_(sys, s, cut_mlp(setup.model, setup.sizes, s.stages()),
                 {.optimizer = setup.kind, .hp = setup.hp, .state = setup.state, .cosine_steps = setup.cosine_steps},
                 nodes) {}
  kernels::step_outcome step(const tensor& x, const tensor& labels) override {
    const auto r = trainer_.step(x, labels);
    return {r.loss, r.applied};
  }
  tensor predict(const tensor& x) override { return trainer_.predict(x); }
  void sync(kernels::layer& model) override {
    const auto values = trainer_.parameters();
    const auto params = model.parameters();
    if (values.size() != params.size()) throw std::logic_error("pipeline engine: the model changed");
    for (std::size_t i = 0; i < params.size(); ++i) params[i]->value = values[i];
  }
  std::int64_t granule() const override { return microbatches_; }

private:
  std::int64_t microbatches_;
  trainer trainer_;
};
}  // namespace

kernels::engine_factory pipeline_engine(actor_system& sys, schedule s, std::vector<std::uint32_t> nodes) {
  return [&sys, s = std::move(s), nodes = std::move(nodes)](
             const kernels::engine_setup& setup) -> std::unique_ptr<kernels::train_engine> {
    return std::make_unique<engine>(sys, s, nodes, setup);
  };
}

}  // namespace troupe::pipeline
