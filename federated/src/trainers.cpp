// The built-in local trainers: "mlp" (the options' model on the shared Fashion-MNIST images)
// and "noop" (no training: the orchestration alone).

#include <algorithm>
#include <cstring>
#include <limits>

#include "batches.hpp"
#include "classifier_stack.hpp"
#include "engine.hpp"
#include "troupe/federated/fedgen.hpp"
#include "troupe/federated/mechanisms.hpp"
#include "troupe/kernels/data.hpp"
#include "troupe/kernels/classifier.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::federated {

namespace {

/// SGD on the options' model (kernels' layers, a kernels::optimizer, stepped by a
/// kernels::classifier) over the shared images (detail::image_batches). With --finetune-from
/// the initial model is the saved one.
class mlp_trainer final : public local_trainer {
public:
  mlp_trainer(shared_data data, const simulation_options& o)
      : data_(std::move(data)), batches_(data_),
        m_(o, batches_.pixels(), data_->classes, /*on_device=*/true), test_limit_(o.test_limit) {
    pixels_ = batches_.pixels();
    if (is_fedgen(o.strategy)) {
      const auto params = m_.model->parameters();
      const int latent = static_cast<int>(params[params.size() - 2]->value.dim(1));
      generator_ = std::make_unique<feature_generator>(data_->classes, latent, parse_fedgen(o.strategy), 0);
      head_offset_ = m_.net->parameter_count() - static_cast<std::size_t>(data_->classes) * (static_cast<std::size_t>(latent) + 1);
    }
  }
  std::size_t dim() const override { return m_.net->parameter_count(); }
  std::span<float> working_model() override { return m_.net->flat_parameters(); }
  void initialize(std::span<float> model, std::uint64_t seed) override { m_.initial_weights(model, seed); }
  local_result train(const local_job& job, std::span<float> model, splitmix64& rng) override {
    local_result r;
    order_.assign(job.shard.begin(), job.shard.end());
    const std::size_t n = order_.size(), batch = static_cast<std::size_t>(job.batch);
    const std::size_t rows_at_most = std::min(batch, n);  // a batch above the shard is the whole shard
    batches_.reserve(rows_at_most);
    const dataset& train = data_->train;
    kernels::gradient_terms terms;
    if (job.proximal_mu > 0) {
      terms.mu = static_cast<float>(job.proximal_mu);
      terms.center = job.global.data();
    }
    if (!job.correction.empty()) terms.correction = job.correction.data();
    m_.opt->groups().front().hp.lr = job.lr;
    m_.net->load_flat(model.data());
    if (job.start_loss) {  // q-FedAvg's F_k: the loss on the whole shard before any step
      r.start_loss = n > 0 ? detail::evaluate_rows(*m_.net, batches_, data_->train, job.shard).loss : 0.0;
      batches_.reserve(rows_at_most);
    }
    const bool distil = generator_ && job.generator_weight > 0 && !job.generator.empty();
    if (distil) {
      start_distillation(job);
      terms.correction = correction_.data();
    }
    if (job.optimizer_state) {  // the client's own moments, or fresh ones the first time
      if (job.optimizer_state->empty())
        m_.opt->reset_state();
      else
        m_.opt->load_state(*job.optimizer_state);
    }
    double loss = 0;
    const std::int64_t step_limit = n > 0 ? job.steps : 0;  // 0: job.epochs passes
    for (int e = 0; step_limit > 0 ? r.steps + r.skipped < step_limit : e < job.epochs; ++e) {
      for (std::size_t i = n; i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
      batches_.prefetch(train, order_.data(), std::min(batch, n));
      for (std::size_t s = 0; s < n; s += batch) {
        if (step_limit > 0 && r.steps + r.skipped == step_limit) break;
        const std::size_t rows = std::min(batch, n - s);
        batches_.gather(train, order_.data() + s, rows);
        // The rows are scattered over 47 MB: ask for the next batch's while this one trains.
        if (s + batch < n) batches_.prefetch(train, order_.data() + s + batch, std::min(batch, n - s - batch));
        if (distil) generator_term(job.generator_weight * generator_->options().batch / job.batch, rng);
        const kernels::batch_outcome b = m_.net->step(batches_.x(), batches_.y(), static_cast<int>(rows), terms);
        loss += b.loss_sum;
        ++(b.applied ? r.steps : r.skipped);
        r.samples += static_cast<std::int64_t>(rows);
      }
    }
    m_.net->store_flat(model.data());
    if (job.optimizer_state) *job.optimizer_state = m_.opt->save_state();
    r.loss = r.samples ? loss / static_cast<double>(r.samples) : 0.0;
    return r;
  }
  evaluation evaluate(std::span<const float> model) override {
    const std::size_t total = static_cast<std::size_t>(data_->test.size());
    const std::size_t n = test_limit_ ? std::min(test_limit_, total) : total;
    if (test_rows_.size() != n) {
      test_rows_.resize(n);
      for (std::size_t i = 0; i < n; ++i) test_rows_[i] = static_cast<std::uint32_t>(i);
    }
    m_.net->load_flat(model.data());
    return detail::evaluate_rows(*m_.net, batches_, data_->test, test_rows_);
  }
  evaluation evaluate_rows(std::span<const float> model, std::span<const std::uint32_t> rows) override {
    m_.net->load_flat(model.data());
    return detail::evaluate_rows(*m_.net, batches_, data_->train, rows);
  }

  /// A forward pass of the shard in chunks.
  void errors(const local_job& job, std::span<const float> model, std::vector<std::uint8_t>& out) override {
    const std::size_t n = job.shard.size(), chunk = 240;
    out.resize(n);
    batches_.reserve(chunk);
    m_.net->load_flat(model.data());
    double loss = 0;
    std::int64_t correct = 0;
    for (std::size_t s = 0; s < n; s += chunk) {
      const std::size_t m = std::min(chunk, n - s);
      batches_.gather(data_->train, job.shard.data() + s, m);
      m_.net->evaluate(batches_.x(), batches_.y(), static_cast<int>(m), loss, correct, out.data() + s);
    }
  }

  void check_optimizer_state(std::span<const std::byte> state) override {
    if (state.empty()) return;
    try {
      m_.opt->load_state(state);  // this trainer's optimizer is loaded again before any use
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(e.what());
    }
  }

private:
  /// Accuracy and mean loss of the loaded model on `rows` of `set` (NaN for no rows).
  /// FedGEN's client (fedgen.hpp): the round's generator, the labels this client holds, and a
  /// correction vector that is zero but for the head.
  void start_distillation(const local_job& job) {
    generator_->load(job.generator);
    correction_.assign(m_.net->parameter_count(), 0.0f);
    bool seen[256] = {};
    const std::uint8_t* labels = data_->train.labels.data<std::uint8_t>().data();
    for (std::uint32_t i : job.shard) seen[labels[i]] = true;
    held_labels_.clear();
    for (int y = 0; y < 256; ++y)
      if (seen[y]) held_labels_.push_back(static_cast<std::uint8_t>(y));
    const std::size_t rows = static_cast<std::size_t>(generator_->options().batch);
    generated_.resize(rows * static_cast<std::size_t>(generator_->latent()));
    generated_labels_.resize(rows);
  }
  /// The gradient of weight * mean CE(head(G(y, eps)), y) with respect to the head, into the
  /// correction, for labels drawn from the client's own.
  void generator_term(double weight, splitmix64& rng) {
    const int rows = generator_->options().batch, c = generator_->classes(), latent = generator_->latent();
    for (auto& y : generated_labels_) y = held_labels_[rng.below(held_labels_.size())];
    generator_->generate(generated_labels_.data(), rows, rng, generated_.data());
    const float* head = m_.net->flat_parameters().data() + head_offset_;
    float* gw = correction_.data() + head_offset_;
    float* gb = gw + static_cast<std::size_t>(c) * latent;
    std::fill(gw, gb + c, 0.0f);
    (void)head_cross_entropy({head, head + static_cast<std::size_t>(c) * latent}, c, latent, generated_.data(),
                             generated_labels_.data(), rows, nullptr, static_cast<float>(weight), gw, gb, nullptr);
  }

  shared_data data_;
  detail::image_batches batches_;
  detail::classifier_stack m_;
  std::size_t test_limit_;
  int pixels_ = 0;
  std::vector<std::uint32_t> order_, test_rows_;
  std::unique_ptr<feature_generator> generator_;  // FedGEN only
  std::size_t head_offset_ = 0;
  std::vector<float> correction_, generated_;
  std::vector<std::uint8_t> held_labels_, generated_labels_;
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
}  // namespace

std::unique_ptr<kernels::sequential> detail::make_model(const std::string& spec) {
  if (spec.rfind("mlp:", 0) == 0) return kernels::make_mlp(spec);
  std::unique_ptr<kernels::layer> l = kernels::make_layer(spec);
  if (auto* s = dynamic_cast<kernels::sequential*>(l.get())) {
    (void)l.release();
    return std::unique_ptr<kernels::sequential>(s);
  }
  auto s = std::make_unique<kernels::sequential>();
  s->add(std::move(l));
  return s;
}

trainer_factory make_trainer_factory(const simulation_options& options) {
  if (options.trainer == "noop")
    return [](const shared_data&) -> std::unique_ptr<local_trainer> { return std::make_unique<noop_trainer>(); };
  if (options.trainer != "mlp") throw std::invalid_argument("unknown trainer '" + options.trainer + "' (use mlp or noop)");
  if (!options.lora.empty()) return detail::make_lora_trainer_factory(options);
  if (!options.continual.empty()) return detail::make_continual_trainer_factory(options);
  trainer_factory mlp = [options](const shared_data& data) -> std::unique_ptr<local_trainer> {
    return std::make_unique<mlp_trainer>(data, options);
  };
  if (!options.drift.empty()) return detail::drift_training(std::move(mlp), options);
  return is_data_attack(options.attack) ? poison_training(std::move(mlp), options.attack, options.seed) : mlp;
}

}  // namespace troupe::federated
