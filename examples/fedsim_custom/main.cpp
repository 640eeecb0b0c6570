// fedsim_custom: a client model and a server strategy of your own, run by the same engine as
// `troupe fedsim` (client actors, sampling, streaming aggregation, determinism).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <vector>

#include <troupe/federated/simulation.hpp>
#include <troupe/kernels/data.hpp>

namespace fl = troupe::federated;

// The client: softmax regression on raw pixels (10 rows of 784 weights and a bias), trained by
// SGD one example at a time. The engine makes one per worker thread, so it may keep scratch.
class softmax_regression final : public fl::local_trainer {
public:
  explicit softmax_regression(fl::shared_data data) : data_(std::move(data)) {}
  std::size_t dim() const override { return 10 * 785; }
  void initialize(std::span<float> w, std::uint64_t) override { std::fill(w.begin(), w.end(), 0.0f); }

  fl::local_result train(const fl::local_job& job, std::span<float> w, fl::splitmix64& rng) override {
    fl::local_result r;
    std::vector<std::uint32_t> order(job.shard.begin(), job.shard.end());
    for (int e = 0; e < job.epochs; ++e) {
      for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
      for (std::uint32_t row : order) {
        const int y = predict(w, data_->train, row);
        r.loss -= std::log(std::max(p_[y], 1e-12f));
        for (int c = 0; c < 10; ++c) {  // d loss / d logit c = p_c - [c == y]
          const float g = static_cast<float>(job.lr) * (p_[c] - (c == y ? 1.0f : 0.0f));
          for (int k = 0; k < 784; ++k) w[c * 785 + k] -= g * x_[k];
          w[c * 785 + 784] -= g;
        }
        ++r.steps, ++r.samples;
      }
    }
    if (r.samples) r.loss /= static_cast<double>(r.samples);
    return r;
  }

  fl::evaluation evaluate(std::span<const float> w) override {
    fl::evaluation ev;
    const std::int64_t n = data_->test.size();
    for (std::int64_t i = 0; i < n; ++i) {
      const int y = predict(w, data_->test, static_cast<std::uint32_t>(i));
      ev.loss -= std::log(std::max(p_[y], 1e-12f)) / static_cast<double>(n);
      ev.accuracy += (std::max_element(p_, p_ + 10) - p_ == y) / static_cast<double>(n);
    }
    return ev;
  }

private:
  // Fills x_ (pixels scaled to [0, 1]) and p_ = softmax(W x + b); returns the label.
  int predict(std::span<const float> w, const troupe::dataset& d, std::uint32_t row) {
    const std::uint8_t* px = d.images.data<std::uint8_t>().data() + std::size_t{row} * 784;
    for (int k = 0; k < 784; ++k) x_[k] = px[k] / 255.0f;
    float top = -1e30f, sum = 0;
    for (int c = 0; c < 10; ++c) {
      float z = w[c * 785 + 784];
      for (int k = 0; k < 784; ++k) z += w[c * 785 + k] * x_[k];
      top = std::max(top, p_[c] = z);
    }
    for (float& p : p_) sum += (p = std::exp(p - top));
    for (float& p : p_) p /= sum;
    return d.labels.data<std::uint8_t>()[row];
  }

  fl::shared_data data_;
  float x_[784], p_[10];
};

// The strategy: FedAvg whose server step shrinks as 1 / sqrt(round).
class decaying_fedavg final : public fl::server_strategy {
public:
  std::string name() const override { return "decaying-fedavg"; }
  void apply(std::span<float> x, std::span<const float> delta, const fl::round_info& round) override {
    const float lr = 1.0f / std::sqrt(static_cast<float>(round.round));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += lr * delta[i];
  }
};

int run() {
  fl::simulation_options o;
  o.clients = 50, o.per_round = 10, o.partition = "dirichlet:1.0", o.lr = 0.01, o.seed = 1;
  o.train_limit = 10000, o.test_limit = 2000;  // a quick run
  fl::simulation sim(o, nullptr, [](const fl::shared_data& d) { return std::make_unique<softmax_regression>(d); });
  sim.set_strategy(std::make_unique<decaying_fedavg>());
  fl::evaluation ev;
  for (int r = 1; r <= 20; ++r) {
    const fl::round_report rep = sim.run_round();
    if (r % 5) continue;
    ev = sim.evaluate();
    std::printf("round %2d  train loss %.3f  test accuracy %.3f\n", r, rep.train_loss, ev.accuracy);
  }
  if (ev.accuracy < 0.7) return std::printf("fedsim_custom: FAILED: a test accuracy of %.3f, expected above 0.7\n", ev.accuracy), 1;
  std::printf("a custom client and strategy on %zu client actors\n", sim.population());
  std::printf("fedsim_custom: all checks passed\n");
  return 0;
}

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fedsim_custom: FAILED: %s\n", e.what());
    return 1;
  }
}
