// The round engine: the simulation's setup, its synchronous rounds (sampling, the clients'
// asks through a bounded window, aggregation in sample order) and run_simulation's loop.

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "filtering.hpp"
#include "simulation_impl.hpp"
#include "troupe/federated/continual.hpp"
#include "troupe/federated/fairness.hpp"
#include "troupe/federated/drift.hpp"
#include "troupe/federated/fedgen.hpp"
#include "troupe/federated/unlearn.hpp"
#include "troupe/core/file.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {

using namespace detail;

namespace {

/// FedGEN's server for the options' model: the head is the last linear layer.
std::unique_ptr<server_strategy> make_fedgen(engine_state& e, const simulation_options& o) {
  auto model = make_model(o.model);
  const auto params = model->parameters();
  const int classes = e.data->classes;
  const bool linear_last = model->size() > 0 && params.size() >= 2 &&
                           model->at(model->size() - 1).describe().rfind("linear(", 0) == 0;
  const tensor* w = linear_last ? &params[params.size() - 2]->value : nullptr;
  const tensor* b = linear_last ? &params.back()->value : nullptr;
  if (!linear_last || w->rank() != 2 || w->dim(0) != classes || b->numel() != classes)
    throw std::invalid_argument("--strategy fedgen: model '" + o.model + "' does not end in a linear layer to " +
                                std::to_string(classes) + " classes (its head)");
  const int latent = static_cast<int>(w->dim(1));
  const std::size_t head_offset = e.dim - static_cast<std::size_t>(classes) * (static_cast<std::size_t>(latent) + 1);
  label_counter counts = [&e, classes](std::uint64_t client, std::span<std::uint32_t> out) {
    std::fill(out.begin(), out.end(), 0u);
    const auto labels = e.data->train.labels.data<std::uint8_t>();
    for (std::size_t i = e.part.offsets[client]; i < e.part.offsets[client + 1]; ++i) {
      const std::uint8_t y = labels[e.part.indices[i]];
      if (y < classes) ++out[y];
    }
  };
  return make_fedgen_strategy(parse_fedgen(o.strategy), classes, latent, head_offset, std::move(counts),
                              derive_seed(o.seed, stream_generator), o.server.server_lr > 0 ? o.server.server_lr : 1.0);
}

}  // namespace

double staleness_weight(std::int64_t staleness) {
  if (staleness < 0) throw std::invalid_argument("staleness_weight: negative staleness");
  return 1.0 / std::sqrt(1.0 + static_cast<double>(staleness));
}

simulation::simulation(simulation_options options, shared_data data, trainer_factory trainer)
    : impl_(std::make_unique<impl>()) {
  check_options(options);
  if (!options.client_models.empty())
    throw std::invalid_argument("--client-models: clients of different architectures are run by run_heterogeneous, not a simulation");
  auto& e = impl_->engine;
  e.options = std::move(options);
  const auto& o = e.options;
  const bool custom = static_cast<bool>(trainer);
  e.factory = custom ? std::move(trainer) : make_trainer_factory(o);
  // The strategy first: a bad name fails before the data loads. A robust rule is FedAvg's
  // server step over that rule's aggregate.
  {
    auto server = o.server;
    server.client_lr = o.lr;  // q-FedAvg's L = 1 / lr
    e.strategy = make_strategy(is_robust_rule(o.strategy) || is_fedgen(o.strategy) ? "fedavg" : o.strategy, server);
  }
  if (!custom && o.trainer == "mlp") (void)make_model(o.model);
  if (!data && (custom || o.trainer == "mlp")) data = load_data(o);
  if (!o.shift.empty()) {
    if (!data) throw std::invalid_argument("--shift needs data to shift (the noop trainer has none)");
    data = shift_data(data, o.shift);
  }
  e.data = std::move(data);
  impl_->server_trainer = e.factory(e.data);
  e.dim = impl_->server_trainer->dim();
  if (!o.continual.empty() && !custom) impl_->continual = continual_state_of(*impl_->server_trainer);

  // Partition: over the data's labels, or, for a trainer without data, over synthetic ones.
  // --contribution's validation examples (the last rows) are in no client's shard.
  const std::size_t validation_from = hold_out_validation(o, e.data);
  tensor labels;
  if (e.data) {
    labels = e.data->train.labels;
    if (validation_from > 0) labels = labels.slice(0, static_cast<std::int64_t>(validation_from)).clone();
  } else {
    const std::int64_t n = std::max<std::int64_t>(60000, static_cast<std::int64_t>(o.clients));
    labels = tensor::empty({n}, dtype::u8);
    auto l = labels.data<std::uint8_t>();
    for (std::int64_t i = 0; i < n; ++i) l[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i % 10);
  }
  if (e.data && e.data->client_train.defined()) {  // the data's own partition
    const auto of = e.data->client_train.data<std::uint32_t>();
    const std::size_t named = of.empty() ? 0 : static_cast<std::size_t>(*std::max_element(of.begin(), of.end())) + 1;
    if (named != o.clients)
      throw std::invalid_argument("the data assigns its training examples to " + std::to_string(named) +
                                  " clients (client_train): run with --clients " + std::to_string(named));
    e.part = partition_assigned(validation_from > 0 ? e.data->client_train.slice(0, static_cast<std::int64_t>(validation_from))
                                                    : e.data->client_train,
                                o.clients);
  } else {
    e.part = make_partition(o.partition, labels, o.clients, derive_seed(o.seed, stream_partition));
  }

  // --eval-clients: each client's held-out rows leave its training shard before anything reads it.
  if (o.eval_clients) e.holdout = hold_out(e.part, 0.2, derive_seed(o.seed, stream_holdout));

  if (is_fedgen(o.strategy)) {
    if (custom || !e.data) throw std::invalid_argument("--strategy fedgen needs the built-in mlp trainer and its data");
    e.strategy = make_fedgen(e, o);
  }

  impl_->sample_size = o.fraction > 0 ? std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(o.fraction * o.clients)),
                                                                std::max<std::size_t>(1, o.min_per_round), o.clients)
                                      : std::max(o.per_round, o.min_per_round);
  impl_->keep = impl_->sample_size;
  if (o.over_select > 0)
    impl_->sample_size = std::min<std::size_t>(
        o.clients, static_cast<std::size_t>(std::ceil(static_cast<double>(impl_->sample_size) * (1 + o.over_select))));
  if (!o.contribution.empty() && parse_contribution(o.contribution).type == contribution_method::kind::exact &&
      impl_->keep > max_exact_players)
    throw std::invalid_argument("--contribution exact enumerates all 2^K coalitions: K = " + std::to_string(impl_->keep) +
                                " clients per round is more than " + std::to_string(max_exact_players) +
                                "; use mc:P or gtg:EPS, or fewer --per-round");
  e.rule = e.strategy->rule();
  e.stateful_optimizer = o.client_optimizer != "sgd";
  e.detect_drift = !o.drift_detect.empty();
  e.reset_on_alarm = o.drift_response == "reset";
  e.cluster_on_alarm = o.drift_response == "cluster";
  if (!o.drift.empty()) {
    const drift_swap d = parse_drift(o.drift);
    impl_->drifted = drifted_clients(d, o.clients, o.seed);
    impl_->drift_round = d.round;
  }
  if (e.cluster_on_alarm) impl_->cluster.resize(o.clients);
  if (o.device != "cpu" && (e.rule.proximal_mu > 0 || e.rule.control_variates))
    throw std::invalid_argument("--device " + o.device + " with --strategy " + o.strategy +
                                ": its gradient terms are added on the host; use --device cpu");
  e.latency = parse_latency(o.latency);
  impl_->buffer = parse_async(o.async);
  if (impl_->buffer && e.rule.control_variates)
    throw std::invalid_argument("--async with scaffold is not supported: its control variates assume synchronous rounds");
  // SCAFFOLD's server control variate is the mean of the clients' (Karimireddy et al.): each
  // client adds its c_i+ - c_i to c_i, so an update clipped, noised or compressed on its way
  // leaves the server's c off that mean for good. Secure aggregation only clamps coordinates,
  // as the client can itself.
  if (e.rule.control_variates && (o.dp_clip != 0 || o.dp_noise != 0 || o.dp_adaptive || !o.compress.empty()))
    throw std::invalid_argument(
        "scaffold with --dp-* or --compress is not supported: its server control variate must stay the mean of the "
        "clients', and those change the update on its way");
  if (e.rule.control_variates && o.secagg) e.control_bound = secagg_options{}.clip;

  auto global = std::make_shared<std::vector<float>>(e.dim);
  impl_->server_trainer->initialize(*global, derive_seed(o.seed, stream_model));
  if (o.eval_clients) {
    try {
      (void)impl_->server_trainer->evaluate_rows(*global, {});
    } catch (const std::logic_error&) {
      throw std::invalid_argument("--eval-clients: this trainer does not measure accuracy on the clients' examples");
    }
  }
  impl_->global = std::move(global);

  impl_->system = std::make_unique<actor_system>(system_config{.threads = o.threads});
  unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const std::size_t update_bytes = e.strategy->update_floats(e.dim) * sizeof(float);
  impl_->window = o.window ? o.window
                           : std::clamp<std::size_t>((16u << 20) / std::max<std::size_t>(1, update_bytes),
                                                     4 * static_cast<std::size_t>(threads), 256);
  impl_->clients.reserve(o.clients);
  for (std::size_t c = 0; c < o.clients; ++c)
    impl_->clients.push_back(impl_->system->spawn<client>(e.part.offsets[c], e.part.offsets[c + 1] - e.part.offsets[c],
                                                          derive_seed(o.seed, stream_client + c)));
  if (!o.excluded.empty()) exclude_clients(o.excluded);
  install_mechanisms(*this, o, client_weight_bounds(e, impl_->keep));
  if (!o.contribution.empty()) impl_->contributions = make_contribution_tracker(e, custom, validation_from);
  if (impl_->buffer) check_async_mechanisms(o, impl_->keep, impl_->buffer);
  impl_->hold = impl_->buffer && (o.dp_clip != 0 || o.dp_noise != 0);
}

simulation::~simulation() {
  if (!impl_) return;
  for (auto& f : impl_->flight) {  // FedBuff's clients in flight finish before the actors stop
    if (!f.reply.valid()) continue;
    try {
      (void)f.reply.get();
    } catch (...) {
    }
  }
  impl_->flight.clear();
  if (impl_->system) impl_->system->shutdown();
}

void simulation::set_strategy(std::unique_ptr<server_strategy> strategy) {
  if (impl_->rounds > 0) throw std::logic_error("set_strategy after the first round");
  if (!strategy) throw std::invalid_argument("set_strategy: null strategy");
  if (impl_->buffer && strategy->rule().control_variates)
    throw std::invalid_argument("--async with control variates (scaffold) is not supported");
  impl_->engine.strategy = std::move(strategy);
  impl_->engine.rule = impl_->engine.strategy->rule();
}

void simulation::set_aggregator(std::unique_ptr<aggregator> aggregator) {
  if (!aggregator) throw std::invalid_argument("set_aggregator: null aggregator");
  impl_->agg = std::move(aggregator);
  impl_->custom_aggregator = true;
}

void simulation::add_transform(std::unique_ptr<update_transform> transform) {
  if (impl_->rounds > 0) throw std::logic_error("add_transform after the first round");
  if (!transform) throw std::invalid_argument("add_transform: null transform");
  impl_->engine.transforms.push_back(std::move(transform));
}

std::vector<std::uint64_t> simulation::sample(int round) const {
  const std::uint64_t n = impl_->clients.size(), k = impl_->sample_size;
  std::vector<std::uint64_t> out;
  out.reserve(k);
  // Excluded clients are drawn as before and then left out: the other clients' draws, and so
  // every other seeded choice of the round, stay those of a run without exclusions.
  const auto& excluded = impl_->excluded;
  const auto drop_excluded = [&] {
    if (!excluded.empty()) std::erase_if(out, [&](std::uint64_t c) { return excluded[c] != 0; });
  };
  if (k >= n) {
    for (std::uint64_t c = 0; c < n; ++c) out.push_back(c);
    drop_excluded();
    return out;
  }
  // Floyd's algorithm: k distinct clients with k draws, whatever the population.
  splitmix64 g{derive_seed(impl_->engine.options.seed, stream_sample + static_cast<std::uint64_t>(round))};
  std::unordered_set<std::uint64_t> chosen;
  chosen.reserve(k * 2);
  for (std::uint64_t j = n - k; j < n; ++j) {
    const std::uint64_t t = g.below(j + 1);
    chosen.insert(chosen.count(t) ? j : t);
  }
  out.assign(chosen.begin(), chosen.end());
  std::sort(out.begin(), out.end());
  drop_excluded();
  return out;
}

void simulation::exclude_clients(std::span<const std::uint64_t> clients) {
  const std::size_t n = impl_->clients.size();
  for (auto c : clients)
    if (c >= n)
      throw std::invalid_argument("client " + std::to_string(c) + " is not in the population of " + std::to_string(n) +
                                  " (clients 0 to " + std::to_string(n - 1) + ")");
  if (impl_->excluded.empty()) impl_->excluded.assign(n, 0);
  for (auto c : clients) impl_->excluded[c] = 1;
}

void simulation::set_global_model(std::span<const float> model) {
  if (model.size() != impl_->engine.dim)
    throw std::invalid_argument("set_global_model: a model of " + std::to_string(model.size()) + " floats; this one has " +
                                std::to_string(impl_->engine.dim));
  impl_->global = std::make_shared<const std::vector<float>>(model.begin(), model.end());
}

std::span<const std::uint32_t> simulation::client_rows(std::uint64_t client) const {
  return impl_->engine.part.shard(client);
}

const shared_data& simulation::data() const noexcept { return impl_->engine.data; }

local_trainer& simulation::server_trainer() noexcept { return *impl_->server_trainer; }

double simulation::simulated_latency(std::uint64_t client, int round) const {
  const auto& o = impl_->engine.options;
  splitmix64 fault{derive_seed(derive_seed(o.seed, stream_fault + static_cast<std::uint64_t>(round)), client)};
  if (fault.uniform01() < o.dropout) return -1;
  return work_seconds(impl_->engine, client, fault);
}

std::vector<std::uint64_t> simulation::participants(int round, round_report* report) const {
  const auto& o = impl_->engine.options;
  const auto sampled = sample(round);
  round_report local;
  round_report& r = report ? *report : local;
  r.sampled = sampled.size();
  if (report) report->sampled_clients = sampled;
  r.dropped = r.late = 0;
  const bool timed = o.dropout > 0 || o.deadline > 0 || o.over_select > 0;
  if (!timed) {  // every sampled client is kept: the round lasts as long as the slowest
    r.simulated_seconds = 0;
    for (auto c : sampled) r.simulated_seconds = std::max(r.simulated_seconds, simulated_latency(c, round));
    return sampled;
  }
  std::vector<std::pair<double, std::uint64_t>> arrived;
  for (auto c : sampled) {
    const double t = simulated_latency(c, round);
    if (t < 0)
      ++r.dropped;
    else if (o.deadline > 0 && t > o.deadline)
      ++r.late;
    else
      arrived.emplace_back(t, c);
  }
  std::sort(arrived.begin(), arrived.end());
  if (arrived.size() > impl_->keep) arrived.resize(impl_->keep);
  // The server waits for the last kept update, or until the deadline when some never come.
  const bool short_of = arrived.size() < impl_->keep;
  r.simulated_seconds = short_of && o.deadline > 0 ? o.deadline : arrived.empty() ? 0.0 : arrived.back().first;
  std::vector<std::uint64_t> out;
  for (const auto& [t, c] : arrived) out.push_back(c);
  std::sort(out.begin(), out.end());
  return out;
}

round_report simulation::run_round() {
  auto& e = impl_->engine;
  const auto t0 = clock_type::now();
  if (impl_->rounds == 0) size_client_state(e);
  if (impl_->buffer) {
    const int async_round = impl_->rounds + 1;
    round_report r = impl_->async_round(async_round);
    impl_->rounds = async_round;
    r.seconds = since(t0);
    return r;
  }
  const int round = ++impl_->rounds;
  if (impl_->continual) continual_begin_round(*impl_->continual, round);
  auto ctx = std::make_shared<round_context>();
  ctx->engine = &e;
  ctx->global = impl_->global;
  const auto control = e.strategy->control();
  if (e.rule.control_variates) {
    ctx->control.assign(control.begin(), control.end());
    ctx->control.resize(e.dim, 0.0f);
  }
  if (const double weight = e.strategy->generator_weight(round); weight > 0) {
    const auto g = e.strategy->generator();
    ctx->generator.assign(g.begin(), g.end());
    ctx->generator_weight = weight;
  }
  if (e.cluster_on_alarm) {
    ctx->second = impl_->cluster.model();
    ctx->cluster = &impl_->cluster.members();
    impl_->cluster.begin(e.dim);
  }
  round_report r;
  ctx->participants = participants(round, &r);
  ctx->info.round = round;
  ctx->info.dim = e.strategy->update_floats(e.dim);
  ctx->info.population = impl_->clients.size();
  ctx->info.participants = ctx->participants;
  ctx->info.global = *ctx->global;
  ctx->info.seed = derive_seed(e.options.seed, stream_sample + static_cast<std::uint64_t>(round) + (1ull << 31));
  ctx->provisional = e.state_floats > 0 || e.stateful_optimizer;
  std::shared_ptr<const round_context> shared = ctx;

  // Asks go out through a window; replies are added in sample order, so the sum is the same
  // whatever order the workers finish in, and at most `window` updates exist at once.
  if (impl_->contributions) impl_->contributions->begin(round);
  try {
    impl_->agg->begin(ctx->info);
  } catch (const round_aborted& e) {
    r.aborted = e.what();  // before any client trains: nobody is asked
  }
  const auto& who = ctx->participants;
  std::deque<future<client_update>> pending;
  std::size_t sent = 0;
  double loss = 0;
  std::int64_t samples = 0;
  const std::size_t asked = r.aborted.empty() ? who.size() : 0;
  std::size_t first_model = 0;  // updates for the first model (all but the second model's)
  for (std::size_t added = 0; added < asked; ++added) {
    while (sent < asked && sent - added < impl_->window) {
      pending.push_back(impl_->clients[who[sent]].ask(&client::train, shared, who[sent]));
      ++sent;
    }
    client_update u = pending.front().get();
    pending.pop_front();
    try {
      check_finite(u, "round " + std::to_string(round));
    } catch (...) {  // the asks still out finish first: the run ends with no message left behind
      for (auto& p : pending) {
        try {
          (void)p.get();
        } catch (...) {
        }
      }
      throw;
    }
    if (u.drift_alarm) r.drift_alarms.push_back(u.client);
    if (e.cluster_on_alarm && impl_->cluster.takes(u)) {  // the second model's
      impl_->cluster.add(u, *ctx->global);
    } else if (!u.words.empty()) {
      if (e.strategy->observes() || impl_->contributions)
        throw std::logic_error((impl_->contributions ? std::string("--contribution") : "strategy " + e.strategy->name()) +
                               " observes plain updates; this one is encoded");
      impl_->agg->add_encoded(u.client, u.weight, u.words);
    } else {
      impl_->agg->add(u.client, u.weight, u.delta);
      if (e.strategy->observes()) e.strategy->observe(u.client, u.weight, u.delta);
      if (impl_->contributions) impl_->contributions->observe(u.client, u.weight, u.delta);
      ++first_model;
    }
    loss += u.loss * static_cast<double>(u.samples);
    samples += u.samples;
    r.uplink_bytes += uplink_bytes(u);
    e.give_back(std::move(u.delta));
    e.give_back(std::move(u.words));
  }
  if (e.cluster_on_alarm) {
    impl_->cluster.finish(*ctx->global, e.options.server.server_lr > 0 ? e.options.server.server_lr : 1.0);
  }
  if (asked > 0 && (!e.cluster_on_alarm || first_model > 0)) {  // a round where every client failed leaves the model as it was
    try {
      std::vector<float> aggregate = impl_->agg->finish();
      auto next = std::make_shared<std::vector<float>>(*impl_->global);
      e.strategy->apply(*next, aggregate, ctx->info);
      const auto start = std::exchange(impl_->global, std::move(next));
      // The round's participants valued against the model they trained from (a round given up
      // is not valued: its updates were not applied).
      if (impl_->contributions) impl_->contributions->finish(*start);
    } catch (const round_aborted& e) {
      r.aborted = e.what();
    }
    r.rejected = impl_->agg->rejected();
    // A robust filter's left-out updates, counted by whether --attack made their client malicious.
    if (const auto* f = dynamic_cast<const detail::filtering_aggregator*>(impl_->agg.get()); f && r.aborted.empty()) {
      double honest = 0, malicious = 0;
      for (const auto c : f->filtered()) (is_attacker(e.options, c) ? malicious : honest) += 1;
      r.metrics.emplace_back("filtered_honest", honest);
      r.metrics.emplace_back("filtered_malicious", malicious);
    }
    // (Told before anything else is asked of them: the next round's train, a checkpoint's save.)
    if (ctx->provisional)
      for (std::size_t i = 0; i < asked; ++i) impl_->clients[who[i]].tell(&client::settle, shared, r.aborted.empty());
  }

  if (impl_->continual) {  // a task's end: its consolidation, from the clients of its last round
    const std::uint64_t bytes =
        continual_end_round(*impl_->continual, *impl_->server_trainer, e.part, r.aborted.empty() ? who : std::vector<std::uint64_t>{},
                            *impl_->global, round);
    if (bytes > 0) {
      r.uplink_bytes += bytes;
      r.metrics.emplace_back("consolidation_bytes", static_cast<double>(bytes));
    }
  }
  r.round = round;
  r.participants = r.aborted.empty() ? who.size() - r.rejected.size() : 0;
  if (!r.aborted.empty()) r.metrics.emplace_back("aborted", 1.0);
  r.train_loss = samples ? loss / static_cast<double>(samples) : 0.0;
  for (auto& t : e.transforms) t->end_round(ctx->info, r.metrics);
  impl_->clock += r.simulated_seconds;
  r.seconds = since(t0);
  return r;
}

evaluation simulation::evaluate() {
  evaluation ev = impl_->server_trainer->evaluate(*impl_->global);
  const auto& e = impl_->engine;
  if (e.options.eval_clients) {
    // The global model on each client's held-out rows: one forward pass over 20% of the
    // training set in all, as cheap as a test-set evaluation of that size.
    std::vector<double> accuracies(e.holdout.clients(), std::nan(""));
    for (std::size_t c = 0; c < accuracies.size(); ++c)
      if (const auto rows = e.holdout.shard(c); !rows.empty())
        accuracies[c] = impl_->server_trainer->evaluate_rows(*impl_->global, rows).accuracy;
    const auto s = summarize_client_accuracies(accuracies);
    ev.metrics.emplace_back("client_accuracy_mean", s.mean);
    ev.metrics.emplace_back("client_accuracy_std", s.std);
    ev.metrics.emplace_back("client_accuracy_worst10", s.worst10);
    ev.metrics.emplace_back("client_accuracy_best10", s.best10);
    ev.metrics.emplace_back("client_accuracy_clients", static_cast<double>(s.clients));
  }
    if (impl_->drifted.empty() && !impl_->engine.cluster_on_alarm) return ev;
  // The accuracy each client's model has on its current task: the drifted clients' is the test
  // set with the labels swapped from the drift's round on; a client moved to the second model is
  // served that one.
  auto take_swapped = [](evaluation& x) {
    double swapped = std::numeric_limits<double>::quiet_NaN();
    for (auto it = x.metrics.begin(); it != x.metrics.end(); ++it)
      if (it->first == "swapped_accuracy") {
        swapped = it->second;
        x.metrics.erase(it);
        break;
      }
    return swapped;
  };
  const double swapped = take_swapped(ev);
  double second = 0, second_swapped = 0;
  const auto& model2 = impl_->cluster.model();
  if (model2) {
    evaluation e2 = impl_->server_trainer->evaluate(*model2);
    second = e2.accuracy;
    second_swapped = take_swapped(e2);
  }
  const std::vector<char>& member = impl_->cluster.members();
  const bool after = !impl_->drifted.empty() && impl_->rounds >= impl_->drift_round;
  double drifted_sum = 0, stable_sum = 0;
  std::size_t drifted_n = 0, stable_n = 0;
  for (std::size_t c = 0; c < impl_->clients.size(); ++c) {
    const bool in_second = model2 && member[c];
    if (!impl_->drifted.empty() && impl_->drifted[c]) {
      drifted_sum += after ? (in_second ? second_swapped : swapped) : (in_second ? second : ev.accuracy);
      ++drifted_n;
    } else {
      stable_sum += in_second ? second : ev.accuracy;
      ++stable_n;
    }
  }
  if (drifted_n) ev.metrics.emplace_back("drifted_accuracy", drifted_sum / static_cast<double>(drifted_n));
  if (stable_n) ev.metrics.emplace_back("stable_accuracy", stable_sum / static_cast<double>(stable_n));
  if (impl_->engine.cluster_on_alarm) ev.metrics.emplace_back("second_model_clients", static_cast<double>(impl_->cluster.size()));
  return ev;
}
const std::vector<char>& simulation::drift_cluster() const noexcept { return impl_->cluster.members(); }
const std::vector<char>& simulation::drifted() const noexcept { return impl_->drifted; }
int simulation::rounds_done() const noexcept { return impl_->rounds; }
std::span<const float> simulation::global_model() const noexcept { return *impl_->global; }
std::size_t simulation::population() const noexcept { return impl_->clients.size(); }
std::size_t simulation::sample_size() const noexcept { return impl_->sample_size; }
std::size_t simulation::buffer_size() const noexcept { return impl_->buffer; }
std::size_t simulation::cohort_size() const noexcept { return impl_->keep; }
std::size_t simulation::client_state_bytes() const noexcept { return impl_->engine.state_bytes.load(); }
std::size_t simulation::clients_with_state() const noexcept { return impl_->engine.state_holders.load(); }
double simulation::simulated_seconds() const noexcept { return impl_->clock; }
const contribution_tracker* simulation::contributions() const noexcept { return impl_->contributions.get(); }

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

summary run_simulation(const simulation_options& options, const std::function<void(const progress&)>& report) {
  if (!options.unlearn.empty()) return run_unlearning(options, report);
  const auto start = clock_type::now();
  if (options.checkpoint_every < 0) throw std::invalid_argument("--checkpoint-every must be >= 0");
  simulation sim(options);
  summary s;
  std::string file;
  if (!options.checkpoint.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.checkpoint, ec);
    if (ec) throw std::runtime_error("cannot create the checkpoint directory " + options.checkpoint + ": " + ec.message());
    file = (std::filesystem::path(options.checkpoint) / "fedsim.ckpt").string();
    try {  // writable now, or refused before any round runs (not after the last one)
      check_writable(file);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("cannot write the checkpoint " + file + ": " + e.what());
    }
    if (std::filesystem::exists(file)) {
      sim.load_checkpoint(file);
      s.resumed_from = sim.rounds_done();
      if (s.resumed_from > options.rounds)
        throw std::invalid_argument("the checkpoint in " + options.checkpoint + " is at round " +
                                    std::to_string(s.resumed_from) + ", past --rounds " + std::to_string(options.rounds) +
                                    " (raise --rounds to go on, or name another --checkpoint directory)");
    }
  }
  if (!options.contributions_file.empty()) {
    try {  // writable now, or refused before any round runs
      check_writable(options.contributions_file);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("cannot write the --contributions file " + options.contributions_file + ": " + e.what());
    }
  }
  double round_seconds = 0;
  double filtered_honest = 0, filtered_malicious = 0;  // a robust filter's left-out updates
  int filtered_rounds = 0;
  bool evaluated = false;
  const int first = sim.rounds_done() + 1;
  const int task_rounds = continual_task_rounds(options);
  const int tasks = task_rounds > 0 ? parse_continual(options.continual).tasks : 0;
  auto task_accuracy = [](const evaluation& ev, int task) {  // task: 1-based
    const std::string name = "task_" + std::to_string(task) + "_accuracy";
    for (const auto& [n, v] : ev.metrics)
      if (n == name) return v;
    throw std::logic_error("run_simulation: the evaluation reports no " + name);
  };
  for (int r = first; r <= options.rounds; ++r) {
    const round_report rr = sim.run_round();
    round_seconds += rr.seconds;
    // A run that diverged (too large a learning rate, an attack or noise far beyond the model's
    // scale) has nothing worth going on with or saving: stop before the checkpoint, so that the
    // last one written can still be resumed.
    {
      const auto model = sim.global_model();
      if (!all_finite(model))
        throw std::runtime_error("round " + std::to_string(r) +
                                 " diverged: the model is no longer finite (lower --lr or --server-lr, or check the "
                                 "attack and noise settings)" +
                                 (file.empty() ? "" : "; the checkpoint keeps the last finite round"));
      if (!std::isfinite(sim.simulated_seconds()))
        throw std::runtime_error("round " + std::to_string(r) + ": the simulated clock is no longer finite (lower --latency)");
    }
    progress p;
    p.round = &rr;
    p.rounds = options.rounds;
    // --continual: every task's last round is evaluated too (its accuracy right after training).
    const bool task_end = task_rounds > 0 && r % task_rounds == 0 && r / task_rounds <= tasks;
    if (r % options.eval_every == 0 || r == options.rounds || task_end) {
      p.evaluated = evaluated = true;
      p.eval = sim.evaluate();
      s.final_accuracy = p.eval.accuracy;
      s.final_loss = p.eval.loss;
      s.final_metrics = p.eval.metrics;
      if (task_end) s.task_accuracy_after.push_back(task_accuracy(p.eval, r / task_rounds));
    }
    // Saved before the round is reported: what was reported survives a crash. A save counts as
    // round time: under FedBuff it waits for the clients in flight, training that the next
    // rounds would otherwise have waited for.
    if (!file.empty() && (options.checkpoint_every > 0 ? r % options.checkpoint_every == 0 || r == options.rounds : p.evaluated)) {
      const auto t0 = clock_type::now();
      sim.save_checkpoint(file);
      round_seconds += since(t0);
    }
    p.rounds_per_s = (r - first + 1) / round_seconds;
    p.seconds = since(start);
    p.simulated_seconds = sim.simulated_seconds();
    s.uplink_bytes += rr.uplink_bytes;
    for (const auto& [name, value] : rr.metrics) {
      if (name == "consolidation_bytes") s.consolidation_bytes += static_cast<std::uint64_t>(value);
      if (name == "filtered_honest") {
        filtered_honest += value;
        ++filtered_rounds;
      }
      if (name == "filtered_malicious") filtered_malicious += value;
    }
    if (!rr.drift_alarms.empty()) s.drift_alarms.emplace_back(rr.round, rr.drift_alarms);
    if (!rr.rejected.empty()) s.rejected_clients.emplace_back(rr.round, rr.rejected);
    p.uplink_bytes = s.uplink_bytes;
    if (report) report(p);
  }
  if (!evaluated) {  // resumed at or past the last round
    const auto ev = sim.evaluate();
    s.final_accuracy = ev.accuracy;
    s.final_loss = ev.loss;
    s.final_metrics = ev.metrics;
  }
  if (filtered_rounds > 0) {
    s.final_metrics.emplace_back("filtered_honest_per_round", filtered_honest / filtered_rounds);
    s.final_metrics.emplace_back("filtered_malicious_per_round", filtered_malicious / filtered_rounds);
  }
  const auto model = sim.global_model();
  s.model_crc32 = troupe::crc32(std::as_bytes(model));
  s.rounds = sim.rounds_done();
  s.rounds_per_s = round_seconds > 0 ? (s.rounds - first + 1) / round_seconds : 0.0;
  s.seconds = since(start);
  s.peak_rss_mb = peak_rss_mb();
  if (const auto* t = sim.contributions()) {
    summarize_contributions(*t, options, s);
    if (!options.contributions_file.empty())
      t->write_csv(options.contributions_file, [&options](std::uint64_t c) { return is_attacker(options, c); });
  }
  for (std::size_t c = 0; c < sim.drifted().size(); ++c)
    if (sim.drifted()[c]) s.drifted_clients.push_back(c);
  if (tasks > 0 && static_cast<int>(s.task_accuracy_after.size()) == tasks) {
    evaluation last;
    last.metrics = s.final_metrics;
    for (int t = 1; t <= tasks; ++t) s.task_accuracy_final.push_back(task_accuracy(last, t));
    const auto scores = score_tasks(s.task_accuracy_after, s.task_accuracy_final);
    s.acc = scores.acc;
    s.bwt = scores.bwt;
  }
  if (sim.clients_with_state() > 0)
    s.state_bytes_per_client = static_cast<double>(sim.client_state_bytes()) / static_cast<double>(sim.clients_with_state());
  return s;
}

}  // namespace troupe::federated
