#include "client.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::federated::detail {

client_update client::train(const std::shared_ptr<const round_context>& ctx, std::uint64_t id) {
  engine_state& e = *ctx->engine;
  worker_slot& w = e.worker();
  // Under --drift-response cluster, a client moved to the second model trains from it.
  const bool second = ctx->cluster && ctx->second && id < ctx->cluster->size() && (*ctx->cluster)[id];
  const std::vector<float>& global = second ? *ctx->second : *ctx->global;
  const std::size_t dim = e.dim;
  const bool held = holds_state();
  const std::size_t optimizer_bytes = optimizer_.size();
  if (ctx->provisional) {
    undo_ = std::make_unique<undo>(undo{rng_.state, nullptr, optimizer_});
    if (state_) {
      undo_->state = std::make_unique<float[]>(e.state_floats);
      std::copy(state_.get(), state_.get() + e.state_floats, undo_->state.get());
    }
  }
  if (!state_ && e.state_floats > 0) {
    state_ = std::make_unique<float[]>(e.state_floats);  // zero-filled
    e.state_bytes.fetch_add(e.state_floats * sizeof(float), std::memory_order_relaxed);
  }
  std::copy(global.begin(), global.end(), w.model.begin());
  local_job job;
  job.client = id;
  job.round = ctx->info.round;
  job.global = global;
  job.shard = {e.part.indices.data() + offset_, length_};
  job.epochs = e.options.local_epochs;
  job.steps = e.options.local_steps;
  job.batch = e.options.batch;
  job.lr = e.options.lr;
  job.proximal_mu = e.rule.proximal_mu;
  float* ci = state_.get();
  if (e.rule.control_variates) {
    w.correction.resize(dim);
    for (std::size_t p = 0; p < dim; ++p) w.correction[p] = ctx->control[p] - ci[p];
    job.correction = w.correction;
  }
  job.generator = ctx->generator;
  job.generator_weight = ctx->generator_weight;
  const bool qffl = e.rule.loss_power >= 0;
  job.start_loss = qffl;
  // The errors of the model it was sent, on its shard, before it trains.
  const bool alarm = e.detect_drift && detect(e, w, job);
  if (alarm && e.reset_on_alarm) reset_state(e);
  if (e.stateful_optimizer) job.optimizer_state = &optimizer_;
  const local_result r = w.trainer->train(job, w.model, rng_);
  if (optimizer_.size() != optimizer_bytes)
    e.state_bytes.fetch_add(optimizer_.size() - optimizer_bytes, std::memory_order_relaxed);  // modulo 2^64
  if (holds_state() != held) e.state_holders.fetch_add(held ? std::size_t(-1) : 1, std::memory_order_relaxed);

  client_update u;
  u.client = id;
  u.drift_alarm = alarm;
  u.samples = r.samples;
  u.loss = r.loss;
  u.weight = e.rule.uniform_weights ? 1.0 : static_cast<double>(length_);
  u.delta = e.take_buffer(e.rule.control_variates ? 2 * dim : qffl ? dim + 1 : dim);
  for (std::size_t p = 0; p < dim; ++p) u.delta[p] = w.model[p] - global[p];
  if (qffl) {  // q-FedAvg: the loss at the global model, and the weight F^q (fairness.hpp)
    if (!(r.start_loss >= 0) || !std::isfinite(r.start_loss))
      throw std::runtime_error("q-FedAvg: client " + std::to_string(id) + "'s loss at the global model is " +
                               std::to_string(r.start_loss) + " (the model diverged, or the trainer measures no loss)");
    u.weight = std::pow(r.start_loss, e.rule.loss_power);
    u.delta[dim] = static_cast<float>(r.start_loss);
  }
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
  if (r.skipped > 0 || !all_finite(u.delta)) {
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

bool client::detect(engine_state& e, worker_slot& w, const local_job& job) {
  if (!detector_) {
    detector_ = std::make_unique<error_detector>(e.options.drift_detect);
    detector_bytes_ = 0;
  }
  w.trainer->errors(job, job.global, w.errors);
  // In a seeded order, fresh each round: a shard lies in the order the partition built it (under
  // --partition dirichlet, class after class), and the model's error rate differs from class to
  // class, so in shard order the stream would change within one round, with no drift at all.
  splitmix64 g{derive_seed(derive_seed(e.options.seed, stream_drift_order + job.client), static_cast<std::uint64_t>(job.round))};
  for (std::size_t i = w.errors.size(); i > 1; --i) std::swap(w.errors[i - 1], w.errors[g.below(i)]);
  bool alarm = false;
  for (std::uint8_t error : w.errors) alarm = detector_->observe(error != 0) || alarm;
  const std::size_t bytes = detector_->bytes();
  e.state_bytes.fetch_add(bytes - detector_bytes_, std::memory_order_relaxed);  // modulo 2^64
  detector_bytes_ = bytes;
  return alarm;
}

void client::reset_state(engine_state& e) {
  if (detector_) detector_->reset();
  optimizer_.clear();  // fresh moments from an empty state (train() counts the change in bytes)
  if (state_) std::fill(state_.get(), state_.get() + e.state_floats, 0.0f);
}

void client::settle(const std::shared_ptr<const round_context>& ctx, bool applied) {
  if (!undo_) return;
  if (!applied) {
    engine_state& e = *ctx->engine;
    const bool held = holds_state();
    rng_.state = undo_->rng;
    if (undo_->state) {
      state_ = std::move(undo_->state);
    } else if (state_) {  // made by the round given up
      state_.reset();
      e.state_bytes.fetch_sub(e.state_floats * sizeof(float), std::memory_order_relaxed);
    }
    e.state_bytes.fetch_add(undo_->optimizer.size() - optimizer_.size(), std::memory_order_relaxed);  // modulo 2^64
    optimizer_ = std::move(undo_->optimizer);
    if (holds_state() != held) e.state_holders.fetch_add(held ? std::size_t(-1) : 1, std::memory_order_relaxed);
  }
  undo_.reset();
}

client::saved client::save(std::size_t floats) const {
  saved s{rng_.state, {}, optimizer_};
  if (state_) s.state.assign(state_.get(), state_.get() + floats);
  return s;
}

std::pair<std::ptrdiff_t, std::ptrdiff_t> client::restore(saved s, std::size_t floats) {
  const bool held = holds_state();
  rng_.state = s.rng;
  std::ptrdiff_t change = static_cast<std::ptrdiff_t>(s.optimizer.size()) - static_cast<std::ptrdiff_t>(optimizer_.size());
  optimizer_ = std::move(s.optimizer);
  if (s.state.empty()) {
    if (state_) change -= static_cast<std::ptrdiff_t>(floats * sizeof(float));
    state_.reset();
  } else {
    if (!state_) {
      state_ = std::make_unique<float[]>(floats);
      change += static_cast<std::ptrdiff_t>(floats * sizeof(float));
    }
    std::copy(s.state.begin(), s.state.end(), state_.get());
  }
  return {change, holds_state() == held ? 0 : held ? -1 : 1};
}
}  // namespace troupe::federated::detail
