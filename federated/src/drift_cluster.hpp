#pragma once
// --drift-response cluster (FedDrift's split, Jothimurugesan et al., AISTATS 2023, for two
// concepts): the clients whose detector alarmed train, from then on, a second global model by
// FedAvg among themselves; the first model's aggregation no longer sees them.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "troupe/federated/update.hpp"

namespace troupe::federated::detail {

class drift_cluster {
public:
  /// One flag per client (the population).
  void resize(std::size_t clients) { member_.assign(clients, 0); }
  /// The clients moved to the second model (fixed while a round runs).
  const std::vector<char>& members() const noexcept { return member_; }
  std::size_t size() const noexcept { return count_; }
  /// The second model; null before the first alarm.
  const std::shared_ptr<const std::vector<float>>& model() const noexcept { return model_; }

  /// Whether `u` goes to the second model: its client is a member or alarmed this round.
  bool takes(const client_update& u) const { return member_[u.client] || u.drift_alarm; }
  /// Starts a round of `dim` floats per update.
  void begin(std::size_t dim);
  /// A member's update (trained from the second model), or a newly alarmed client's (trained
  /// from `first`, the first model it was sent): FedAvg of the trained models, so the latter
  /// counts as its delta + first - second.
  void add(const client_update& u, const std::vector<float>& first);
  /// The second model moves by server_lr times the weighted mean (made from `first` at the
  /// first alarm); the newly alarmed clients become members. Nothing when no update came.
  void finish(const std::vector<float>& first, double server_lr);

private:
  std::vector<char> member_;
  std::size_t count_ = 0;
  std::shared_ptr<const std::vector<float>> model_;
  std::vector<double> sum_, plain_;
  double weight_ = 0;
  std::size_t added_ = 0;
  std::vector<std::uint64_t> joining_;
};

}  // namespace troupe::federated::detail
