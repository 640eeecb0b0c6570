#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/federated/update.hpp"

namespace troupe::federated {

void aggregator::add_encoded(std::uint64_t, double, std::span<const std::uint32_t>) {
  throw std::logic_error("aggregator '" + name() + "' does not take encoded updates");
}

void update_transform::load_state(std::span<const double> state) { check_state(state); }

void update_transform::check_state(std::span<const double> state) const {
  if (!state.empty())
    throw std::invalid_argument("transform '" + name() + "' keeps no state between rounds; the checkpoint has " +
                                std::to_string(state.size()) + " values for it");
}

namespace {

class weighted_mean final : public aggregator {
public:
  std::string name() const override { return "weighted-mean"; }
  void begin(const round_info& round) override {
    sum_.assign(round.dim, 0.0);
    plain_.clear();
    weight_ = 0;
    count_ = 0;
  }
  void add(std::uint64_t client, double weight, std::span<const float> delta) override {
    if (delta.size() != sum_.size())
      throw std::invalid_argument("client " + std::to_string(client) + " sent " + std::to_string(delta.size()) +
                                  " floats; the round expects " + std::to_string(sum_.size()));
    if (!(weight >= 0) || !std::isfinite(weight))
      throw std::invalid_argument("weighted-mean: client " + std::to_string(client) + "'s weight is " +
                                  std::to_string(weight) + "; weights must be finite and >= 0");
    const std::size_t n = delta.size();
    const float* d = delta.data();
    // NaN or an infinity anywhere (all exponent bits set): one vectorized pass, then a search
    // only for the message.
    std::uint32_t nonfinite = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, d + i, sizeof bits);
      nonfinite |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (nonfinite)
      for (std::size_t i = 0; i < n; ++i)
        if (!std::isfinite(d[i]))
          throw std::invalid_argument("weighted-mean: client " + std::to_string(client) + "'s update holds " +
                                      std::to_string(d[i]) + " at coordinate " + std::to_string(i) +
                                      "; updates must be finite");
    if (!std::isfinite(weight_ + weight))
      throw std::invalid_argument("weighted-mean: the weights overflow a double (client " + std::to_string(client) +
                                  "'s is " + std::to_string(weight) + ")");
    double* s = sum_.data();
    for (std::size_t i = 0; i < n; ++i) s[i] += weight * static_cast<double>(d[i]);
    // The plain sum as well, only while every weight so far is zero (rare; see finish).
    if (weight == 0 && weight_ == 0) {
      plain_.resize(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) plain_[i] += d[i];
    }
    weight_ += weight;
    ++count_;
  }
  std::vector<float> finish() override {
    if (count_ == 0) throw std::logic_error("weighted mean of no update");
    std::vector<float> out(sum_.size());
    // Finite weights and updates whose products still overflow (weights near 1e308): an error
    // rather than an infinite or NaN mean.
    for (double x : sum_)
      if (!std::isfinite(x))
        throw std::invalid_argument("weighted-mean: the weighted sum overflows a double (the weights total " +
                                    std::to_string(weight_) + ")");
    if (weight_ > 0) {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(sum_[i] / weight_);
    } else {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(plain_[i] / static_cast<double>(count_));
    }
    return out;
  }

private:
  std::vector<double> sum_, plain_;
  double weight_ = 0;
  std::size_t count_ = 0;
};

}  // namespace

std::unique_ptr<aggregator> make_weighted_mean() { return std::make_unique<weighted_mean>(); }

}  // namespace troupe::federated
