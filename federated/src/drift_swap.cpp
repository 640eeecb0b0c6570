// The injected drift (--drift swap:ROUND:FRACTION:A-B): the drifted clients, and the trainer
// through which, from ROUND on, they train (and report their errors) on a copy of their
// examples with labels A and B swapped.

#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "engine.hpp"
#include "troupe/federated/drift.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {

namespace {

std::uint8_t swapped(std::uint8_t y, const drift_swap& d) {
  return y == d.a ? static_cast<std::uint8_t>(d.b) : y == d.b ? static_cast<std::uint8_t>(d.a) : y;
}

/// The training set followed by its copy with labels swapped (row i + N is row i swapped), and
/// the test set with labels swapped (the drifted clients' task).
struct swapped_data {
  shared_data extended, swapped_test;
  std::uint32_t offset = 0;
};

swapped_data make_swapped(const fashion_mnist& data, const drift_swap& d) {
  if (d.a >= data.classes || d.b >= data.classes)
    throw std::invalid_argument("--drift: labels " + std::to_string(d.a) + " and " + std::to_string(d.b) +
                                " must both be among the data's " + std::to_string(data.classes) + " classes");
  if (data.train.images.type() != dtype::u8 || data.train.images.rank() != 3)
    throw std::invalid_argument("--drift copies the training images: it needs u8 images [N, H, W], not " +
                                data.train.images.str());
  const std::int64_t n = data.train.size();
  if (n >= (std::int64_t{1} << 31)) throw std::invalid_argument("--drift: the training set is too large");
  const auto un = static_cast<std::size_t>(n);
  const std::size_t pixels = static_cast<std::size_t>(data.train.images.numel() / std::max<std::int64_t>(1, n));
  auto out = std::make_shared<fashion_mnist>(data);  // the classes, statistics and test set as they are
  out->train.images = tensor::empty({2 * n, data.train.images.dim(1), data.train.images.dim(2)}, dtype::u8);
  out->train.labels = tensor::empty({2 * n}, dtype::u8);
  auto images = out->train.images.data<std::uint8_t>();
  auto labels = out->train.labels.data<std::uint8_t>();
  const auto src_images = data.train.images.data<std::uint8_t>();
  const auto src_labels = data.train.labels.data<std::uint8_t>();
  std::memcpy(images.data(), src_images.data(), un * pixels);
  std::memcpy(images.data() + un * pixels, src_images.data(), un * pixels);
  for (std::size_t i = 0; i < un; ++i) {
    labels[i] = src_labels[i];
    labels[un + i] = swapped(src_labels[i], d);
  }
  auto test = std::make_shared<fashion_mnist>(data);
  test->test.labels = tensor::empty({data.test.size()}, dtype::u8);
  const auto tl = data.test.labels.data<std::uint8_t>();
  auto sl = test->test.labels.data<std::uint8_t>();
  for (std::size_t i = 0; i < tl.size(); ++i) sl[i] = swapped(tl[i], d);
  return {out, test, static_cast<std::uint32_t>(n)};
}

class drift_trainer final : public local_trainer {
public:
  drift_trainer(std::unique_ptr<local_trainer> inner, std::unique_ptr<local_trainer> swapped_test, std::uint32_t offset,
                drift_swap d, std::shared_ptr<const std::vector<char>> drifted)
      : inner_(std::move(inner)), swapped_(std::move(swapped_test)), offset_(offset), d_(d), drifted_(std::move(drifted)) {}
  std::size_t dim() const override { return inner_->dim(); }
  void initialize(std::span<float> model, std::uint64_t seed) override { inner_->initialize(model, seed); }
  std::span<float> working_model() override { return inner_->working_model(); }
  local_result train(const local_job& job, std::span<float> model, splitmix64& rng) override {
    return inner_->train(drifted(job) ? moved(job) : job, model, rng);
  }
  void errors(const local_job& job, std::span<const float> model, std::vector<std::uint8_t>& out) override {
    inner_->errors(drifted(job) ? moved(job) : job, model, out);
  }
  /// The test set as it is, and "swapped_accuracy": on the test set with A and B swapped.
  evaluation evaluate(std::span<const float> model) override {
    evaluation e = inner_->evaluate(model);
    e.metrics.emplace_back("swapped_accuracy", swapped_->evaluate(model).accuracy);
    return e;
  }
  void check_optimizer_state(std::span<const std::byte> state) override { inner_->check_optimizer_state(state); }

private:
  bool drifted(const local_job& job) const {
    return job.round >= d_.round && job.client < drifted_->size() && (*drifted_)[job.client];
  }
  /// The job on the swapped copy of the client's examples.
  local_job moved(const local_job& job) {
    shard_.assign(job.shard.begin(), job.shard.end());
    for (auto& i : shard_) i += offset_;
    local_job m = job;
    m.shard = shard_;
    return m;
  }

  std::unique_ptr<local_trainer> inner_, swapped_;
  std::vector<std::uint32_t> shard_;
  std::uint32_t offset_;
  drift_swap d_;
  std::shared_ptr<const std::vector<char>> drifted_;
};

}  // namespace

trainer_factory detail::drift_training(trainer_factory inner, const simulation_options& o) {
  const drift_swap d = parse_drift(o.drift);
  auto drifted = std::make_shared<const std::vector<char>>(drifted_clients(d, o.clients, o.seed));
  struct shared_state {
    std::once_flag once;
    swapped_data data;
  };
  auto state = std::make_shared<shared_state>();
  return [inner = std::move(inner), d, drifted, state](const shared_data& data) -> std::unique_ptr<local_trainer> {
    if (!data) throw std::invalid_argument("--drift needs the training data (the noop trainer has none)");
    std::call_once(state->once, [&] { state->data = make_swapped(*data, d); });
    return std::make_unique<drift_trainer>(inner(state->data.extended), inner(state->data.swapped_test), state->data.offset,
                                           d, drifted);
  };
}

}  // namespace troupe::federated
