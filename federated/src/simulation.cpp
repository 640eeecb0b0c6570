#include "troupe/federated/simulation.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "mlp.hpp"
#include "spec.hpp"
#include "troupe/actors/actor_system.hpp"
#include "troupe/core/file.hpp"
#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/partition.hpp"
#include "troupe/kernels/data.hpp"
#include "troupe/kernels/layers.hpp"

namespace troupe::federated {

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Seed streams: each random choice draws from its own stream of the run's seed.
constexpr std::uint64_t stream_model = 1;
constexpr std::uint64_t stream_partition = 2;
constexpr std::uint64_t stream_sample = 1ull << 32;   // + round
constexpr std::uint64_t stream_client = 2ull << 32;   // + client
constexpr std::uint64_t stream_transform = 3ull << 32;
constexpr std::uint64_t stream_speed = 4ull << 32;    // + client
constexpr std::uint64_t stream_fault = 5ull << 32;    // + round, then client
constexpr std::uint64_t stream_async = 6ull << 32;    // + dispatch: which idle client goes
constexpr std::uint64_t stream_dispatch = 7ull << 32; // + dispatch: its latency
constexpr std::uint64_t stream_async_fault = 8ull << 32;  // + dispatch: whether it fails

// ---- the built-in trainers --------------------------------------------------------------

/// SGD on an MLP over the shared Fashion-MNIST images, normalized batch by batch through a
/// 256-entry table (the shared copy stays u8: 47 MB rather than 188 MB of floats).
class mlp_trainer final : public local_trainer {
public:
  mlp_trainer(shared_data data, const simulation_options& o)
      : data_(std::move(data)), spec_(o.model), net_(detail::flat_mlp::from_spec(o.model)), test_limit_(o.test_limit) {
    if (!data_) throw std::invalid_argument("the mlp trainer needs data");
    pixels_ = static_cast<int>(data_->train.images.numel() / std::max<std::int64_t>(1, data_->train.size()));
    if (net_.inputs() != pixels_)
      throw std::invalid_argument("model '" + spec_ + "' takes " + std::to_string(net_.inputs()) + " inputs; the images have " +
                                  std::to_string(pixels_) + " pixels");
    if (net_.outputs() != fashion_mnist_classes)
      throw std::invalid_argument("model '" + spec_ + "' has " + std::to_string(net_.outputs()) + " outputs; the data has " +
                                  std::to_string(fashion_mnist_classes) + " classes");
    for (int v = 0; v < 256; ++v) lut_[v] = (static_cast<float>(v) / 255.0f - fashion_mnist_mean) / fashion_mnist_std;
  }
  std::size_t dim() const override { return net_.dim(); }
  void initialize(std::span<float> model, std::uint64_t seed) override {
    auto m = kernels::make_mlp(spec_);
    m->initialize(seed);
    std::size_t at = 0;
    for (auto* p : m->parameters())
      for (float v : p->value.data<float>()) model[at++] = v;
  }
  local_result train(const local_job& job, std::span<float> model, splitmix64& rng) override {
    local_result r;
    order_.assign(job.shard.begin(), job.shard.end());
    const std::size_t n = order_.size(), batch = static_cast<std::size_t>(job.batch);
    const std::size_t rows_at_most = std::min(batch, n);  // a batch above the shard is the whole shard
    x_.resize(rows_at_most * static_cast<std::size_t>(pixels_));
    y_.resize(rows_at_most);
    const std::uint8_t* images = data_->train.images.data<std::uint8_t>().data();
    const std::uint8_t* labels = data_->train.labels.data<std::uint8_t>().data();
    detail::gradient_extras extras;
    if (job.proximal_mu > 0) {
      extras.mu = static_cast<float>(job.proximal_mu);
      extras.center = job.global.data();
    }
    if (!job.correction.empty()) extras.correction = job.correction.data();
    double loss = 0;
    for (int e = 0; e < job.epochs; ++e) {
      for (std::size_t i = n; i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
      prefetch(images, labels, order_.data(), std::min(batch, n));
      for (std::size_t s = 0; s < n; s += batch) {
        const std::size_t rows = std::min(batch, n - s);
        gather(images, labels, order_.data() + s, rows);
        // The rows are scattered over 47 MB: ask for the next batch's while this one trains.
        if (s + batch < n) prefetch(images, labels, order_.data() + s + batch, std::min(batch, n - s - batch));
        loss += net_.step(model.data(), x_.data(), y_.data(), static_cast<int>(rows), static_cast<float>(job.lr), extras);
        ++r.steps;
        r.samples += static_cast<std::int64_t>(rows);
      }
    }
    r.loss = r.samples ? loss / static_cast<double>(r.samples) : 0.0;
    return r;
  }
  evaluation evaluate(std::span<const float> model) override {
    const std::size_t total = static_cast<std::size_t>(data_->test.size());
    const std::size_t n = test_limit_ ? std::min(test_limit_, total) : total;
    const std::size_t chunk = 240;
    x_.resize(chunk * static_cast<std::size_t>(pixels_));
    y_.resize(chunk);
    const std::uint8_t* images = data_->test.images.data<std::uint8_t>().data();
    const std::uint8_t* labels = data_->test.labels.data<std::uint8_t>().data();
    std::vector<std::uint32_t> rows(chunk);
    double loss = 0;
    std::int64_t correct = 0;
    for (std::size_t s = 0; s < n; s += chunk) {
      const std::size_t m = std::min(chunk, n - s);
      for (std::size_t i = 0; i < m; ++i) rows[i] = static_cast<std::uint32_t>(s + i);
      gather(images, labels, rows.data(), m);
      net_.evaluate(model.data(), x_.data(), y_.data(), static_cast<int>(m), loss, correct);
    }
    return {static_cast<double>(correct) / static_cast<double>(n), loss / static_cast<double>(n), {}};
  }

private:
  void gather(const std::uint8_t* images, const std::uint8_t* labels, const std::uint32_t* rows, std::size_t m) {
    const std::size_t d = static_cast<std::size_t>(pixels_);
    const float* lut = lut_;  // locals: stores to x_ could otherwise alias the members
    float* x = x_.data();
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint8_t* src = images + static_cast<std::size_t>(rows[i]) * d;
      float* dst = x + i * d;
      for (std::size_t k = 0; k < d; ++k) dst[k] = lut[src[k]];
      y_[i] = labels[rows[i]];
    }
  }
  /// Starts loading m rows (and their labels) into the cache.
  void prefetch(const std::uint8_t* images, const std::uint8_t* labels, const std::uint32_t* rows, std::size_t m) const {
    const std::size_t d = static_cast<std::size_t>(pixels_);
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint8_t* src = images + static_cast<std::size_t>(rows[i]) * d;
      for (std::size_t k = 0; k < d; k += 64) __builtin_prefetch(src + k, 0, 2);
      __builtin_prefetch(src + d - 1, 0, 2);
      __builtin_prefetch(labels + rows[i], 0, 2);
    }
  }

  shared_data data_;
  std::string spec_;
  detail::flat_mlp net_;
  std::size_t test_limit_;
  int pixels_ = 0;
  float lut_[256];
  std::vector<std::uint32_t> order_;
  std::vector<float> x_;
  std::vector<std::uint8_t> y_;
};

/// Trains nothing: moves each coordinate by a small seeded amount, so that the rounds, the
/// messages and the aggregation are real while the local work is nearly free.
class noop_trainer final : public local_trainer {
public:
  std::size_t dim() const override { return 16; }
  void initialize(std::span<float> model, std::uint64_t) override { std::fill(model.begin(), model.end(), 0.0f); }
  local_result train(const local_job& job, std::span<float> model, splitmix64& rng) override {
    for (float& v : model) v += static_cast<float>(rng.uniform01() - 0.5) * 1e-3f;
    return {0.0, 0, static_cast<std::int64_t>(job.shard.size())};
  }
  evaluation evaluate(std::span<const float>) override {  // nothing to measure
    return {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN(), {}};
  }
};

/// The clients' speed factors (simulation_options::latency).
struct latency_model {
  bool exponential = false;
  double parameter = 0.5;
};

// ---- the engine ---------------------------------------------------------------------------

struct worker_slot {
  std::unique_ptr<local_trainer> trainer;
  std::vector<float> model, correction;
};

std::atomic<std::uint64_t> next_engine_id{1};

/// What every client reads during a round (and the per-worker scratch).
struct engine_state {
  simulation_options options;
  shared_data data;
  trainer_factory factory;
  partition part;
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
  std::atomic<std::size_t> state_bytes{0};
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
  std::vector<std::uint64_t> participants;
  round_info info;
  /// The clients keep what they had before training until the round's outcome (client::settle):
  /// a round the server gives up leaves their persistent state as it was.
  bool provisional = false;
};

/// A client: a range of the shared index array, a generator and, only once its algorithm
/// needs it, persistent state. Nothing else while idle.
/// A diverged client (too large a learning rate) ends the run with its name, on the server's
/// thread, before its NaN reaches the aggregate (where it would only show as a NaN model).
void check_finite(const client_update& u, const std::string& when) {
  if (u.diverged)
    throw std::runtime_error(when + " diverged: client " + std::to_string(u.client) +
                             "'s update is no longer finite (lower --lr, or check the attack settings)");
}

class client {
public:
  client(std::uint32_t offset, std::uint32_t length, std::uint64_t seed) : offset_(offset), length_(length), rng_{seed} {}

  client_update train(const std::shared_ptr<const round_context>& ctx, std::uint64_t id) {
    engine_state& e = *ctx->engine;
    worker_slot& w = e.worker();
    const std::vector<float>& global = *ctx->global;
    const std::size_t dim = e.dim;
    if (ctx->provisional) {
      undo_.emplace(undo{rng_.state, nullptr});
      if (state_) {
        undo_->state = std::make_unique<float[]>(e.state_floats);
        std::copy(state_.get(), state_.get() + e.state_floats, undo_->state.get());
      }
    }
    if (!state_ && e.state_floats > 0) {
      state_ = std::make_unique<float[]>(e.state_floats);  // zero-filled
      e.state_bytes.fetch_add(e.state_floats * sizeof(float), std::memory_order_relaxed);
    }
    w.model.assign(global.begin(), global.end());
    local_job job;
    job.client = id;
    job.global = global;
    job.shard = {e.part.indices.data() + offset_, length_};
    job.epochs = e.options.local_epochs;
    job.batch = e.options.batch;
    job.lr = e.options.lr;
    job.proximal_mu = e.rule.proximal_mu;
    float* ci = state_.get();
    if (e.rule.control_variates) {
      w.correction.resize(dim);
      for (std::size_t p = 0; p < dim; ++p) w.correction[p] = ctx->control[p] - ci[p];
      job.correction = w.correction;
    }
    const local_result r = w.trainer->train(job, w.model, rng_);

    client_update u;
    u.client = id;
    u.samples = r.samples;
    u.loss = r.loss;
    u.weight = e.rule.uniform_weights ? 1.0 : static_cast<double>(length_);
    u.delta = e.take_buffer(e.rule.control_variates ? 2 * dim : dim);
    for (std::size_t p = 0; p < dim; ++p) u.delta[p] = w.model[p] - global[p];
    if (e.rule.control_variates && r.steps == 0) std::fill(u.delta.begin() + static_cast<std::ptrdiff_t>(dim), u.delta.end(), 0.0f);
    if (e.rule.control_variates && r.steps > 0) {
      // Option II: c_i+ = c_i - c + (x - y_i) / (K lr); the client sends c_i+ - c_i.
      const double scale = 1.0 / (static_cast<double>(r.steps) * e.options.lr);
      for (std::size_t p = 0; p < dim; ++p) {
        const float dc = static_cast<float>(
            std::clamp(-ctx->control[p] + (global[p] - w.model[p]) * scale, -e.control_bound, e.control_bound));
        u.delta[dim + p] = dc;
        ci[p] += dc;
      }
    }
    // A diverged update goes back as it is, past the transforms (which refuse it): the server
    // ends the run with the client's name (check_finite).
    if (!all_finite(u.delta)) {
      u.diverged = true;
      return u;
    }
    if (!e.transforms.empty()) u.words = e.take_words();  // storage an encoding transform may reuse
    for (std::size_t t = 0; t < e.transforms.size(); ++t) {
      const std::size_t floats = e.transforms[t]->client_state_floats(u.delta.size());
      std::span<float> state = floats ? std::span<float>(state_.get() + e.transform_offset[t], floats) : std::span<float>();
      splitmix64 g{derive_seed(derive_seed(e.options.seed, stream_transform + id),
                               static_cast<std::uint64_t>(ctx->info.round) * 64 + t)};
      e.transforms[t]->apply(u, state, ctx->info, g);
    }
    return u;
  }

  /// The round this client trained in is over: kept (`applied`), or given up by the server, and
  /// then the client is as it was before (generator and persistent state: a SCAFFOLD control
  /// variate or a top-k residual must not move on without the server's).
  void settle(const std::shared_ptr<const round_context>& ctx, bool applied) {
    if (!undo_) return;
    if (!applied) {
      rng_.state = undo_->rng;
      if (undo_->state) {
        state_ = std::move(undo_->state);
      } else if (state_) {  // made by the round given up
        state_.reset();
        ctx->engine->state_bytes.fetch_sub(ctx->engine->state_floats * sizeof(float), std::memory_order_relaxed);
      }
    }
    undo_.reset();
  }

  /// The generator and the persistent state (empty when not allocated yet), for checkpoints.
  std::pair<std::uint64_t, std::vector<float>> save(std::size_t floats) {
    std::vector<float> state;
    if (state_) state.assign(state_.get(), state_.get() + floats);
    return {rng_.state, std::move(state)};
  }
  /// Replaces them; returns the change in allocated state bytes.
  std::ptrdiff_t restore(std::uint64_t rng, std::vector<float> state, std::size_t floats) {
    rng_.state = rng;
    std::ptrdiff_t change = 0;
    if (state.empty()) {
      if (state_) change -= static_cast<std::ptrdiff_t>(floats * sizeof(float));
      state_.reset();
      return change;
    }
    if (!state_) {
      state_ = std::make_unique<float[]>(floats);
      change += static_cast<std::ptrdiff_t>(floats * sizeof(float));
    }
    std::copy(state.begin(), state.end(), state_.get());
    return change;
  }

private:
  std::uint32_t offset_, length_;
  splitmix64 rng_;
  std::unique_ptr<float[]> state_;
  struct undo {
    std::uint64_t rng;
    std::unique_ptr<float[]> state;  // null: there was none
  };
  std::optional<undo> undo_;  // while a round's outcome is pending (round_context::provisional)
};

using detail::spec_number;

latency_model parse_latency(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if ((name != "lognormal" && name != "exponential") || arg.empty())
    throw std::invalid_argument("--latency '" + spec + "': use lognormal:SIGMA or exponential:MEAN");
  latency_model m{name == "exponential", spec_number(arg, "--latency '" + spec + "'")};
  // A client's speed factor: sigma up to 5 (factors of e^20 at four sigmas) or a mean up to
  // 1000; beyond, simulated times leave the range of a double.
  if (m.exponential ? !(m.parameter > 0 && m.parameter <= 1000) : !(m.parameter >= 0 && m.parameter <= 5))
    throw std::invalid_argument("--latency '" + spec + "': " +
                                (m.exponential ? "the mean must be in (0, 1000]" : "sigma must be in [0, 5]"));
  return m;
}

/// FedBuff's K, or 0 for synchronous rounds.
std::size_t parse_async(const std::string& spec) {
  if (spec.empty()) return 0;
  const std::string prefix = "fedbuff:";
  if (spec.rfind(prefix, 0) != 0) throw std::invalid_argument("--async '" + spec + "': use fedbuff:K");
  const double k = spec_number(spec.substr(prefix.size()), "--async '" + spec + "'");
  if (!(k >= 1 && k <= 1e6) || k != std::floor(k))
    throw std::invalid_argument("--async '" + spec + "': K must be a whole number from 1 to 1000000");
  return static_cast<std::size_t>(k);
}

void check_options(const simulation_options& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (o.clients < 1) fail("--clients must be at least 1");
  if (o.clients > max_clients) fail("--clients must be at most " + std::to_string(max_clients));
  if (!(o.fraction >= 0 && o.fraction <= 1)) fail("--fraction must be in [0, 1]");
  if (o.fraction == 0) {
    if (o.per_round < 1) fail("--per-round must be at least 1");
    if (o.per_round > o.clients)
      fail("--per-round " + std::to_string(o.per_round) + " is more than the " + std::to_string(o.clients) + " clients");
  }
  if (o.min_per_round > o.clients)
    fail("--min-per-round (" + std::to_string(o.min_per_round) + ") is more than --clients (" + std::to_string(o.clients) + ")");
  if (o.rounds < 1) fail("--rounds must be at least 1");
  if (o.local_epochs < 1) fail("--local-epochs must be at least 1");
  if (o.batch < 1) fail("--batch must be at least 1");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) fail("--lr must be positive");
  if (o.eval_every < 1) fail("--eval-every must be at least 1");
  if (o.threads > 256) fail("--threads must be at most 256");
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("--dropout must be in [0, 1)");
  if (!(o.deadline >= 0) || !std::isfinite(o.deadline)) fail("--deadline must be a non-negative number of seconds");
  if (!(o.over_select >= 0 && o.over_select <= 10)) fail("--over-select must be in [0, 10]");
  if (!(o.sample_seconds >= 0 && o.sample_seconds <= 3600))
    fail("the simulated time per example must be in [0, 3600] seconds");
  if (o.trainer != "mlp" && o.trainer != "noop") fail("unknown trainer '" + o.trainer + "' (use mlp or noop)");
  if (o.trainer == "noop" && is_data_attack(o.attack))
    fail("--attack " + o.attack + " poisons the training data, and the noop trainer trains on none: use --trainer mlp");
  (void)parse_latency(o.latency);
  if (parse_async(o.async) > 0) {
    // Failures (--dropout) are FedBuff's too: a failed client's slot is refilled. A deadline and
    // over-selection shape a round's cohort, and FedBuff has none.
    if (o.deadline > 0 || o.over_select > 0)
      fail("--async: --deadline and --over-select shape a synchronous round's cohort; FedBuff has no rounds to cut "
           "short (a slow client's update arrives stale and is weighted down instead)");
    if (o.secagg) fail("--async with --secagg: secure aggregation needs a fixed cohort per round");
    if (o.dp_adaptive)
      fail("--async with --dp-adaptive is not supported: the clipping bound would change while clients that clipped "
           "to an older, larger bound are still in flight, and the noise would no longer cover their updates");
  }
}

/// What FedBuff's buffer must hold for the mechanisms `o` installs: a robust rule is applied to
/// the K buffered updates of each server step, so K must be large enough for it; under
/// differential privacy the clients of the buffer stay busy until the step, so there must be
/// an idle client to send out after every arrival.
void check_async_mechanisms(const simulation_options& o, std::size_t in_flight, std::size_t k) {
  if (is_robust_rule(o.strategy)) {
    const std::size_t least = least_updates(o.strategy);
    if (k < least)
      throw std::invalid_argument("--async " + o.async + " with --strategy " + o.strategy + ": the rule is applied to the " +
                                  std::to_string(k) + " buffered updates of each server step and needs at least " +
                                  std::to_string(least) + "; raise K");
  }
  if ((o.dp_clip != 0 || o.dp_noise != 0) && o.clients < in_flight + k - 1)
    throw std::invalid_argument("--async " + o.async + " with differential privacy needs --clients >= " +
                                std::to_string(in_flight + k - 1) +
                                " (clients in flight + K - 1): a client whose update waits in the buffer is not sent out "
                                "again before the server step");
}

shared_data load_data(const simulation_options& o) {
  auto all = load_fashion_mnist(o.data_dir.empty() ? fashion_mnist_dir : o.data_dir);
  if (all.train.size() < 1 || all.test.size() < 1)
    throw std::invalid_argument("the dataset has " + std::to_string(all.train.size()) + " training and " +
                                std::to_string(all.test.size()) + " test examples: a simulation needs both");
  if (o.train_limit && static_cast<std::int64_t>(o.train_limit) < all.train.size()) {
    const auto n = static_cast<std::int64_t>(o.train_limit);
    all.train.images = all.train.images.slice(0, n).clone();
    all.train.labels = all.train.labels.slice(0, n).clone();
  }
  return std::make_shared<const fashion_mnist>(std::move(all));
}

/// The options a checkpoint must be resumed with, one "name=value" a line (threads, windows,
/// evaluation and the round count may change).
std::string fingerprint(const simulation_options& o) {
  std::ostringstream s;
  s.precision(17);
  s << "clients=" << o.clients << "\nper-round=" << o.per_round << "\nfraction=" << o.fraction
    << "\nmin-per-round=" << o.min_per_round << "\nlocal-epochs=" << o.local_epochs << "\nbatch=" << o.batch
    << "\nlr=" << o.lr << "\nmodel=" << o.model << "\npartition=" << o.partition << "\nstrategy=" << o.strategy
    << "\nserver-lr=" << o.server.server_lr << "\nserver-momentum=" << o.server.momentum << "\nbeta1=" << o.server.beta1
    << "\nbeta2=" << o.server.beta2 << "\ntau=" << o.server.tau << "\nbias-correction=" << o.server.bias_correction
    << "\nseed=" << o.seed << "\ndata-dir=" << o.data_dir << "\ntrainer=" << o.trainer << "\ntrain-limit=" << o.train_limit
    << "\ndropout=" << o.dropout << "\ndeadline=" << o.deadline << "\nover-select=" << o.over_select
    << "\nsample-seconds=" << o.sample_seconds << "\nsecagg=" << o.secagg << "\nsecagg-dropout=" << o.secagg_dropout
    << "\ndp-clip=" << o.dp_clip << "\ndp-noise=" << o.dp_noise << "\ndp-delta=" << o.dp_delta
    << "\ndp-adaptive=" << o.dp_adaptive << "\ncompress=" << o.compress << "\nattack=" << o.attack << "\nlatency=" << o.latency
    << "\nasync=" << o.async << "\n";
  return s.str();
}

/// The first line where two fingerprints differ, as a sentence.
std::string first_difference(const std::string& saved, const std::string& now) {
  std::istringstream a(saved), b(now);
  std::string x, y;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, x)), more_b = static_cast<bool>(std::getline(b, y));
    if (!more_a && !more_b) return "the options differ";
    if (x != y)
      return "it was saved with " + (more_a ? x : std::string("(nothing)")) + " and this run has " +
             (more_b ? y : std::string("(nothing)"));
  }
}

constexpr char checkpoint_magic[8] = {'T', 'R', 'F', 'E', 'D', 'C', 'K', '\0'};
// 1: synchronous runs only; 2: FedBuff's state after the clients (empty for synchronous runs).
constexpr std::uint32_t checkpoint_version = 2;

std::uint32_t crc32_of(const char* data, std::size_t n) {
  return troupe::crc32(std::as_bytes(std::span<const char>(data, n)));
}

/// Appends values in the host's byte order (a checkpoint resumes on the machine that wrote it).
struct byte_writer {
  std::string bytes;
  template <class T>
  void put(const T& v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <class T>
  void put_array(std::span<const T> v) {
    put<std::uint64_t>(v.size());
    bytes.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
  }
};

struct byte_reader {
  const std::string& bytes;
  std::size_t at = 0, end = 0;
  const std::string& file;
  [[noreturn]] void truncated() const {
    throw std::runtime_error("checkpoint " + file + " is truncated or malformed (at byte " + std::to_string(at) + ")");
  }
  template <class T>
  T get() {
    if (end - at < sizeof(T)) truncated();
    T v;
    std::memcpy(&v, bytes.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  template <class T>
  std::vector<T> get_array() {
    const auto n = get<std::uint64_t>();
    if (n > (end - at) / sizeof(T)) truncated();
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), bytes.data() + at, n * sizeof(T));  // an empty vector may have no storage
    at += n * sizeof(T);
    return v;
  }
};

/// Sizes each client's persistent state: SCAFFOLD's c_i, then every transform's slice.
void size_client_state(engine_state& e) {
  e.state_floats = e.rule.control_variates ? e.dim : 0;
  e.transform_offset.clear();
  const std::size_t update = e.strategy->update_floats(e.dim);
  for (auto& t : e.transforms) {
    e.transform_offset.push_back(e.state_floats);
    e.state_floats += t->client_state_floats(update);
  }
}

/// A client's simulated time for one piece of work: its own speed factor times its examples,
/// epochs and sample_seconds, plus exponential jitter (mean 0.1 s) drawn from `g`.
double work_seconds(const engine_state& e, std::uint64_t client, splitmix64& g) {
  const auto& o = e.options;
  splitmix64 speed{derive_seed(o.seed, stream_speed + client)};
  double factor = 0;
  if (e.latency.exponential) {
    factor = -e.latency.parameter * std::log(1.0 - speed.uniform01());
  } else {  // log-normal, by Box-Muller from the client's seed
    const double u1 = 1.0 - speed.uniform01(), u2 = speed.uniform01();
    factor = std::exp(e.latency.parameter * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
  const auto& off = e.part.offsets;
  const double examples = static_cast<double>(off[client + 1] - off[client]);
  const double jitter = -0.1 * std::log(1.0 - g.uniform01());
  return factor * examples * o.local_epochs * o.sample_seconds + jitter;
}

/// The bounds on the weights the clients will send (client::train): 1 each when the strategy
/// weighs clients uniformly, else their shard sizes; a round holds at most `per_round` of them.
weight_bounds client_weight_bounds(const engine_state& e, std::size_t per_round) {
  const double uniform = static_cast<double>(per_round);
  if (e.rule.uniform_weights) return {.max = 1, .round_sum = uniform};
  std::vector<std::uint32_t> sizes(e.part.clients());
  for (std::size_t c = 0; c < sizes.size(); ++c) sizes[c] = e.part.offsets[c + 1] - e.part.offsets[c];
  const std::size_t k = std::min(per_round, sizes.size());
  if (k == 0) return {.max = 1, .round_sum = uniform};
  std::nth_element(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(k - 1), sizes.end(), std::greater<>());
  double largest = 0, sum = 0;  // the k largest sizes are sizes[0, k)
  for (std::size_t i = 0; i < k; ++i) {
    largest = std::max(largest, static_cast<double>(sizes[i]));
    sum += sizes[i];
  }
  if (largest == 0) return {.max = 1, .round_sum = uniform};  // no client holds an example
  return {.max = largest, .round_sum = sum};
}

}  // namespace

double staleness_weight(std::int64_t staleness) {
  if (staleness < 0) throw std::invalid_argument("staleness_weight: negative staleness");
  return 1.0 / std::sqrt(1.0 + static_cast<double>(staleness));
}

trainer_factory make_trainer_factory(const simulation_options& options) {
  if (options.trainer == "noop")
    return [](const shared_data&) -> std::unique_ptr<local_trainer> { return std::make_unique<noop_trainer>(); };
  if (options.trainer != "mlp") throw std::invalid_argument("unknown trainer '" + options.trainer + "' (use mlp or noop)");
  trainer_factory mlp = [options](const shared_data& data) -> std::unique_ptr<local_trainer> {
    return std::make_unique<mlp_trainer>(data, options);
  };
  return is_data_attack(options.attack) ? poison_training(std::move(mlp), options.attack, options.seed) : mlp;
}

struct simulation::impl {
  engine_state engine;
  std::unique_ptr<local_trainer> server_trainer;  // evaluations
  std::unique_ptr<aggregator> agg = make_weighted_mean();
  std::shared_ptr<const std::vector<float>> global;
  std::size_t sample_size = 0;  // sampled per round
  std::size_t keep = 0;         // of those, kept at most (per-round)
  std::size_t window = 0;
  int rounds = 0;
  double clock = 0;             // simulated seconds so far

  // FedBuff: the clients in flight, each with the simulated time its update arrives.
  struct in_flight {
    double arrival = 0;         // of its update, or when its failure frees the slot
    std::uint64_t dispatch = 0, client = 0;
    std::int64_t version = 0;   // of the model it trains from
    bool failed = false;        // the fault model dropped it: it trains nothing, no update comes
    future<client_update> reply;
    std::optional<client_update> done;  // the reply, once taken before its arrival (checkpoints)

    client_update take() {
      if (!done) return reply.get();
      client_update u = std::move(*done);
      done.reset();
      return u;
    }
  };
  std::size_t buffer = 0;       // K; 0: synchronous rounds
  std::int64_t version = 0;     // server updates so far
  std::uint64_t dispatched = 0;
  std::vector<in_flight> flight;
  std::vector<char> busy;       // per client: in flight (or, when holding, in the buffer)
  bool started = false;         // the first clients have left
  /// Differential privacy: a client whose update waits in the buffer is not sent out again
  /// before the server step, so that a step holds at most one update per client.
  bool hold = false;
  /// set_aggregator was called: FedBuff's steps go through that aggregator (robust rules, DP).
  bool custom_aggregator = false;

  /// Sends an idle client (a seeded uniform choice) to train from the current model. Under the
  /// fault model it may fail instead: it trains nothing and holds its slot until its update
  /// would have arrived (the server cannot tell it from a slow client before then).
  void dispatch() {
    const std::uint64_t seq = dispatched++;
    splitmix64 pick{derive_seed(engine.options.seed, stream_async + seq)};
    std::uint64_t c = 0;
    do c = pick.below(clients.size());
    while (busy[c]);
    busy[c] = 1;
    const std::uint64_t seed = derive_seed(engine.options.seed, stream_dispatch + seq);
    splitmix64 g{seed};
    const double arrival = clock + work_seconds(engine, c, g);
    if (engine.options.dropout > 0) {
      splitmix64 fault{derive_seed(engine.options.seed, stream_async_fault + seq)};
      if (fault.uniform01() < engine.options.dropout) {
        flight.push_back({arrival, seq, c, version, true, {}, {}});
        return;
      }
    }
    auto ctx = std::make_shared<round_context>();
    ctx->engine = &engine;
    ctx->global = global;
    ctx->info.round = static_cast<int>(seq % 0x7FFFFFFF) + 1;  // seeds the client's transforms
    ctx->info.dim = engine.strategy->update_floats(engine.dim);
    ctx->info.population = clients.size();
    ctx->info.seed = seed;
    std::shared_ptr<const round_context> shared = ctx;
    flight.push_back({arrival, seq, c, version, false, clients[c].ask(&client::train, shared, c), {}});
  }

  /// One FedBuff server update: the next K arrivals, in simulated time. With the default
  /// aggregator the step is FedBuff's sum(staleness_weight(s) * delta) / K, accumulated in
  /// double; an aggregator set by set_aggregator (a robust rule, DP's noised sum) receives the K
  /// updates, each scaled by its staleness weight, at the K-th arrival.
  round_report async_round(int round) {
    auto& e = engine;
    round_report r;
    const double start = clock;
    if (!started) {
      busy.assign(clients.size(), 0);
      for (std::size_t i = 0; i < keep; ++i) dispatch();
      started = true;
    }
    const std::size_t floats = e.strategy->update_floats(e.dim);
    const bool through = custom_aggregator;
    std::vector<double> sum(through ? 0 : floats, 0.0);
    std::vector<client_update> buffered;
    std::vector<std::uint64_t> who;
    double loss = 0, staleness = 0;
    std::int64_t samples = 0;
    while (who.size() < buffer) {
      auto next = std::min_element(flight.begin(), flight.end(), [](const in_flight& a, const in_flight& b) {
        return a.arrival < b.arrival || (a.arrival == b.arrival && a.dispatch < b.dispatch);
      });
      in_flight f = std::move(*next);
      flight.erase(next);
      clock = f.arrival;
      if (f.failed) {  // its slot goes to another client; the buffer still waits for K updates
        busy[f.client] = 0;
        ++r.dropped;
        dispatch();
        continue;
      }
      client_update u = f.take();
      check_finite(u, "server step " + std::to_string(version + 1));
      if (!hold) busy[f.client] = 0;
      if (!u.words.empty() || u.delta.size() != floats)
        throw std::logic_error("--async: client " + std::to_string(u.client) + " sent an update of another form");
      const std::int64_t s = version - f.version;
      const double w = staleness_weight(s);
      who.push_back(u.client);
      staleness += static_cast<double>(s);
      loss += u.loss * static_cast<double>(u.samples);
      samples += u.samples;
      if (through) {
        for (std::size_t i = 0; i < floats; ++i) u.delta[i] = static_cast<float>(w * u.delta[i]);
        buffered.push_back(std::move(u));
      } else {
        for (std::size_t i = 0; i < floats; ++i) sum[i] += w * u.delta[i];
        e.give_back(std::move(u.delta));
      }
      if (who.size() == buffer) {  // the K-th arrival: the server moves before the replacement leaves
        round_info info;
        info.round = round;
        info.dim = floats;
        info.population = clients.size();
        info.participants = who;
        info.seed = derive_seed(e.options.seed, stream_sample + static_cast<std::uint64_t>(round) + (1ull << 31));
        std::vector<float> aggregate(floats);
        if (through) {
          agg->begin(info);
          for (auto& b : buffered) agg->add(b.client, b.weight, b.delta);
          aggregate = agg->finish();
          for (auto& b : buffered) e.give_back(std::move(b.delta));
          buffered.clear();
        } else {
          for (std::size_t i = 0; i < floats; ++i) aggregate[i] = static_cast<float>(sum[i] / static_cast<double>(buffer));
        }
        auto model = std::make_shared<std::vector<float>>(*global);
        e.strategy->apply(*model, aggregate, info);
        global = std::move(model);
        ++version;
        if (hold)
          for (auto c : who) busy[c] = 0;
        for (auto& t : e.transforms) t->end_round(info, r.metrics);
      }
      dispatch();
    }
    r.round = round;
    r.participants = buffer;
    r.sampled = buffer + r.dropped;
    r.simulated_seconds = clock - start;
    r.train_loss = samples ? loss / static_cast<double>(samples) : 0.0;
    r.metrics.emplace_back("mean_staleness", staleness / static_cast<double>(buffer));
    return r;
  }

  /// Takes the replies of every client in flight, so that a checkpoint can hold them.
  void settle_flight() {
    for (auto& f : flight)
      if (!f.failed && !f.done) f.done = f.reply.get();
  }

  // Declared last: stopped (its workers joined) before the state the clients read goes.
  std::unique_ptr<actor_system> system;
  std::vector<actor_ref<client>> clients;
};

simulation::simulation(simulation_options options, shared_data data, trainer_factory trainer)
    : impl_(std::make_unique<impl>()) {
  check_options(options);
  auto& e = impl_->engine;
  e.options = std::move(options);
  const auto& o = e.options;
  const bool custom = static_cast<bool>(trainer);
  e.factory = custom ? std::move(trainer) : make_trainer_factory(o);
  // The strategy first: a bad name fails before the data loads. A robust rule is FedAvg's
  // server step over that rule's aggregate.
  e.strategy = make_strategy(is_robust_rule(o.strategy) ? "fedavg" : o.strategy, o.server);
  if (!custom && o.trainer == "mlp") (void)detail::flat_mlp::from_spec(o.model);
  if (!data && (custom || o.trainer == "mlp")) data = load_data(o);
  e.data = std::move(data);
  impl_->server_trainer = e.factory(e.data);
  e.dim = impl_->server_trainer->dim();

  // Partition: over the data's labels, or, for a trainer without data, over synthetic ones.
  tensor labels;
  if (e.data) {
    labels = e.data->train.labels;
  } else {
    const std::int64_t n = std::max<std::int64_t>(60000, static_cast<std::int64_t>(o.clients));
    labels = tensor::empty({n}, dtype::u8);
    auto l = labels.data<std::uint8_t>();
    for (std::int64_t i = 0; i < n; ++i) l[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i % 10);
  }
  e.part = make_partition(o.partition, labels, o.clients, derive_seed(o.seed, stream_partition));

  impl_->sample_size = o.fraction > 0 ? std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(o.fraction * o.clients)),
                                                                std::max<std::size_t>(1, o.min_per_round), o.clients)
                                      : std::max(o.per_round, o.min_per_round);
  impl_->keep = impl_->sample_size;
  if (o.over_select > 0)
    impl_->sample_size = std::min<std::size_t>(
        o.clients, static_cast<std::size_t>(std::ceil(static_cast<double>(impl_->sample_size) * (1 + o.over_select))));
  e.rule = e.strategy->rule();
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
  install_mechanisms(*this, o, client_weight_bounds(e, impl_->keep));
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
  if (k >= n) {
    for (std::uint64_t c = 0; c < n; ++c) out.push_back(c);
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
  return out;
}

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
  auto ctx = std::make_shared<round_context>();
  ctx->engine = &e;
  ctx->global = impl_->global;
  const auto control = e.strategy->control();
  if (e.rule.control_variates) {
    ctx->control.assign(control.begin(), control.end());
    ctx->control.resize(e.dim, 0.0f);
  }
  round_report r;
  ctx->participants = participants(round, &r);
  ctx->info.round = round;
  ctx->info.dim = e.strategy->update_floats(e.dim);
  ctx->info.population = impl_->clients.size();
  ctx->info.participants = ctx->participants;
  ctx->info.seed = derive_seed(e.options.seed, stream_sample + static_cast<std::uint64_t>(round) + (1ull << 31));
  ctx->provisional = e.state_floats > 0;
  std::shared_ptr<const round_context> shared = ctx;

  // Asks go out through a window; replies are added in sample order, so the sum is the same
  // whatever order the workers finish in, and at most `window` updates exist at once.
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
    if (!u.words.empty())
      impl_->agg->add_encoded(u.client, u.weight, u.words);
    else
      impl_->agg->add(u.client, u.weight, u.delta);
    loss += u.loss * static_cast<double>(u.samples);
    samples += u.samples;
    e.give_back(std::move(u.delta));
    e.give_back(std::move(u.words));
  }
  if (asked > 0) {  // a round where every client failed leaves the model as it was
    try {
      std::vector<float> aggregate = impl_->agg->finish();
      auto next = std::make_shared<std::vector<float>>(*impl_->global);
      e.strategy->apply(*next, aggregate, ctx->info);
      impl_->global = std::move(next);
    } catch (const round_aborted& e) {
      r.aborted = e.what();
    }
    // (Told before anything else is asked of them: the next round's train, a checkpoint's save.)
    if (ctx->provisional)
      for (std::size_t i = 0; i < asked; ++i) impl_->clients[who[i]].tell(&client::settle, shared, r.aborted.empty());
  }

  r.round = round;
  r.participants = r.aborted.empty() ? who.size() : 0;
  if (!r.aborted.empty()) r.metrics.emplace_back("aborted", 1.0);
  r.train_loss = samples ? loss / static_cast<double>(samples) : 0.0;
  for (auto& t : e.transforms) t->end_round(ctx->info, r.metrics);
  impl_->clock += r.simulated_seconds;
  r.seconds = since(t0);
  return r;
}

evaluation simulation::evaluate() { return impl_->server_trainer->evaluate(*impl_->global); }
int simulation::rounds_done() const noexcept { return impl_->rounds; }
std::span<const float> simulation::global_model() const noexcept { return *impl_->global; }
std::size_t simulation::population() const noexcept { return impl_->clients.size(); }
std::size_t simulation::sample_size() const noexcept { return impl_->sample_size; }
std::size_t simulation::buffer_size() const noexcept { return impl_->buffer; }
std::size_t simulation::cohort_size() const noexcept { return impl_->keep; }
std::size_t simulation::client_state_bytes() const noexcept { return impl_->engine.state_bytes.load(); }
double simulation::simulated_seconds() const noexcept { return impl_->clock; }

void simulation::save_checkpoint(const std::string& file) const {
  auto& e = impl_->engine;
  // A client in flight trains (in wall time) when it is sent out, which advances its generator
  // and persistent state; its update arrives later on the virtual clock. So the checkpoint waits
  // for the clients in flight and holds their finished updates: what they will deliver is then
  // fixed, and their saved state is the one they continue from.
  impl_->settle_flight();
  if (impl_->rounds == 0) size_client_state(e);
  byte_writer w;
  w.bytes.append(checkpoint_magic, sizeof checkpoint_magic);
  w.put(checkpoint_version);
  const std::string options = fingerprint(e.options);
  w.put_array(std::span<const char>(options));
  w.put<std::int64_t>(impl_->rounds);
  w.put<double>(impl_->clock);
  w.put_array(std::span<const float>(*impl_->global));
  const auto strategy = e.strategy->save_state();
  w.put_array(std::span<const double>(strategy));
  w.put<std::uint64_t>(e.transforms.size());
  for (const auto& t : e.transforms) {
    const auto state = t->save_state();
    w.put_array(std::span<const double>(state));
  }
  w.put<std::uint64_t>(impl_->clients.size());
  w.put<std::uint64_t>(e.state_floats);
  // Asked in windows: the clients are idle between rounds, and a window bounds the copies.
  const std::size_t n = impl_->clients.size(), step = std::max<std::size_t>(1, impl_->window);
  for (std::size_t first = 0; first < n; first += step) {
    std::vector<future<std::pair<std::uint64_t, std::vector<float>>>> replies;
    for (std::size_t c = first; c < std::min(n, first + step); ++c)
      replies.push_back(impl_->clients[c].ask(&client::save, e.state_floats));
    for (auto& f : replies) {
      const auto [rng, state] = f.get();
      w.put(rng);
      w.put_array(std::span<const float>(state));
    }
  }
  // FedBuff: the server version, the dispatch counter (every later draw derives from it) and
  // the clients in flight. Between server steps the buffer is empty: a step is taken at the
  // K-th arrival, before run_round returns.
  w.put<std::int64_t>(impl_->version);
  w.put<std::uint64_t>(impl_->dispatched);
  w.put<std::uint64_t>(impl_->flight.size());
  for (const auto& f : impl_->flight) {
    w.put<double>(f.arrival);
    w.put<std::uint64_t>(f.dispatch);
    w.put<std::uint64_t>(f.client);
    w.put<std::int64_t>(f.version);
    w.put<std::uint8_t>(f.failed ? 1 : 0);
    if (f.failed) continue;
    const client_update& u = *f.done;
    w.put<std::uint64_t>(u.client);
    w.put<double>(u.weight);
    w.put<std::int64_t>(u.samples);
    w.put<double>(u.loss);
    w.put_array(std::span<const float>(u.delta));
    w.put_array(std::span<const std::uint32_t>(u.words));
  }
  w.put(crc32_of(w.bytes.data(), w.bytes.size()));
  try {
    write_file_atomically(file, std::as_bytes(std::span<const char>(w.bytes)));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("writing the checkpoint: ") + e.what());
  }
}

void simulation::load_checkpoint(const std::string& file) {
  auto& e = impl_->engine;
  std::string bytes;
  {
    try {
      check_regular(file);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("the checkpoint " + file + " " + e.what());
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read the checkpoint " + file);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw std::runtime_error("cannot read the checkpoint " + file);
  }
  if (bytes.size() < sizeof checkpoint_magic + 2 * sizeof(std::uint32_t) ||
      std::memcmp(bytes.data(), checkpoint_magic, sizeof checkpoint_magic) != 0)
    throw std::runtime_error(file + " is not a fedsim checkpoint (or is truncated)");
  std::uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - sizeof stored_crc, sizeof stored_crc);
  if (crc32_of(bytes.data(), bytes.size() - sizeof stored_crc) != stored_crc)
    throw std::runtime_error("checkpoint " + file + " is corrupted or truncated (CRC-32 mismatch)");
  byte_reader r{bytes, sizeof checkpoint_magic, bytes.size() - sizeof stored_crc, file};
  const auto version = r.get<std::uint32_t>();
  if (version != checkpoint_version && version != 1)
    throw std::runtime_error("checkpoint " + file + " has version " + std::to_string(version) + "; this build reads 1 to " +
                             std::to_string(checkpoint_version));
  const auto saved = r.get_array<char>();
  const std::string options = fingerprint(e.options);
  if (std::string(saved.begin(), saved.end()) != options)
    throw std::runtime_error("checkpoint " + file + " belongs to another simulation: " +
                             first_difference(std::string(saved.begin(), saved.end()), options));
  const auto rounds = r.get<std::int64_t>();
  const auto clock = r.get<double>();
  auto global = std::make_shared<std::vector<float>>(r.get_array<float>());
  const auto strategy = r.get_array<double>();
  const auto transforms = r.get<std::uint64_t>();
  if (rounds < 0 || rounds > 0x7FFFFFFF) r.truncated();
  if (global->size() != e.dim)
    throw std::runtime_error("checkpoint " + file + " holds a model of " + std::to_string(global->size()) +
                             " floats; this one has " + std::to_string(e.dim));
  if (transforms != e.transforms.size())
    throw std::runtime_error("checkpoint " + file + " has " + std::to_string(transforms) + " transforms; this simulation has " +
                             std::to_string(e.transforms.size()));
  std::vector<std::vector<double>> transform_state(transforms);
  for (auto& t : transform_state) t = r.get_array<double>();
  size_client_state(e);
  const auto population = r.get<std::uint64_t>(), floats = r.get<std::uint64_t>();
  if (population != impl_->clients.size() || floats != e.state_floats)
    throw std::runtime_error("checkpoint " + file + " has " + std::to_string(population) + " clients with " +
                             std::to_string(floats) + " state floats each; this simulation has " +
                             std::to_string(impl_->clients.size()) + " with " + std::to_string(e.state_floats));
  std::vector<std::pair<std::uint64_t, std::vector<float>>> clients(population);
  for (auto& [rng, state] : clients) {
    rng = r.get<std::uint64_t>();
    state = r.get_array<float>();
    if (!state.empty() && state.size() != floats) r.truncated();
  }
  std::int64_t server_version = 0;
  std::uint64_t dispatched = 0;
  std::vector<impl::in_flight> flight;
  if (version < 2 && impl_->buffer)
    throw std::runtime_error("checkpoint " + file + " has version 1, which holds only synchronous runs; this run is FedBuff");
  if (version >= 2) {
    auto malformed = [&](const std::string& why) {
      throw std::runtime_error("checkpoint " + file + " is malformed: " + why);
    };
    server_version = r.get<std::int64_t>();
    dispatched = r.get<std::uint64_t>();
    const auto n = r.get<std::uint64_t>();
    const bool started = dispatched > 0;
    if (!impl_->buffer && (server_version != 0 || dispatched != 0 || n != 0)) malformed("FedBuff state in a synchronous run");
    if (impl_->buffer && (server_version != rounds || n != (started ? impl_->keep : 0)))
      malformed("the server version or the clients in flight do not match the rounds");
    const std::size_t update = e.strategy->update_floats(e.dim);
    std::vector<char> seen(population, 0);
    for (std::uint64_t i = 0; i < n; ++i) {
      impl::in_flight f;
      f.arrival = r.get<double>();
      f.dispatch = r.get<std::uint64_t>();
      f.client = r.get<std::uint64_t>();
      f.version = r.get<std::int64_t>();
      const auto failed = r.get<std::uint8_t>();
      if (!std::isfinite(f.arrival) || f.arrival < clock || f.dispatch >= dispatched || f.client >= population ||
          seen[f.client] || f.version < 0 || f.version > server_version || failed > 1)
        malformed("client in flight " + std::to_string(i) + " is inconsistent");
      seen[f.client] = 1;
      f.failed = failed != 0;
      if (!f.failed) {
        client_update u;
        u.client = r.get<std::uint64_t>();
        u.weight = r.get<double>();
        u.samples = r.get<std::int64_t>();
        u.loss = r.get<double>();
        u.delta = r.get_array<float>();
        u.words = r.get_array<std::uint32_t>();
        if (u.client != f.client || u.delta.size() != update || !u.words.empty())
          malformed("the update of client in flight " + std::to_string(i) + " is inconsistent");
        f.done = std::move(u);
      }
      flight.push_back(std::move(f));
    }
  }
  if (r.at != r.end) throw std::runtime_error("checkpoint " + file + " has trailing bytes");
  // Values a run never writes (a crafted or damaged file with a valid CRC): refused here, not
  // found rounds later as a NaN accuracy or an infinite clock.
  {
    auto bad = [&](const std::string& what) {
      throw std::runtime_error("checkpoint " + file + " is malformed: " + what);
    };
    if (!std::isfinite(clock) || clock < 0) bad("the simulated clock is " + std::to_string(clock));
    if (!all_finite(*global)) bad("the model holds a value that is not finite");
    if (!all_finite(strategy)) bad("the strategy's state holds a value that is not finite");
    // (The transforms' state is theirs to check: a privacy accountant may hold an infinite
    // bound for a run with next to no noise.)
    for (std::size_t c = 0; c < clients.size(); ++c)
      if (!all_finite(clients[c].second)) bad("client " + std::to_string(c) + "'s state holds a value that is not finite");
    for (const auto& f : flight)
      if (f.done && (!all_finite(f.done->delta) || !std::isfinite(f.done->weight) || !std::isfinite(f.done->loss)))
        bad("an update in flight holds a value that is not finite");
    // The strategy's and the transforms' own rules (lengths, ranges), before anything changes.
    try {
      e.strategy->check_state(strategy, e.dim);
      for (std::size_t t = 0; t < transforms; ++t) e.transforms[t]->check_state(transform_state[t]);
    } catch (const std::invalid_argument& x) {
      bad(x.what());
    }
  }

  // Everything parsed and checked: now the state changes. FedBuff's clients still in flight
  // finish first, so that their training cannot touch the state restored below.
  for (auto& f : impl_->flight) {
    if (!f.reply.valid()) continue;
    try {
      e.give_back(std::move(f.reply.get().delta));
    } catch (...) {  // a failed training is superseded by the checkpoint
    }
  }
  impl_->flight.clear();
  e.strategy->load_state(strategy);
  for (std::size_t t = 0; t < transforms; ++t) e.transforms[t]->load_state(transform_state[t]);
  std::vector<future<std::ptrdiff_t>> replies;
  replies.reserve(population);
  for (std::size_t c = 0; c < population; ++c)
    replies.push_back(impl_->clients[c].ask(&client::restore, clients[c].first, std::move(clients[c].second), floats));
  std::ptrdiff_t bytes_now = static_cast<std::ptrdiff_t>(e.state_bytes.load());
  for (auto& f : replies) bytes_now += f.get();
  e.state_bytes.store(static_cast<std::size_t>(bytes_now));
  impl_->global = std::move(global);
  impl_->rounds = static_cast<int>(rounds);
  impl_->clock = clock;
  impl_->version = server_version;
  impl_->dispatched = dispatched;
  impl_->started = dispatched > 0;
  impl_->flight = std::move(flight);
  impl_->busy.assign(impl_->buffer ? population : 0, 0);
  for (const auto& f : impl_->flight) impl_->busy[f.client] = 1;
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

summary run_simulation(const simulation_options& options, const std::function<void(const progress&)>& report) {
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
  double round_seconds = 0;
  bool evaluated = false;
  const int first = sim.rounds_done() + 1;
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
    if (r % options.eval_every == 0 || r == options.rounds) {
      p.evaluated = evaluated = true;
      p.eval = sim.evaluate();
      s.final_accuracy = p.eval.accuracy;
      s.final_loss = p.eval.loss;
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
    if (report) report(p);
  }
  if (!evaluated) {  // resumed at or past the last round
    const auto ev = sim.evaluate();
    s.final_accuracy = ev.accuracy;
    s.final_loss = ev.loss;
  }
  const auto model = sim.global_model();
  s.model_crc32 = crc32_of(reinterpret_cast<const char*>(model.data()), model.size_bytes());
  s.rounds = sim.rounds_done();
  s.rounds_per_s = round_seconds > 0 ? (s.rounds - first + 1) / round_seconds : 0.0;
  s.seconds = since(start);
  s.peak_rss_mb = peak_rss_mb();
  return s;
}

}  // namespace troupe::federated
