// Concept drift in the engine: the options' checks and the second model of
// --drift-response cluster.

#include <stdexcept>

#include "drift_cluster.hpp"
#include "engine.hpp"
#include "troupe/federated/drift.hpp"

namespace troupe::federated::detail {

void check_drift_options(const simulation_options& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  const bool any = !o.drift.empty() || !o.drift_detect.empty() || !o.drift_response.empty();
  if (!any) return;
  if (!o.drift.empty()) {
    const drift_swap d = parse_drift(o.drift);
    if (d.round > o.rounds)
      fail("--drift '" + o.drift + "': round " + std::to_string(d.round) + " is after the last round (--rounds " +
           std::to_string(o.rounds) + ")");
    if (is_data_attack(o.attack))
      fail("--drift with --attack " + o.attack + ": both change the clients' labels; run them apart");
  }
  if (!o.drift_detect.empty() && o.drift_detect != "ddm" && o.drift_detect != "adwin")
    fail("--drift-detect '" + o.drift_detect + "': use ddm or adwin");
  if (!o.drift_response.empty()) {
    if (o.drift_response != "reset" && o.drift_response != "cluster")
      fail("--drift-response '" + o.drift_response + "': use reset or cluster");
    if (o.drift_detect.empty()) fail("--drift-response " + o.drift_response + " acts on alarms: give --drift-detect ddm or adwin");
  }
  const std::string flags = !o.drift.empty() ? "--drift" : "--drift-detect";
  if (o.trainer != "mlp") fail(flags + " needs --trainer mlp (the noop trainer has no data and makes no errors)");
  if (!o.lora.empty()) fail(flags + " with --lora is not supported: the LoRA trainer measures no per-example errors");
  if (!o.async.empty())
    fail(flags + " with --async is not supported: the drift and the detectors' streams are per synchronous round");
  if (!o.checkpoint.empty())
    fail(flags + " with --checkpoint is not supported: the detectors' state and the second model are not saved");
  if (o.drift_response == "reset" && o.strategy == "scaffold")
    fail("--drift-response reset with --strategy scaffold: resetting a client's control variate would leave the "
         "server's off the mean of the clients'");
  if (o.drift_response == "cluster") {
    const std::string why = "--drift-response cluster trains the second model by FedAvg of the alarmed clients' plain updates";
    if (o.strategy != "fedavg") fail(why + ": use --strategy fedavg (not " + o.strategy + ")");
    if (o.secagg) fail(why + "; with --secagg the server sees only one sum and cannot split it");
    if (o.dp_clip != 0 || o.dp_noise != 0 || o.dp_adaptive)
      fail(why + "; DP-FedAvg's noise covers only the first model's aggregate");
    if (!o.compress.empty()) fail(why + "; --compress is not wired to the second model");
    if (!o.attack.empty()) fail(why + "; --attack is not wired to the second model");
  }
}

void drift_cluster::begin(std::size_t dim) {
  sum_.assign(dim, 0.0);
  plain_.assign(dim, 0.0);
  weight_ = 0;
  added_ = 0;
  joining_.clear();
}

void drift_cluster::add(const client_update& u, const std::vector<float>& first) {
  const bool member = member_[u.client] != 0;
  if (!member) joining_.push_back(u.client);
  const std::size_t dim = sum_.size();
  if (u.delta.size() < dim)
    throw std::logic_error("drift_cluster: client " + std::to_string(u.client) + " sent " + std::to_string(u.delta.size()) +
                           " floats; the model has " + std::to_string(dim));
  // A newcomer trained from the first model: its trained model minus the second.
  const bool rebase = !member && model_;
  const float* second = model_ ? model_->data() : nullptr;
  for (std::size_t p = 0; p < dim; ++p) {
    const double d = rebase ? static_cast<double>(u.delta[p]) + first[p] - second[p] : u.delta[p];
    sum_[p] += u.weight * d;
    plain_[p] += d;
  }
  weight_ += u.weight;
  ++added_;
}

void drift_cluster::finish(const std::vector<float>& first, double server_lr) {
  if (added_ == 0) return;
  auto next = std::make_shared<std::vector<float>>(model_ ? *model_ : first);
  const bool weighted = weight_ > 0;  // all weights zero: the plain mean, as the weighted mean does
  const double scale = server_lr / (weighted ? weight_ : static_cast<double>(added_));
  for (std::size_t p = 0; p < next->size(); ++p)
    (*next)[p] += static_cast<float>(scale * (weighted ? sum_[p] : plain_[p]));
  model_ = std::move(next);
  for (auto c : joining_) {
    if (!member_[c]) ++count_;
    member_[c] = 1;
  }
  joining_.clear();
}

}  // namespace troupe::federated::detail
