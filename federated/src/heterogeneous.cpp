// Clients of different architectures (--client-models): FedAvg within each architecture, FedDF
// and FedMD (see distillation.hpp). Each client is an actor holding its shard, its generator and,
// under FedMD, its own model; the worker threads keep one trainer per architecture.

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "engine.hpp"
#include "troupe/actors/actor_system.hpp"
#include "troupe/federated/distillation.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {

using namespace detail;

namespace {

inline constexpr std::uint64_t stream_public = 10;  // the public subsets and proxy batches

enum class kd_kind { fedavg, feddf, fedmd };

/// Normalized features of `rows` examples of `set` into out (as the trainers normalize them).
void features(const labelled_data& data, const dataset& set, const std::uint32_t* rows, std::size_t n, std::vector<float>& out) {
  const std::size_t d = static_cast<std::size_t>(set.images.numel() / std::max<std::int64_t>(1, set.size()));
  out.resize(n * d);
  if (set.images.type() == dtype::f32) {
    const float* src = set.images.data<float>().data();
    for (std::size_t i = 0; i < n; ++i) std::copy_n(src + static_cast<std::size_t>(rows[i]) * d, d, out.data() + i * d);
    return;
  }
  const std::uint8_t* src = set.images.data<std::uint8_t>().data();
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < d; ++k)
      out[i * d + k] = (static_cast<float>(src[static_cast<std::size_t>(rows[i]) * d + k]) / 255.0f - data.mean) / data.stddev;
}

struct kd_engine;

/// What the clients read in a round.
struct kd_round {
  kd_engine* engine = nullptr;
  std::vector<std::vector<float>> globals;  // per architecture (fedavg, feddf)
  std::vector<float> public_x;              // fedmd: the round's public subset (features)
  std::vector<float> consensus;             // fedmd: its consensus logits
  int rows = 0;
};

struct kd_result {
  std::vector<float> values;  // the trained model (fedavg, feddf) or logits (fedmd)
  double loss = 0;
  std::int64_t samples = 0;
};

struct kd_worker {
  std::vector<std::unique_ptr<local_trainer>> trainers;    // per architecture
  std::vector<std::unique_ptr<distiller>> distillers;      // per architecture (fedmd's digest)
};

struct kd_engine {
  simulation_options options;
  std::vector<std::string> models;
  std::vector<std::size_t> dims;
  kd_kind kind = kd_kind::fedavg;
  shared_data data;
  partition part;
  std::vector<std::uint32_t> public_rows;  // indices into the training set
  std::int64_t inputs = 0;
  std::mutex mutex;
  std::map<std::thread::id, std::unique_ptr<kd_worker>> workers;

  kd_worker& worker() {
    std::lock_guard lock(mutex);
    auto& w = workers[std::this_thread::get_id()];
    if (!w) {
      w = std::make_unique<kd_worker>();
      for (const auto& spec : models) {
        simulation_options o = options;
        o.model = spec;
        o.strategy = "fedavg";
        w->trainers.push_back(make_trainer_factory(o)(data));
        w->distillers.push_back(std::make_unique<distiller>(spec, inputs, 1e-3));
      }
    }
    return *w;
  }
};

/// A client: its shard, generator, architecture and (fedmd) its own model.
class kd_client {
public:
  kd_client(std::uint32_t offset, std::uint32_t length, std::size_t arch, std::uint64_t seed)
      : offset_(offset), length_(length), arch_(arch), rng_{seed} {}

  /// fedavg, feddf: trains the round's model of its architecture and returns it.
  kd_result train(const std::shared_ptr<const kd_round>& ctx) {
    kd_engine& e = *ctx->engine;
    kd_result r;
    r.values = ctx->globals[arch_];
    (void)local(e, r.values, shard(e), r);
    return r;
  }
  /// fedmd, before the first round: its own model, trained on the public set, then on its data.
  kd_result transfer(const std::shared_ptr<const kd_round>& ctx, std::uint64_t seed) {
    kd_engine& e = *ctx->engine;
    own_.resize(e.dims[arch_]);
    e.worker().trainers[arch_]->initialize(own_, seed);
    kd_result r;
    (void)local(e, own_, e.public_rows, r);
    (void)local(e, own_, shard(e), r);
    return r;
  }
  /// fedmd: its logits on the round's public subset.
  kd_result communicate(const std::shared_ptr<const kd_round>& ctx) {
    kd_engine& e = *ctx->engine;
    distiller& d = *e.worker().distillers[arch_];
    d.load(own_);
    kd_result r;
    d.logits(ctx->public_x.data(), ctx->rows, r.values);
    return r;
  }
  /// fedmd: digest (L1 towards the consensus on the public subset, one pass of --batch rows),
  /// then revisit its own data.
  kd_result digest(const std::shared_ptr<const kd_round>& ctx) {
    kd_engine& e = *ctx->engine;
    distiller& d = *e.worker().distillers[arch_];
    d.load(own_);
    d.reset();
    const int batch = e.options.batch, classes = d.classes();
    const std::size_t inputs = static_cast<std::size_t>(e.inputs);
    for (int s = 0; s < ctx->rows; s += batch) {
      const int rows = std::min(batch, ctx->rows - s);
      (void)d.step(ctx->public_x.data() + static_cast<std::size_t>(s) * inputs,
                   ctx->consensus.data() + static_cast<std::size_t>(s) * classes, rows, distiller::loss::l1);
    }
    d.store(own_);
    kd_result r;
    (void)local(e, own_, shard(e), r);
    return r;
  }
  /// fedmd: its own model's test accuracy.
  double accuracy(const std::shared_ptr<const kd_round>& ctx) {
    return ctx->engine->worker().trainers[arch_]->evaluate(own_).accuracy;
  }
  std::size_t arch() const noexcept { return arch_; }

private:
  std::span<const std::uint32_t> shard(const kd_engine& e) const { return {e.part.indices.data() + offset_, length_}; }
  bool local(kd_engine& e, std::vector<float>& model, std::span<const std::uint32_t> rows, kd_result& r) {
    local_job job;
    job.global = model;
    job.shard = rows;
    job.epochs = e.options.local_epochs;
    job.steps = e.options.local_steps;
    job.batch = e.options.batch;
    job.lr = e.options.lr;
    const local_result l = e.worker().trainers[arch_]->train(job, model, rng_);
    if (l.skipped > 0 || !std::all_of(model.begin(), model.end(), [](float v) { return std::isfinite(v); }))
      throw std::runtime_error("a client's training diverged (lower --lr)");
    r.loss += l.loss * static_cast<double>(l.samples);
    r.samples += l.samples;
    return true;
  }

  std::uint32_t offset_, length_;
  std::size_t arch_;
  splitmix64 rng_;
  std::vector<float> own_;  // fedmd
};

kd_kind parse_kind(const std::string& strategy) {
  if (strategy == "fedavg") return kd_kind::fedavg;
  if (strategy == "feddf") return kd_kind::feddf;
  if (strategy == "fedmd") return kd_kind::fedmd;
  throw std::invalid_argument("--client-models trains with --strategy fedavg (within each architecture), feddf or fedmd, not '" +
                              strategy + "'");
}

void check_heterogeneous(const simulation_options& o) {
  auto refuse = [](const std::string& what) {
    throw std::invalid_argument("--client-models with " + what + " is not supported: the clients' models differ");
  };
  if (o.secagg) refuse("--secagg");
  if (o.dp_clip != 0 || o.dp_noise != 0 || o.dp_adaptive) refuse("--dp-*");
  if (!o.compress.empty()) refuse("--compress");
  if (!o.attack.empty()) refuse("--attack");
  if (!o.async.empty()) refuse("--async");
  if (o.eval_clients) refuse("--eval-clients");
  if (!o.checkpoint.empty()) refuse("--checkpoint");
  if (o.device != "cpu") refuse("--device " + o.device);
  if (o.client_optimizer != "sgd") refuse("--client-optimizer " + o.client_optimizer);
  if (o.trainer != "mlp") refuse("--trainer " + o.trainer);
  if (o.dropout > 0 || o.deadline > 0 || o.over_select > 0) refuse("--dropout, --deadline or --over-select");
  if (!o.finetune_from.empty() || !o.shift.empty() || !o.lora.empty()) refuse("--finetune-from, --shift or --lora");
  if (o.public_examples < 1) throw std::invalid_argument("--public must be at least 1 (the server's held-out examples)");
  if (o.distill_steps < 0) throw std::invalid_argument("--distill-steps must be at least 0");
}

}  // namespace

heterogeneous_summary run_heterogeneous(const simulation_options& options, const std::vector<std::string>& models,
                                        const std::function<void(const heterogeneous_progress&)>& report, shared_data data) {
  const auto start = clock_type::now();
  check_options(options);
  check_heterogeneous(options);
  if (models.empty()) throw std::invalid_argument("--client-models: no model");
  auto e = std::make_unique<kd_engine>();
  e->options = options;
  e->models = models;
  e->kind = parse_kind(options.strategy);
  for (const auto& m : models) (void)make_model(m);  // a bad description fails before the data loads
  e->data = data ? std::move(data) : load_data(options);
  if (e->data->client_train.defined())
    throw std::invalid_argument("--client-models: the data's own partition (client_train) cannot be used: the server holds out "
                                "public examples; use data without client_train");
  const std::int64_t n = e->data->train.size();
  if (static_cast<std::int64_t>(options.public_examples) >= n)
    throw std::invalid_argument("--public " + std::to_string(options.public_examples) + " leaves no training examples of the " +
                                std::to_string(n));
  const std::int64_t kept = n - static_cast<std::int64_t>(options.public_examples);
  e->inputs = e->data->train.images.numel() / n;
  for (std::int64_t i = kept; i < n; ++i) e->public_rows.push_back(static_cast<std::uint32_t>(i));
  e->part = make_partition(options.partition, e->data->train.labels.slice(0, kept), options.clients,
                           derive_seed(options.seed, stream_partition));
  auto& server = e->worker();  // also checks every model against the data
  for (auto& t : server.trainers) e->dims.push_back(t->dim());

  std::vector<std::vector<float>> globals(models.size());
  for (std::size_t g = 0; g < models.size(); ++g) {
    globals[g].resize(e->dims[g]);
    server.trainers[g]->initialize(globals[g], derive_seed(options.seed, stream_model + 100 * g));
  }
  actor_system system(system_config{.threads = options.threads});
  std::vector<actor_ref<kd_client>> clients;
  for (std::size_t c = 0; c < options.clients; ++c)
    clients.push_back(system.spawn<kd_client>(e->part.offsets[c], e->part.offsets[c + 1] - e->part.offsets[c], c % models.size(),
                                              derive_seed(options.seed, stream_client + c)));
  const std::size_t per_round = std::min(options.per_round, options.clients);

  auto evaluate = [&](const std::shared_ptr<const kd_round>& ctx) {
    std::vector<double> acc(models.size(), 0.0);
    if (e->kind != kd_kind::fedmd) {
      for (std::size_t g = 0; g < models.size(); ++g) acc[g] = server.trainers[g]->evaluate(globals[g]).accuracy;
      return acc;
    }
    std::vector<double> count(models.size(), 0.0);
    std::vector<future<double>> f;
    for (auto& c : clients) f.push_back(c.ask(&kd_client::accuracy, ctx));
    for (std::size_t c = 0; c < clients.size(); ++c) {
      acc[c % models.size()] += f[c].get();
      ++count[c % models.size()];
    }
    for (std::size_t g = 0; g < models.size(); ++g) acc[g] = count[g] > 0 ? acc[g] / count[g] : std::nan("");
    return acc;
  };

  if (e->kind == kd_kind::fedmd) {  // transfer learning
    auto ctx = std::make_shared<kd_round>();
    ctx->engine = e.get();
    std::vector<future<kd_result>> f;
    for (std::size_t c = 0; c < clients.size(); ++c)
      f.push_back(clients[c].ask(&kd_client::transfer, std::shared_ptr<const kd_round>(ctx),
                                 derive_seed(options.seed, stream_model + 100 * (c % models.size()))));
    for (auto& x : f) (void)x.get();
  }

  heterogeneous_summary s;
  s.models = models;
  std::vector<float> x;
  for (int round = 1; round <= options.rounds; ++round) {
    splitmix64 pick{derive_seed(options.seed, stream_sample + static_cast<std::uint64_t>(round))};
    std::vector<std::uint64_t> all(options.clients);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    for (std::size_t i = 0; i < per_round; ++i) std::swap(all[i], all[i + pick.below(all.size() - i)]);
    std::vector<std::uint64_t> who(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(per_round));
    std::sort(who.begin(), who.end());

    auto ctx = std::make_shared<kd_round>();
    ctx->engine = e.get();
    heterogeneous_progress p;
    p.round = round;
    p.rounds = options.rounds;
    double loss = 0, samples = 0;
    splitmix64 pub{derive_seed(options.seed, stream_public + (static_cast<std::uint64_t>(round) << 8))};
    if (e->kind == kd_kind::fedmd) {
      const std::size_t rows = std::min<std::size_t>(e->public_rows.size(), 1000);
      std::vector<std::uint32_t> subset(rows);
      for (auto& r : subset) r = e->public_rows[pub.below(e->public_rows.size())];
      features(*e->data, e->data->train, subset.data(), rows, ctx->public_x);
      ctx->rows = static_cast<int>(rows);
      std::vector<future<kd_result>> f;
      for (auto c : who) f.push_back(clients[c].ask(&kd_client::communicate, std::shared_ptr<const kd_round>(ctx)));
      std::vector<std::vector<float>> logits;
      for (auto& r : f) logits.push_back(r.get().values);
      mean_logits(logits, ctx->consensus);
      std::vector<future<kd_result>> g;
      for (auto c : who) g.push_back(clients[c].ask(&kd_client::digest, std::shared_ptr<const kd_round>(ctx)));
      for (auto& r : g) {
        const kd_result k = r.get();
        loss += k.loss;
        samples += static_cast<double>(k.samples);
      }
    } else {
      ctx->globals = globals;
      std::vector<future<kd_result>> f;
      for (auto c : who) f.push_back(clients[c].ask(&kd_client::train, std::shared_ptr<const kd_round>(ctx)));
      std::vector<std::vector<double>> sum(models.size());
      std::vector<double> weight(models.size(), 0.0);
      std::vector<std::pair<std::size_t, std::vector<float>>> trained;  // feddf's teachers
      for (std::size_t i = 0; i < who.size(); ++i) {
        kd_result k = f[i].get();
        const std::size_t g = who[i] % models.size();
        const double w = static_cast<double>(e->part.offsets[who[i] + 1] - e->part.offsets[who[i]]);
        if (sum[g].empty()) sum[g].assign(e->dims[g], 0.0);
        for (std::size_t j = 0; j < k.values.size(); ++j) sum[g][j] += w * k.values[j];
        weight[g] += w;
        loss += k.loss;
        samples += static_cast<double>(k.samples);
        if (e->kind == kd_kind::feddf) trained.emplace_back(g, std::move(k.values));
      }
      for (std::size_t g = 0; g < models.size(); ++g)
        if (weight[g] > 0)
          for (std::size_t j = 0; j < globals[g].size(); ++j) globals[g][j] = static_cast<float>(sum[g][j] / weight[g]);
      if (e->kind == kd_kind::feddf && options.distill_steps > 0) {
        // The ensemble's logits on the proxy batches, then each architecture's model towards them.
        const int batch = 64;
        const std::size_t rows = static_cast<std::size_t>(options.distill_steps) * batch;
        std::vector<std::uint32_t> proxy(rows);
        for (auto& r : proxy) r = e->public_rows[pub.below(e->public_rows.size())];
        features(*e->data, e->data->train, proxy.data(), rows, x);
        std::vector<std::vector<float>> logits(trained.size());
        for (std::size_t t = 0; t < trained.size(); ++t) {
          distiller& d = *server.distillers[trained[t].first];
          d.load(trained[t].second);
          d.logits(x.data(), static_cast<int>(rows), logits[t]);
        }
        std::vector<float> teacher;
        mean_logits(logits, teacher);
        const std::size_t classes = teacher.size() / rows;
        for (std::size_t g = 0; g < models.size(); ++g) {
          distiller& d = *server.distillers[g];
          d.load(globals[g]);
          d.reset();
          double last = 0;
          for (int step = 0; step < options.distill_steps; ++step)
            last = d.step(x.data() + static_cast<std::size_t>(step) * batch * e->inputs,
                          teacher.data() + static_cast<std::size_t>(step) * batch * classes, batch, distiller::loss::kl);
          d.store(globals[g]);
          p.distill_loss += last / static_cast<double>(models.size());
        }
      }
    }
    p.train_loss = samples > 0 ? loss / samples : 0;
    p.seconds = since(start);
    if (round % options.eval_every == 0 || round == options.rounds) {
      p.evaluated = true;
      p.accuracies = evaluate(ctx);
      s.accuracies = p.accuracies;
    }
    if (report) report(p);
  }
  s.rounds = options.rounds;
  double total = 0;
  for (double a : s.accuracies) total += a;
  s.mean_accuracy = s.accuracies.empty() ? 0 : total / static_cast<double>(s.accuracies.size());
  s.seconds = since(start);
  s.peak_rss_mb = peak_rss_mb();
  system.shutdown();
  return s;
}

}  // namespace troupe::federated
