#include "troupe/pipeline/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "troupe/actors/actor_system.hpp"
#include "troupe/pipeline/partition.hpp"
#include "troupe/pipeline/simulator.hpp"

namespace troupe::pipeline {

namespace {

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

struct rank_report {
  double loss_sum = 0;  ///< of the microbatch means, when the rank holds the last stage
  bool finite = true;   ///< every gradient of the rank's parameters
  double busy_seconds = 0;
  std::size_t peak_activation_bytes = 0;
};

/// The error of a rank that stopped because another rank failed: the driver reports the
/// failure itself, not its echoes.
class step_aborted : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

using cell_key = std::pair<int, int>;  // (stage, microbatch)
using stage_holder = std::shared_ptr<std::vector<std::unique_ptr<kernels::sequential>>>;

/// One rank: its stages, its optimizer, and the state of the step in flight.
class rank_actor {
public:
  /// `stages` holds the rank's stages in model order; the actor takes them (spawn keeps its
  /// arguments copyable for restarts, so they travel in a shared holder that is emptied here).
  rank_actor(int rank, std::shared_ptr<const schedule> plan, stage_holder holder, const training_options& options)
      : rank_(rank), plan_(std::move(plan)) {
    const auto mine = plan_->place.stages_of(rank);
    auto stages = std::move(*holder);
    if (stages.size() != mine.size()) throw std::logic_error("a rank's stages can be taken once");
    std::vector<kernels::parameter*> params;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      stages_.emplace(mine[i], std::move(stages[i]));
      for (auto* p : stages_.at(mine[i])->parameters()) params.push_back(p);
    }
    // One optimizer thread: the ranks are the parallelism (results do not depend on threads).
    optimizer_.emplace(options.optimizer, std::vector<kernels::param_group>{{params, options.hp, options.state}},
                       kernels::optimizer_options{.threads = 1});
    if (options.lr_schedule) optimizer_->set_lr_schedule(options.lr_schedule);
  }

  void connect(std::vector<actor_ref<rank_actor>> ranks) { ranks_ = std::move(ranks); }

  /// Runs the rank's actions for one step; the gradients wait for apply().
  task<rank_report> run(step_plan plan) {
    begin(plan.step);
    rank_report report;
    try {
      optimizer_->zero_grad();
      for (const auto& a : plan_->ranks[static_cast<std::size_t>(rank_)]) {
        if (!a) continue;
        const cell_key at{a->stage, a->microbatch};
        switch (a->kind) {
          case op::recv_f: inputs_[at] = co_await receive(false, at); break;
          case op::recv_b: grads_[at] = co_await receive(true, at); break;
          case op::send_f: send(false, a->stage + 1, a->microbatch, take(outputs_, at, "SEND_F")); break;
          case op::send_b: send(true, a->stage - 1, a->microbatch, take(input_grads_, at, "SEND_B")); break;
          case op::recompute: throw std::logic_error("RECOMPUTE reached a rank");  // refused by the trainer
          default: {
            const auto t0 = clock_type::now();
            compute(*a, plan, report);
            report.busy_seconds += std::chrono::duration<double>(clock_type::now() - t0).count();
            std::size_t held = 0;
            for (const auto& [key, keep] : keeps_) held += keep.bytes();
            report.peak_activation_bytes = std::max(report.peak_activation_bytes, held);
          }
        }
      }
      if (!keeps_.empty() || !inputs_.empty() || !grads_.empty() || !outputs_.empty() || !input_grads_.empty())
        throw std::logic_error("rank " + std::to_string(rank_) + " ended its step with tensors left over");
    } catch (const std::exception& e) {
      fail_step(e.what());
      throw;
    }
    for (const auto& [stage, layers] : stages_)
      for (auto* p : layers->parameters()) report.finite = report.finite && all_finite(p->grad.data<float>());
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

  /// Another rank failed step `step`: stop this rank's part of it too.
  void abort(std::uint64_t step, std::string why) {
    if (step < step_ || (step == step_ && !running_)) return;  // over already
    aborted_step_ = step;
    aborted_why_ = why;
    if (step == step_ && running_) fail_waiting();
  }

  /// After a step every rank finished: step the optimizer, or (`keep` false) drop the gradients.
  void apply(bool keep) {
    if (keep) optimizer_->step();
    optimizer_->zero_grad();
  }

  tensor infer(int stage, tensor x) {
    kernels::saved_activations keep;
    return stages_.at(stage)->forward(x, keep, false);
  }

  std::vector<tensor> parameter_values(int stage) {
    std::vector<tensor> out;
    for (auto* p : stages_.at(stage)->parameters()) out.push_back(p->value.clone());
    return out;
  }

private:
  void begin(std::uint64_t step) {
    step_ = step;
    if (aborted_step_ == step) throw step_aborted(aborted_why_);
    running_ = true;
    keeps_.clear();
    inputs_.clear();
    grads_.clear();
    outputs_.clear();
    input_grads_.clear();
    weight_grads_.clear();
    // Tensors of earlier (aborted) steps are of no use now; those of this step stay.
    std::erase_if(arrived_, [step](const auto& kv) { return std::get<0>(kv.first) < step; });
  }

  void end_step() {
    running_ = false;
    keeps_.clear();
  }

  void fail_step(const std::string& why) {
    // The other ranks may wait for what this one will never send: stop them (an echo of an
    // abort is not sent on).
    if (aborted_step_ != step_) {
      aborted_step_ = step_;
      aborted_why_ = "rank " + std::to_string(rank_) + " failed: " + why;
      for (std::size_t r = 0; r < ranks_.size(); ++r)
        if (static_cast<int>(r) != rank_) ranks_[r].tell(&rank_actor::abort, step_, aborted_why_);
    }
    fail_waiting();
    end_step();
  }

  void fail_waiting() {
    for (auto* waiting : {&waiting_inputs_, &waiting_grads_}) {
      for (auto& [key, p] : *waiting) p.set_exception(std::make_exception_ptr(step_aborted(aborted_why_)));
      waiting->clear();
    }
  }

  future<tensor> receive(bool gradient, cell_key at) {
    if (aborted_step_ == step_) throw step_aborted(aborted_why_);
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
  static tensor take(Map& m, cell_key at, const char* what) {
    auto it = m.find(at);
    if (it == m.end())
      throw std::logic_error(std::string(what) + " of stage " + std::to_string(at.first) + ", microbatch " +
                             std::to_string(at.second) + " has nothing to work on");
    tensor t = std::move(it->second);
    m.erase(it);
    return t;
  }

  /// F, B, I or W of one (stage, microbatch).
  void compute(const action& a, const step_plan& plan, rank_report& report) {
    const cell_key at{a.stage, a.microbatch};
    auto& layers = *stages_.at(a.stage);
    const int last = plan_->stages() - 1;
    switch (a.kind) {
      case op::F: {
        tensor x = a.stage == 0 ? plan.inputs.at(static_cast<std::size_t>(a.microbatch)) : take(inputs_, at, "F");
        tensor y = layers.forward(x, keeps_[at], true);
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
        tensor dy = take(grads_, at, a.kind == op::B ? "B" : "I");
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
  std::shared_ptr<const schedule> plan_;
  std::map<int, std::unique_ptr<kernels::sequential>> stages_;
  std::optional<kernels::optimizer> optimizer_;
  std::vector<actor_ref<rank_actor>> ranks_;

  std::uint64_t step_ = 0;
  bool running_ = false;
  std::optional<std::uint64_t> aborted_step_;
  std::string aborted_why_;
  std::map<cell_key, kernels::saved_activations> keeps_;  // F until B or W
  std::map<cell_key, tensor> inputs_;                     // a stage's input, before its F
  std::map<cell_key, tensor> grads_;                      // a stage's output gradient, before B or I
  std::map<cell_key, tensor> outputs_;                    // F's output, before SEND_F
  std::map<cell_key, tensor> input_grads_;                // B's or I's input gradient, before SEND_B
  std::map<cell_key, tensor> weight_grads_;               // I's output gradient, kept for W
  std::map<std::tuple<std::uint64_t, bool, int, int>, tensor> arrived_;  // before their RECV
  std::map<cell_key, promise<tensor>> waiting_inputs_, waiting_grads_;   // RECVs waiting
};

}  // namespace

struct trainer::impl {
  std::shared_ptr<const schedule> plan;
  std::vector<actor_ref<rank_actor>> ranks;
  std::uint64_t steps = 0;
};

trainer::trainer(actor_system& sys, const schedule& s, std::vector<std::unique_ptr<kernels::sequential>> stages,
                 training_options options)
    : impl_(std::make_unique<impl>()) {
  if (static_cast<int>(stages.size()) != s.stages())
    throw std::invalid_argument("the schedule '" + s.name + "' has " + std::to_string(s.stages()) + " stages; " +
                                std::to_string(stages.size()) + " were given");
  for (std::size_t i = 0; i < stages.size(); ++i)
    if (!stages[i]) throw std::invalid_argument("stage " + std::to_string(i) + " is null");
  for (const auto& row : s.ranks)
    for (const auto& a : row)
      if (a && a->kind == op::recompute)
        throw std::invalid_argument("the schedule '" + s.name +
                                    "' recomputes activations (RECOMPUTE), which the runtime does not run yet: "
                                    "use it without activation checkpointing");
  auto plan = std::make_shared<schedule>(lower(s));
  validate(*plan);
  impl_->plan = plan;

  std::vector<stage_holder> per_rank;
  for (int r = 0; r < plan->place.ranks; ++r) {
    per_rank.push_back(std::make_shared<std::vector<std::unique_ptr<kernels::sequential>>>());
    for (const int stage : plan->place.stages_of(r))
      per_rank.back()->push_back(std::move(stages[static_cast<std::size_t>(stage)]));
  }
  // The optimizer options are checked here, where a bad one is a clear error, not in an actor.
  {
    kernels::parameter probe{"probe", tensor::zeros({1}), tensor::zeros({1})};
    kernels::optimizer check(options.optimizer, {{{&probe}, options.hp, options.state}});
  }
  for (int r = 0; r < plan->place.ranks; ++r)
    impl_->ranks.push_back(sys.spawn<rank_actor>(spawn_options{.reentrant = true}, r,
                                                 std::shared_ptr<const schedule>(plan),
                                                 per_rank[static_cast<std::size_t>(r)], options));
  for (auto& r : impl_->ranks) r.tell(&rank_actor::connect, impl_->ranks);
}

trainer::~trainer() = default;

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
  const auto t0 = clock_type::now();
  const std::uint64_t id = ++impl_->steps;
  const auto xs = x.split(plan.microbatches);
  const auto ys = labels.split(plan.microbatches);
  const int first_rank = plan.place.rank_of(0), last_rank = plan.place.rank_of(plan.stages() - 1);
  std::vector<future<rank_report>> running;
  for (int r = 0; r < plan.place.ranks; ++r) {
    step_plan p{.step = id, .inputs = {}, .labels = {}};
    if (r == first_rank) p.inputs = xs;
    if (r == last_rank) p.labels = ys;
    running.push_back(impl_->ranks[static_cast<std::size_t>(r)].ask(&rank_actor::run, std::move(p)));
  }
  // Every rank answers: one that fails aborts the others, so none waits forever.
  step_result result;
  std::exception_ptr failure, echo;
  std::vector<rank_report> reports;
  for (auto& f : running) {
    try {
      reports.push_back(f.get());
    } catch (const step_aborted&) {
      if (!echo) echo = std::current_exception();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (!failure) failure = echo;
  const bool finite = !failure && std::all_of(reports.begin(), reports.end(), [](const auto& r) { return r.finite; });
  std::vector<future<void>> applied;
  for (auto& r : impl_->ranks) applied.push_back(r.ask(&rank_actor::apply, finite));
  for (auto& f : applied) f.get();
  if (failure) std::rethrow_exception(failure);
  for (const auto& r : reports) {
    result.loss += r.loss_sum / plan.microbatches;
    result.busy_seconds.push_back(r.busy_seconds);
    result.peak_activation_bytes.push_back(r.peak_activation_bytes);
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
  return y;
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
    const auto mine = stage->parameters();
    for (std::size_t k = 0; k < mine.size(); ++k) mine[k]->value = params[2 * cuts.boundaries[s] + k]->value.clone();
    out.push_back(std::move(stage));
  }
  return out;
}

namespace {
class engine final : public kernels::train_engine {
public:
  engine(actor_system& sys, const schedule& s, const kernels::engine_setup& setup)
      : microbatches_(s.microbatches),
        trainer_(sys, s, cut_mlp(setup.model, setup.sizes, s.stages()),
                 {.optimizer = setup.kind, .hp = setup.hp, .state = setup.state, .lr_schedule = setup.lr_schedule}) {}
  double step(const tensor& x, const tensor& labels) override { return trainer_.step(x, labels).loss; }
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

kernels::engine_factory pipeline_engine(actor_system& sys, schedule s) {
  return [&sys, s = std::move(s)](const kernels::engine_setup& setup) -> std::unique_ptr<kernels::train_engine> {
    return std::make_unique<engine>(sys, s, setup);
  };
}

}  // namespace troupe::pipeline
