#include "troupe/pipeline/profile.hpp"

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>

namespace troupe::pipeline {

layer_profile profile_layers(kernels::sequential& model, std::int64_t batch, int repeats,
                             std::uint64_t seed) {
  if (batch < 1) throw std::invalid_argument("profiling needs a batch of at least 1 row");
  if (repeats < 1 || repeats > max_profile_repeats)
    throw std::invalid_argument("profiling takes 1 to " + std::to_string(max_profile_repeats) + " repetitions, not " +
                                std::to_string(repeats));
  auto params = model.parameters();
  if (params.empty() || params.front()->value.rank() != 2)
    throw std::invalid_argument("profiling needs a model whose first layer has a weight [out, in]");
  model.initialize(seed);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  std::normal_distribution<float> normal(0, 1);
  tensor x = tensor::empty({batch, params.front()->value.dim(1)});
  for (float& v : x.data<float>()) v = normal(rng);

  layer_profile out;
  for (std::size_t i = 0; i < model.size(); ++i) {
    auto& l = model.at(i);
    std::vector<double> times;
    std::size_t held = 0;
    tensor y;
    for (int r = 0; r < repeats + 1; ++r) {  // the first run warms caches and is not counted
      kernels::saved_activations keep;
      const auto t0 = std::chrono::steady_clock::now();
      y = l.forward(x, keep, true);
      held = keep.bytes();
      tensor dy = tensor::zeros(y.shape());
      l.backward(dy, keep);
      const auto t1 = std::chrono::steady_clock::now();
      if (r > 0) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
    out.names.push_back(l.describe());
    out.cost_us.push_back(times[times.size() / 2]);
    out.activation_bytes.push_back(static_cast<double>(held));
    x = y;
  }
  for (auto* p : params)
    for (float& g : p->grad.data<float>()) g = 0;
  return out;
}

}  // namespace troupe::pipeline
