// Data attacks: malicious clients train on poisoned copies of their examples.

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "spec.hpp"
#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/robust.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {

namespace {

struct data_attack {
  bool backdoor = false;
  double fraction = 0;
  int target = 0;
};

data_attack parse_data_attack(const std::string& spec) {
  auto number = [&](const std::string& text) { return detail::spec_number(text, "'" + spec + "'"); };
  const auto first = spec.find(':');
  const std::string name = spec.substr(0, first);
  data_attack a;
  if (name == "label-flip" && first != std::string::npos && spec.find(':', first + 1) == std::string::npos) {
    a.fraction = number(spec.substr(first + 1));
  } else if (name == "backdoor" && first != std::string::npos) {
    const auto second = spec.find(':', first + 1);
    if (second == std::string::npos || spec.find(':', second + 1) != std::string::npos)
      throw std::invalid_argument("'" + spec + "': use backdoor:P:T (fraction P, target class T)");
    a.backdoor = true;
    a.fraction = number(spec.substr(first + 1, second - first - 1));
    const double t = number(spec.substr(second + 1));
    if (t < 0 || t > 255 || t != static_cast<int>(t))
      throw std::invalid_argument("'" + spec + "': the target class must be a whole number in [0, 255]");
    a.target = static_cast<int>(t);
  } else {
    throw std::invalid_argument("unknown data attack '" + spec + "' (label-flip:P or backdoor:P:T)");
  }
  if (!(a.fraction >= 0 && a.fraction <= 1))
    throw std::invalid_argument("'" + spec + "': the malicious fraction must be in [0, 1]");
  return a;
}

/// The training set followed by its poisoned copy (row i + N is row i poisoned), and for a
/// backdoor the test images of other classes with the trigger, labelled with the target.
struct poisoned_data {
  shared_data extended, triggered_test;
  std::uint32_t offset = 0;
};

poisoned_data poison(const fashion_mnist& data, const data_attack& a) {
  if (data.train.images.type() != dtype::u8 || data.train.images.rank() != 3)
    throw std::invalid_argument("the data attacks stamp and flip images: they need u8 images [N, H, W], not " +
                                data.train.images.str());
  if (a.backdoor && a.target >= data.classes)
    throw std::invalid_argument("the backdoor's target class " + std::to_string(a.target) + " is not one of the data's " +
                                std::to_string(data.classes) + " classes");
  const std::int64_t n = data.train.size();
  if (n >= (std::int64_t{1} << 31)) throw std::invalid_argument("data attacks: the training set is too large");
  const std::size_t pixels = static_cast<std::size_t>(data.train.images.numel() / std::max<std::int64_t>(1, n));
  const int side = static_cast<int>(data.train.images.dim(1));
  auto out = std::make_shared<fashion_mnist>();
  out->test = data.test;
  out->train.images = tensor::empty({2 * n, data.train.images.dim(1), data.train.images.dim(2)}, dtype::u8);
  out->train.labels = tensor::empty({2 * n}, dtype::u8);
  auto images = out->train.images.data<std::uint8_t>();
  auto labels = out->train.labels.data<std::uint8_t>();
  const auto src_images = data.train.images.data<std::uint8_t>();
  const auto src_labels = data.train.labels.data<std::uint8_t>();
  const auto un = static_cast<std::size_t>(n);
  std::memcpy(images.data(), src_images.data(), un * pixels);
  std::memcpy(images.data() + un * pixels, src_images.data(), un * pixels);
  std::memcpy(labels.data(), src_labels.data(), un);
  for (std::size_t i = 0; i < un; ++i) {
    if (a.backdoor) {
      stamp_backdoor(images.subspan((un + i) * pixels, pixels), side);
      labels[un + i] = static_cast<std::uint8_t>(a.target);
    } else {
      labels[un + i] = flip_label(src_labels[i], data.classes);
    }
  }
  poisoned_data p;
  p.offset = static_cast<std::uint32_t>(n);
  p.extended = out;
  if (a.backdoor) {
    const auto test_labels = data.test.labels.data<std::uint8_t>();
    const auto test_images = data.test.images.data<std::uint8_t>();
    std::vector<std::int64_t> rows;
    for (std::size_t i = 0; i < test_labels.size(); ++i)
      if (test_labels[i] != a.target) rows.push_back(static_cast<std::int64_t>(i));
    auto trig = std::make_shared<fashion_mnist>();
    trig->train = data.train;
    trig->test.images = tensor::empty({static_cast<std::int64_t>(rows.size()), data.test.images.dim(1), data.test.images.dim(2)}, dtype::u8);
    trig->test.labels = tensor::empty({static_cast<std::int64_t>(rows.size())}, dtype::u8);
    auto ti = trig->test.images.data<std::uint8_t>();
    auto tl = trig->test.labels.data<std::uint8_t>();
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::memcpy(ti.data() + r * pixels, test_images.data() + static_cast<std::size_t>(rows[r]) * pixels, pixels);
      stamp_backdoor(ti.subspan(r * pixels, pixels), side);
      tl[r] = static_cast<std::uint8_t>(a.target);
    }
    p.triggered_test = trig;
  }
  return p;
}

class poisoned_trainer final : public local_trainer {
public:
  poisoned_trainer(std::unique_ptr<local_trainer> inner, std::unique_ptr<local_trainer> triggered, std::uint32_t offset,
                   double fraction, std::uint64_t seed)
      : inner_(std::move(inner)), triggered_(std::move(triggered)), offset_(offset), fraction_(fraction), seed_(seed) {}
  std::size_t dim() const override { return inner_->dim(); }
  void initialize(std::span<float> model, std::uint64_t seed) override { inner_->initialize(model, seed); }
  local_result train(const local_job& job, std::span<float> model, splitmix64& rng) override {
    if (!is_malicious(job.client, fraction_, seed_)) return inner_->train(job, model, rng);
    shard_.assign(job.shard.begin(), job.shard.end());
    for (auto& i : shard_) i += offset_;
    local_job poisoned = job;
    poisoned.shard = shard_;
    return inner_->train(poisoned, model, rng);
  }
  /// The clean rows (a client's held-out examples are measured as they are).
  evaluation evaluate_rows(std::span<const float> model, std::span<const std::uint32_t> rows) override {
    return inner_->evaluate_rows(model, rows);
  }
  evaluation evaluate(std::span<const float> model) override {
    evaluation e = inner_->evaluate(model);
    if (triggered_) e.metrics.emplace_back("backdoor_success", triggered_->evaluate(model).accuracy);
    return e;
  }

private:
  std::unique_ptr<local_trainer> inner_, triggered_;
  std::vector<std::uint32_t> shard_;
  std::uint32_t offset_;
  double fraction_;
  std::uint64_t seed_;
};

}  // namespace

bool is_data_attack(const std::string& spec) {
  return spec.rfind("label-flip", 0) == 0 || spec.rfind("backdoor", 0) == 0;
}

trainer_factory poison_training(trainer_factory inner, const std::string& spec, std::uint64_t seed) {
  const data_attack attack = parse_data_attack(spec);
  struct shared_state {
    std::once_flag once;
    poisoned_data data;
  };
  auto state = std::make_shared<shared_state>();
  return [inner = std::move(inner), attack, seed, state](const shared_data& data) -> std::unique_ptr<local_trainer> {
    if (!data) throw std::invalid_argument("data attacks need the training data");
    std::call_once(state->once, [&] { state->data = poison(*data, attack); });
    auto triggered = state->data.triggered_test ? inner(state->data.triggered_test) : nullptr;
    return std::make_unique<poisoned_trainer>(inner(state->data.extended), std::move(triggered), state->data.offset,
                                              attack.fraction, seed);
  };
}

}  // namespace troupe::federated
