#include "troupe/pipeline/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "rank.hpp"

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
  double clip = 0;
  bool record = false;  // training_options::record_timeline
  bool timeline_dropped = false;  // a step's timeline was malformed (logged once)
  std::vector<std::size_t> stage_params;  // parameter tensors of each stage

  /// The step's timeline from the ranks' reports: each rank's times are from its own start; the
  /// ranks in this process share one clock and go on the earliest of their starts. A rank on
  /// another node keeps its own origin (shift 0): no offset between the clocks is measured, so a
  /// span across nodes is approximate (docs/TRAINING.md, "The measured step").
  step_timeline timeline_of(const std::vector<std::optional<rank_report>>& reports) const {
    std::optional<std::int64_t> origin;
    for (std::size_t r = 0; r < ranks.size(); ++r)
      if (!ranks[r].is_remote() && (!origin || reports[r]->began_ns < *origin)) origin = reports[r]->began_ns;
    step_timeline out(ranks.size());
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const auto& times = reports[r]->times;
      const std::int64_t shift = ranks[r].is_remote() ? 0 : reports[r]->began_ns - *origin;
      const auto actions = static_cast<std::size_t>(
          std::count_if(plan->ranks[r].begin(), plan->ranks[r].end(), [](const auto& a) { return a.has_value(); }));
      if (times.size() != 2 * actions)
        throw std::runtime_error("rank " + std::to_string(r) + " reported " + std::to_string(times.size() / 2) +
                                 " action times for its " + std::to_string(actions) + " actions");
      std::size_t k = 0;
      out[r].reserve(actions);
      for (const auto& a : plan->ranks[r])
        if (a) {
          out[r].push_back({*a, times[2 * k] + shift, times[2 * k + 1] + shift});
          ++k;
        }
    }
    return out;
  }

  /// What clipping multiplies every gradient by: from the square sums the ranks reported, put
  /// in model order and added as one optimizer of the whole model adds them.
  double clip_scale(const std::vector<std::optional<rank_report>>& reports) const {
    std::vector<std::size_t> first(stage_params.size() + 1, 0);
    for (std::size_t i = 0; i < stage_params.size(); ++i) first[i + 1] = first[i] + stage_params[i];
    std::vector<double> sums(first.back(), 0.0);
    for (int r = 0; r < plan->place.ranks; ++r) {
      const auto& got = reports[static_cast<std::size_t>(r)]->square_sums;
      std::size_t k = 0;
      for (const int stage : plan->place.stages_of(r))
        for (std::size_t i = first[static_cast<std::size_t>(stage)]; i < first[static_cast<std::size_t>(stage) + 1]; ++i) {
          if (k >= got.size()) throw std::runtime_error("rank " + std::to_string(r) + " reported too few gradient norms");
          sums[i] = got[k++];
        }
      if (k != got.size()) throw std::runtime_error("rank " + std::to_string(r) + " reported too many gradient norms");
    }
    return kernels::clip_coefficient(kernels::global_norm(sums), clip);
  }

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
  detail::check_options(options);
  // Past a billion seconds (32 years) a limit is no limit (and would overflow the clock).
  impl_->step_timeout = options.step_timeout >= 1e9 ? 0 : options.step_timeout;
  impl_->clip = options.clip;
  impl_->record = options.record_timeline;
  for (const auto& stage : stages) impl_->stage_params.push_back(stage->parameters().size());
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
    // Where each stage's parameters begin in the whole model's list (stochastic rounding keys
    // tensors by it).
    std::vector<std::uint64_t> first_param(stages.size() + 1, 0);
    for (std::size_t i = 0; i < stages.size(); ++i) first_param[i + 1] = first_param[i] + stages[i]->parameters().size();
    auto firsts_of = [&](int r) {
      std::vector<std::uint64_t> out;
      for (const int stage : plan->place.stages_of(r)) out.push_back(first_param[static_cast<std::size_t>(stage)]);
      return out;
    };
    if (nodes.empty()) {
      for (int r = 0; r < ranks; ++r) {
        auto holder = std::make_shared<std::vector<std::unique_ptr<kernels::sequential>>>();
        for (const int stage : plan->place.stages_of(r)) holder->push_back(std::move(stages[static_cast<std::size_t>(stage)]));
        impl_->ranks.push_back(sys.spawn<rank_actor>(spawn_options{.reentrant = true}, r,
                                                     std::shared_ptr<const schedule>(plan), holder, options, firsts_of(r)));
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
                                                        options, firsts_of(r)));
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
  if (x.rank() != 2 || x.type() != dtype::f32)
    throw std::invalid_argument("the batch must be f32 [N, features], not " + x.str());
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
  const double scale = finite && impl_->clip > 0 ? impl_->clip_scale(c->reports) : 1.0;
  // Every rank that answered steps its optimizer or drops its gradients (a rank that could not
  // answer is gone with its node).
  std::vector<std::pair<int, future<void>>> applied;
  for (int r = 0; r < ranks; ++r)
    if (c->reports[static_cast<std::size_t>(r)])
      applied.emplace_back(r, impl_->ranks[static_cast<std::size_t>(r)].ask(&rank_actor::apply, id, finite, scale));
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
  // The step is applied already: a timeline that does not fit the plan (a rank's report is
  // malformed) is dropped and training goes on; only diagnostics lose it.
  if (impl_->record) {
    try {
      result.timeline = impl_->timeline_of(c->reports);
    } catch (const std::exception& e) {
      if (!impl_->timeline_dropped)
        troupe::log().warn("pipeline step {}: its timeline is dropped ({}); training goes on (logged once)", id, e.what());
      impl_->timeline_dropped = true;
    }
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

std::vector<kernels::shard_info> trainer::save_shards(const std::string& dir, const std::string& slot) {
  std::vector<future<kernels::shard_info>> written;
  for (std::size_t r = 0; r < impl_->ranks.size(); ++r)
    written.push_back(impl_->ranks[r].ask(&rank_actor::save_shard,
                                          (std::filesystem::path(dir) / kernels::shard_name(static_cast<int>(r), slot)).string()));
  std::vector<kernels::shard_info> out;
  std::string error;
  for (std::size_t r = 0; r < written.size(); ++r) {
    try {
      out.push_back(written[r].get());
    } catch (const std::exception& e) {  // every rank is waited for: none writes after this returns
      if (error.empty()) error = "rank " + std::to_string(r) + ": " + e.what();
    }
  }
  if (!error.empty()) throw std::runtime_error("the checkpoint was not written: " + error);
  return out;
}

void trainer::load_shards(const std::string& dir, const std::vector<kernels::shard_info>& shards) {
  if (shards.size() != impl_->ranks.size())
    throw std::invalid_argument("the checkpoint has " + std::to_string(shards.size()) + " shards for " +
                                std::to_string(impl_->ranks.size()) + " ranks");
  std::vector<future<void>> read;
  for (std::size_t r = 0; r < shards.size(); ++r)
    read.push_back(impl_->ranks[r].ask(&rank_actor::load_shard, (std::filesystem::path(dir) / shards[r].file).string(),
                                       shards[r]));
  std::string error;
  for (std::size_t r = 0; r < read.size(); ++r) {
    try {
      read[r].get();
    } catch (const std::exception& e) {
      if (error.empty()) error = "rank " + std::to_string(r) + ": " + e.what();
    }
  }
  if (!error.empty()) throw std::runtime_error(error);
}

kernels::shard_layout trainer::layout() const {
  kernels::shard_layout out;
  for (int s = 0; s < impl_->plan->stages(); ++s) out.rank_of_stage.push_back(impl_->plan->place.rank_of(s));
  out.stage_tensors = impl_->stage_params;
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
  // Its pieces are its linear layers, each with the ReLU after it.
  return cut_sequential(model, stages);
}

int pieces_of(kernels::sequential& model) {
  int n = 0;
  for (std::size_t i = 0; i < model.size(); ++i) n += model.at(i).parameters().empty() ? 0 : 1;
  return n;
}

std::vector<std::unique_ptr<kernels::sequential>> cut_sequential(kernels::sequential& model, int stages) {
  // The pieces: each begins at a layer with parameters (the first at layer 0).
  std::vector<std::size_t> begins;
  std::vector<std::uint64_t> counts;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const auto params = model.at(i).parameters();
    if (params.empty()) continue;
    begins.push_back(begins.empty() ? 0 : i);
    counts.push_back(0);
    for (const auto* p : params) counts.back() += static_cast<std::uint64_t>(p->value.numel());
  }
  if (stages < 1 || static_cast<std::size_t>(stages) > begins.size())
    throw std::invalid_argument("the model's " + std::to_string(begins.size()) +
                                " layers with parameters (a GPT has layers * 2 blocks + 3) cannot fill " +
                                std::to_string(stages) +
                                " stages (give it more layers, or use fewer ranks or stages per rank)");
  begins.push_back(model.size());
  const auto cuts = partition_by_parameters(counts, static_cast<std::size_t>(stages));
  std::vector<std::unique_ptr<kernels::sequential>> out;
  for (std::size_t s = 0; s < cuts.stages(); ++s) {
    auto stage = std::make_unique<kernels::sequential>();
    std::vector<std::string> names;
    for (std::size_t i = begins[cuts.boundaries[s]]; i < begins[cuts.boundaries[s + 1]]; ++i) {
      auto& from = model.at(i);
      std::unique_ptr<kernels::layer> copy;
      try {
        copy = kernels::make_layer(from.describe());
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("layer " + std::to_string(i) + " of the model cannot be cut into a stage: " + e.what());
      }
      const auto src = from.parameters();
      if (!src.empty() && !src.front()->value.where().is_cpu()) kernels::move_to(*copy, src.front()->value.where());
      const auto dst = copy->parameters();
      if (dst.size() != src.size()) throw std::logic_error("cut_sequential: '" + from.describe() + "' rebuilt differently");
      for (std::size_t k = 0; k < src.size(); ++k) {
        if (dst[k]->value.shape() != src[k]->value.shape())
          throw std::logic_error("cut_sequential: '" + from.describe() + "' rebuilt with other shapes");
        dst[k]->value = src[k]->value.clone();
        names.push_back(src[k]->name);
      }
      std::vector<std::string> random;
      from.save_random_state(random);
      std::size_t next = 0;
      copy->load_random_state(random, next);
      stage->add(std::move(copy));
    }
    // The stage's parameters keep the model's names ("2.weight", not the stage's "0.weight").
    const auto mine = stage->parameters();
    for (std::size_t k = 0; k < mine.size(); ++k) mine[k]->name = names[k];
    out.push_back(std::move(stage));
  }
  return out;
}

namespace {
/// Shows the step to `observe` (when set). The step is applied already, and what observers do is
/// diagnostics: an observer that throws is logged (the first time) and the training goes on.
void show_step(const step_observer& observe, const schedule& plan, const step_result& r, bool& failed) {
  if (!observe) return;
  try {
    observe(plan, r);
  } catch (const std::exception& e) {
    if (!failed) troupe::log().warn("pipeline: the step observer failed ({}); training goes on (logged once)", e.what());
    failed = true;
  }
}

class engine final : public kernels::train_engine {
public:
  engine(actor_system& sys, const schedule& s, const std::vector<std::uint32_t>& nodes, const kernels::engine_setup& setup,
         step_observer observe)
      : microbatches_(s.microbatches),
        observe_(std::move(observe)),
        trainer_(sys, s, cut_mlp(setup.model, setup.sizes, s.stages()),
                 {.optimizer = setup.kind, .hp = setup.hp, .state = setup.state, .cosine_steps = setup.cosine_steps,
                  .record_timeline = static_cast<bool>(observe_)},
                 nodes) {}
  kernels::step_outcome step(const tensor& x, const tensor& labels) override {
    const auto r = trainer_.step(x, labels);
    show_step(observe_, trainer_.plan(), r, observer_failed_);
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
  step_observer observe_;
  bool observer_failed_ = false;
  trainer trainer_;
};
}  // namespace

namespace {
/// A GPT trained by a trainer: the rank optimizers configured as lm_in_thread configures its one.
class lm_stages final : public kernels::lm_engine {
public:
  lm_stages(actor_system& sys, const schedule& s, const std::vector<std::uint32_t>& nodes,
            const kernels::lm_engine_setup& setup, step_observer observe)
      : observe_(std::move(observe)),
        trainer_(sys, checked(s, setup), cut_sequential(setup.model, s.stages()), options_of(setup, observe_), nodes) {}
  kernels::step_outcome step(const tensor& x, const tensor& y) override {
    const auto r = trainer_.step(x, y);
    show_step(observe_, trainer_.plan(), r, observer_failed_);
    return {r.loss, r.applied};
  }
  tensor predict(const tensor& x) override { return trainer_.predict(x); }
  void sync(kernels::sequential& model) override {
    const auto values = trainer_.parameters();
    const auto params = model.parameters();
    if (values.size() != params.size()) throw std::logic_error("pipeline engine: the model changed");
    for (std::size_t i = 0; i < params.size(); ++i) params[i]->value = values[i];
  }
  kernels::shard_layout layout() override { return trainer_.layout(); }
  std::vector<kernels::shard_info> save_shards(const std::string& dir, const std::string& slot) override {
    return trainer_.save_shards(dir, slot);
  }
  void load_shards(const std::string& dir, const std::vector<kernels::shard_info>& shards) override {
    trainer_.load_shards(dir, shards);
  }

private:
  static const schedule& checked(const schedule& s, const kernels::lm_engine_setup& setup) {
    if (s.microbatches != setup.microbatches)
      throw std::invalid_argument("the schedule '" + s.name + "' has " + std::to_string(s.microbatches) +
                                  " microbatches; the training splits its batches into " +
                                  std::to_string(setup.microbatches));
    return s;
  }
  static training_options options_of(const kernels::lm_engine_setup& setup, const step_observer& observe) {
    training_options o;
    o.optimizer = kernels::optimizer_kind::adamw;
    o.hp = setup.hp;
    o.state = setup.state;
    o.cosine_steps = static_cast<double>(setup.decay_steps);
    o.warmup = setup.warmup;
    o.min_lr = setup.min_lr;
    o.decay_matrices_only = true;
    o.clip = setup.clip;
    o.record_timeline = static_cast<bool>(observe);  // recorded only for someone to see
    o.checkpoint_dirs = setup.checkpoint_dirs;
    return o;
  }
  step_observer observe_;
  bool observer_failed_ = false;
  trainer trainer_;
};
}  // namespace

kernels::lm_engine_factory lm_pipeline_engine(actor_system& sys, schedule s, std::vector<std::uint32_t> nodes,
                                              step_observer observe) {
  return [&sys, s = std::move(s), nodes = std::move(nodes), observe = std::move(observe)](
             const kernels::lm_engine_setup& setup) -> std::unique_ptr<kernels::lm_engine> {
    return std::make_unique<lm_stages>(sys, s, nodes, setup, observe);
  };
}

kernels::engine_factory pipeline_engine(actor_system& sys, schedule s, std::vector<std::uint32_t> nodes,
                                        step_observer observe) {
  return [&sys, s = std::move(s), nodes = std::move(nodes), observe = std::move(observe)](
             const kernels::engine_setup& setup) -> std::unique_ptr<kernels::train_engine> {
    return std::make_unique<engine>(sys, s, nodes, setup, observe);
  };
}

}  // namespace troupe::pipeline
