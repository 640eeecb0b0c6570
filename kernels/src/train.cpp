#include "troupe/kernels/train.hpp"

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

double evaluate(sequential& model, const tensor& x, const tensor& labels) {
  std::int64_t correct = 0;
  const std::int64_t n = x.dim(0), chunk = 1000;
  for (std::int64_t b = 0; b < n; b += chunk) {
    const std::int64_t e = std::min(n, b + chunk);
    saved_activations keep;
    tensor logits = model.forward(x.slice(b, e), keep, false);
    correct += count_correct(logits, labels.slice(b, e));
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}
}  // namespace

train_result train(const train_options& o, const std::function<void(const train_progress&)>& report) {
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

  hyperparameters hp;
  hp.lr = o.lr;
  hp.weight_decay = o.weight_decay.value_or(kind == optimizer_kind::sgd ? 0.0 : 1e-2);
  if (kind == optimizer_kind::sgd) hp.momentum = 0.9;
  optimizer opt(kind, {{model->parameters(), hp, {.storage = storage}}});
  const std::int64_t n = data.train.size();
  const std::int64_t steps_per_epoch = (n + o.batch - 1) / o.batch;
  const double total_steps = static_cast<double>(steps_per_epoch) * o.epochs;
  if (o.cosine)
    opt.set_lr_schedule([total_steps](std::int64_t step, double base) {
      return base * 0.5 * (1 + std::cos(M_PI * static_cast<double>(step - 1) / total_steps));
    });

  train_result result;
  double training_seconds = 0;
  std::int64_t samples = 0;
  tensor x, y, dlogits;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto order = shuffled_indices(n, o.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    batch_iterator batches(order, o.batch);
    const auto t0 = clock_type::now();
    double loss_sum = 0;
    std::int64_t step = 0;
    while (auto rows = batches.next()) {
      x = gather_rows(train_x, *rows);
      y = gather_rows(data.train.labels.reshape({n, 1}), *rows).reshape({-1});
      saved_activations keep;
      opt.zero_grad();
      tensor logits = model->forward(x, keep, true);
      const double loss = softmax_cross_entropy(logits, y, dlogits);
      // A run that diverged (too large a learning rate) has nothing worth going on with or
      // keeping: say so at once rather than train on NaN and save useless weights.
      if (!std::isfinite(loss))
        throw std::runtime_error("training diverged at epoch " + std::to_string(epoch) + ", step " +
                                 std::to_string(step + 1) + ": the loss is not finite (lower --lr)" +
                                 (o.save.empty() ? "" : "; nothing was saved"));
      loss_sum += loss;
      model->backward(dlogits, keep);
      opt.step();
      ++step;
      samples += static_cast<std::int64_t>(rows->size());
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
    const double acc = evaluate(*model, test_x, data.test.labels);
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
  if (!o.save.empty()) save_weights(*model, o.save);
  result.test_accuracy = result.epoch_accuracy.back();
  result.samples_per_s = static_cast<double>(samples) / training_seconds;
  result.seconds = since(start);
  return result;
}

}  // namespace troupe::kernels
