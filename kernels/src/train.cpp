#include "troupe/kernels/train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "troupe/kernels/data.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"
#include "troupe/kernels/weights.hpp"

#include "checksum.hpp"

namespace troupe::kernels {

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double evaluate(train_engine& engine, const tensor& x, const tensor& labels) {
  std::int64_t correct = 0;
  const std::int64_t n = x.dim(0), chunk = 1000;
  for (std::int64_t b = 0; b < n; b += chunk) {
    const std::int64_t e = std::min(n, b + chunk);
    correct += count_correct(engine.predict(x.slice(b, e)), labels.slice(b, e));
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

/// The whole model and its optimizer, in this thread.
class local_engine final : public train_engine {
public:
  explicit local_engine(const engine_setup& s)
      : model_(s.model), opt_(s.kind, {{s.model.parameters(), s.hp, s.state}}) {
    if (s.cosine_steps != 0) opt_.set_lr_schedule(cosine_lr(s.cosine_steps));
  }
  step_outcome step(const tensor& x, const tensor& labels) override {
    saved_activations keep;
    opt_.zero_grad();
    tensor logits = model_.forward(x, keep, true);
    const double loss = softmax_cross_entropy(logits, labels, dlogits_);
    model_.backward(dlogits_, keep);
    return {loss, opt_.step()};
  }
  tensor predict(const tensor& x) override {
    saved_activations keep;
    return model_.forward(x, keep, false);
  }
  void sync(layer&) override {}  // trained in place

private:
  sequential& model_;
  optimizer opt_;
  tensor dlogits_;
};
}  // namespace

train_result train(const train_options& o, const std::function<void(const train_progress&)>& report,
                   const engine_factory& make_engine) {
  if (o.dataset != "fashion-mnist")
    throw std::invalid_argument("dataset '" + o.dataset + "' is not known (use fashion-mnist)");
  if (o.epochs < 1) throw std::invalid_argument("--epochs must be at least 1");
  if (o.batch < 1) throw std::invalid_argument("--batch must be at least 1");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw std::invalid_argument("--lr must be a positive number");
  if (o.weight_decay && (!(*o.weight_decay >= 0) || !std::isfinite(*o.weight_decay)))
    throw std::invalid_argument("--weight-decay must be a number >= 0");
  if (!o.save.empty())  // before training, not after it
    check_file(check_writable, o.save,
               [&](const std::string& why) { throw std::invalid_argument("--save " + o.save + ": " + why); });
  const auto storage = parse_state_storage(o.state);
  const auto kind = parse_optimizer_kind(o.optimizer);
  if (const auto outputs = mlp_sizes(o.model).back(); outputs != fashion_mnist_classes)
    throw std::invalid_argument("model '" + o.model + "' has " + std::to_string(outputs) + " outputs; the dataset has " +
                                std::to_string(fashion_mnist_classes) + " classes");
  auto model = make_mlp(o.model);
  for (const auto& name : o.fp32_params) {
    const auto params = model->parameters();
    if (std::none_of(params.begin(), params.end(), [&](const parameter* p) { return p->name == name; })) {
      std::string names;
      for (const auto* p : params) names += (names.empty() ? "" : ", ") + p->name;
      throw std::invalid_argument("--fp32-params: '" + name + "' is no parameter of " + o.model + " (" + names + ")");
    }
  }

  const auto start = clock_type::now();
  const auto data = load_fashion_mnist(o.data_dir.empty() ? fashion_mnist_dir : o.data_dir);
  if (data.train.size() < 1 || data.test.size() < 1)
    throw std::invalid_argument("the dataset has " + std::to_string(data.train.size()) + " training and " +
                                std::to_string(data.test.size()) + " test examples: training needs both");
  const tensor train_x = normalize(data.train.images), test_x = normalize(data.test.images);
  if (o.batch > data.train.size())
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + " is larger than the " +
                                std::to_string(data.train.size()) + " training examples");
  if (train_x.dim(1) != model->parameters().front()->value.dim(1))
    throw std::invalid_argument("model '" + o.model + "' takes " +
                                std::to_string(model->parameters().front()->value.dim(1)) +
                                " inputs; the images have " + std::to_string(train_x.dim(1)) + " pixels");
  model->initialize(o.seed);
  if (!o.load.empty()) load_weights(*model, o.load);

  engine_setup setup{.model = *model, .sizes = mlp_sizes(o.model), .kind = kind, .hp = {}, .state = {.storage = storage, .fp32_params = o.fp32_params},
                     .cosine_steps = 0};
  setup.hp.lr = o.lr;
  setup.hp.weight_decay = o.weight_decay.value_or(kind == optimizer_kind::sgd ? 0.0 : 1e-2);
  if (kind == optimizer_kind::sgd) setup.hp.momentum = 0.9;
  const std::int64_t n = data.train.size();
  const std::int64_t steps_per_epoch = (n + o.batch - 1) / o.batch;
  if (o.cosine) setup.cosine_steps = static_cast<double>(steps_per_epoch) * o.epochs;
  std::unique_ptr<train_engine> engine = make_engine ? make_engine(setup) : std::make_unique<local_engine>(setup);
  const std::int64_t granule = engine->granule();
  if (o.batch % granule != 0)
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + " is not a multiple of " + std::to_string(granule) +
                                " (the microbatches of a step)");

  train_result result;
  double training_seconds = 0;
  std::int64_t samples = 0;
  tensor x, y;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto order = shuffled_indices(n, o.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    batch_iterator batches(order, o.batch);
    const auto t0 = clock_type::now();
    double loss_sum = 0;
    std::int64_t step = 0;
    while (auto batch = batches.next()) {
      const auto rows = batch->first(static_cast<std::size_t>(static_cast<std::int64_t>(batch->size()) / granule * granule));
      if (rows.empty()) continue;  // a last batch smaller than the granule
      x = gather_rows(train_x, rows);
      y = gather_rows(data.train.labels.reshape({n, 1}), rows).reshape({-1});
      const auto [loss, applied] = engine->step(x, y);
      if (!applied) ++result.skipped_steps;
      // A run that diverged (too large a learning rate) has nothing worth going on with or
      // keeping: say so at once rather than train on NaN and save useless weights.
      if (!std::isfinite(loss))
        throw std::runtime_error("training diverged at epoch " + std::to_string(epoch) + ", step " +
                                 std::to_string(step + 1) + ": the loss is not finite (lower --lr)" +
                                 (o.save.empty() ? "" : "; nothing was saved"));
      loss_sum += loss;
      ++step;
      samples += static_cast<std::int64_t>(rows.size());
      if (report && (step % 50 == 0 || step == steps_per_epoch)) {
        train_progress p;
        p.epoch = epoch;
        p.step = step;
        p.steps = steps_per_epoch;
        p.loss = loss_sum / static_cast<double>(step);
        p.samples_per_s = static_cast<double>(samples) / (training_seconds + since(t0));
        report(p);
      }
    }
    training_seconds += since(t0);
    const double acc = evaluate(*engine, test_x, data.test.labels);
    result.epoch_accuracy.push_back(acc);
    if (report) {
      train_progress p;
      p.epoch = epoch;
      p.step = p.steps = steps_per_epoch;
      p.loss = loss_sum / static_cast<double>(step);
      p.samples_per_s = static_cast<double>(samples) / training_seconds;
      p.epoch_done = true;
      p.test_accuracy = acc;
      report(p);
    }
  }
  if (!o.save.empty()) {
    engine->sync(*model);
    save_weights(*model, o.save);
  }
  result.test_accuracy = result.epoch_accuracy.back();
  result.samples_per_s = static_cast<double>(samples) / training_seconds;
  result.seconds = since(start);
  return result;
}

}  // namespace troupe::kernels
