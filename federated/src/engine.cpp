#include "engine.hpp"
#include "troupe/federated/fairness.hpp"
#include "troupe/federated/fedgen.hpp"
#include "troupe/federated/unlearn.hpp"

#include <cmath>

#include "spec.hpp"
#include "troupe/core/device.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated::detail {

device parse_device(const std::string& spec) {
  if (spec == "cpu") return device::cpu();
  int index = 0;
  if (spec != "cuda") {
    const std::string prefix = "cuda:";
    if (spec.rfind(prefix, 0) != 0 || spec.size() == prefix.size() || spec.size() > prefix.size() + 3 ||
        spec.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
      throw std::invalid_argument("--device '" + spec + "': use cpu, cuda or cuda:N");
    index = std::stoi(spec.substr(prefix.size()));
  }
  const int count = cuda_device_count();
  if (index >= count)
    throw std::invalid_argument("--device " + spec + ": " +
                                (built_with_cuda() ? std::to_string(count) + " usable CUDA device(s) here"
                                                   : std::string("this build of troupe has no CUDA paths")));
  return device::cuda(index);
}

latency_model parse_latency(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if ((name != "lognormal" && name != "exponential") || arg.empty())
    throw std::invalid_argument("--latency '" + spec + "': use lognormal:SIGMA or exponential:MEAN");
  latency_model m{name == "exponential", spec_number(arg, "--latency '" + spec + "'")};
  // A client's speed factor: sigma up to 5 (factors of e^20 at four sigmas) or a mean up to
  // 1000; beyond, simulated times leave the range of a double.
  if (m.exponential ? !(m.parameter > 0 && m.parameter <= 1000) : !(m.parameter >= 0 && m.parameter <= 5))
    throw std::invalid_argument("--latency '" + spec + "': " +
                                (m.exponential ? "the mean must be in (0, 1000]" : "sigma must be in [0, 5]"));
  return m;
}


std::size_t parse_async(const std::string& spec) {
  if (spec.empty()) return 0;
  const std::string prefix = "fedbuff:";
  if (spec.rfind(prefix, 0) != 0) throw std::invalid_argument("--async '" + spec + "': use fedbuff:K");
  const double k = spec_number(spec.substr(prefix.size()), "--async '" + spec + "'");
  if (!(k >= 1 && k <= 1e6) || k != std::floor(k))
    throw std::invalid_argument("--async '" + spec + "': K must be a whole number from 1 to 1000000");
  return static_cast<std::size_t>(k);
}

void check_options(const simulation_options& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (o.clients < 1) fail("--clients must be at least 1");
  if (o.clients > max_clients) fail("--clients must be at most " + std::to_string(max_clients));
  if (!(o.fraction >= 0 && o.fraction <= 1)) fail("--fraction must be in [0, 1]");
  if (o.fraction == 0) {
    if (o.per_round < 1) fail("--per-round must be at least 1");
    if (o.per_round > o.clients)
      fail("--per-round " + std::to_string(o.per_round) + " is more than the " + std::to_string(o.clients) + " clients");
  }
  if (o.min_per_round > o.clients)
    fail("--min-per-round (" + std::to_string(o.min_per_round) + ") is more than --clients (" + std::to_string(o.clients) + ")");
  if (o.rounds < 1) fail("--rounds must be at least 1");
  if (o.local_epochs < 1) fail("--local-epochs must be at least 1");
  if (o.local_steps < 0) fail("--local-steps must be at least 0 (0: --local-epochs passes instead)");
  if (o.batch < 1) fail("--batch must be at least 1");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) fail("--lr must be positive");
  if (o.eval_every < 1) fail("--eval-every must be at least 1");
  if (o.threads > 256) fail("--threads must be at most 256");
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("--dropout must be in [0, 1)");
  if (!(o.deadline >= 0) || !std::isfinite(o.deadline)) fail("--deadline must be a non-negative number of seconds");
  if (!(o.over_select >= 0 && o.over_select <= 10)) fail("--over-select must be in [0, 10]");
  if (!(o.sample_seconds >= 0 && o.sample_seconds <= 3600))
    fail("the simulated time per example must be in [0, 3600] seconds");
  if (o.trainer != "mlp" && o.trainer != "noop") fail("unknown trainer '" + o.trainer + "' (use mlp or noop)");
  if (o.client_optimizer != "sgd" && o.client_optimizer != "adam" && o.client_optimizer != "adamw")
    fail("--client-optimizer '" + o.client_optimizer + "': use sgd, adam or adamw");
  if (o.client_state != "fp32" && o.client_state != "bf16" && o.client_state != "int8")
    fail("--client-state '" + o.client_state + "': use fp32, bf16 or int8");
  if (o.client_optimizer == "sgd" && o.client_state != "fp32")
    fail("--client-state " + o.client_state + ": plain SGD keeps no state to store; use --client-optimizer adam or adamw");
  (void)parse_device(o.device);
  check_lora_options(o);
  if (!o.shift.empty() && o.trainer != "mlp") fail("--shift needs --trainer mlp (noop trains on no data)");
  if (o.client_optimizer != "sgd" && o.trainer == "noop")
    fail("--client-optimizer " + o.client_optimizer + ": the noop trainer trains nothing; use --trainer mlp");
  if (!o.data.empty() && o.data.rfind("npz:", 0) != 0 && o.data.rfind("idx:", 0) != 0)
    fail("--data '" + o.data + "': use npz:FILE or idx:DIR");
  if (!o.data.empty() && o.data.size() == 4) fail("--data '" + o.data + "': name the file or directory after the colon");
  if (!o.data.empty() && !o.data_dir.empty()) fail("--data and --data-dir name two data sets: give one");
  if (o.trainer == "noop" && is_data_attack(o.attack))
    fail("--attack " + o.attack + " poisons the training data, and the noop trainer trains on none: use --trainer mlp");
  (void)parse_latency(o.latency);
  check_contribution_options(o);
  check_drift_options(o);
  check_unlearn_options(o);
  check_continual_options(o);
  if (is_fedgen(o.strategy)) {
    (void)parse_fedgen(o.strategy);
    if (o.trainer != "mlp") fail("--strategy fedgen distills into the model's head: use --trainer mlp");
    if (o.secagg)
      fail("--strategy fedgen with --secagg: FedGEN's server learns from each client's head, and secure aggregation "
           "shows it only the sum");
    if (!o.compress.empty()) fail("--strategy fedgen with --compress: FedGEN's server needs each client's head as it is");
    if (parse_async(o.async) > 0) fail("--strategy fedgen with --async: FedGEN's generator is trained per synchronous round");
    if (o.device != "cpu") fail("--strategy fedgen with --device " + o.device + ": its generator term is added on the host; use --device cpu");
  }
  if (o.eval_clients && o.trainer != "mlp")
    fail("--eval-clients measures the model on each client's held-out examples: use --trainer mlp");
  if (is_qfedavg(o.strategy)) {
    (void)parse_qfedavg(o.strategy);
    const std::string why = "q-FedAvg's server needs each client's plain update and its loss F_k";
    if (o.trainer != "mlp") fail("--strategy " + o.strategy + " weighs clients by their loss: use --trainer mlp");
    if (o.secagg) fail("--strategy " + o.strategy + " with --secagg: " + why + ", and secure aggregation shows only the sum");
    if (o.dp_clip != 0 || o.dp_noise != 0 || o.dp_adaptive)
      fail("--strategy " + o.strategy + " with --dp-*: DP-FedAvg's noise is calibrated to the mean of clipped updates, "
           "not to q-FedAvg's loss-weighted step");
    if (!o.compress.empty()) fail("--strategy " + o.strategy + " with --compress: " + why);
    if (!o.attack.empty() && !is_data_attack(o.attack))
      fail("--strategy " + o.strategy + " with --attack " + o.attack +
           ": the update attacks would rewrite the loss the update carries; the data attacks (label-flip, backdoor) work");
    if (parse_async(o.async) > 0) fail("--strategy " + o.strategy + " with --async: q-FedAvg's step is per synchronous round");
  }
  if (parse_async(o.async) > 0) {
    // Failures (--dropout) are FedBuff's too: a failed client's slot is refilled. A deadline and
    // over-selection shape a round's cohort, and FedBuff has none.
    if (o.deadline > 0 || o.over_select > 0)
      fail("--async: --deadline and --over-select shape a synchronous round's cohort; FedBuff has no rounds to cut "
           "short (a slow client's update arrives stale and is weighted down instead)");
    if (o.secagg) fail("--async with --secagg: secure aggregation needs a fixed cohort per round");
    if (o.strategy.rfind("alignins", 0) == 0)
      fail("--async with --strategy " + o.strategy + ": AlignIns compares each update with the global model its round "
           "started from, and FedBuff's buffered updates start from different versions");
    if (o.dp_adaptive)
      fail("--async with --dp-adaptive is not supported: the clipping bound would change while clients that clipped "
           "to an older, larger bound are still in flight, and the noise would no longer cover their updates");
  }
}

/// FedBuff's buffer: a robust rule is applied to
/// the K buffered updates of each server step, so K must be large enough for it; under
/// differential privacy the clients of the buffer stay busy until the step, so there must be
/// an idle client to send out after every arrival.
void check_async_mechanisms(const simulation_options& o, std::size_t in_flight, std::size_t k) {
  if (is_robust_rule(o.strategy)) {
    const std::size_t least = least_updates(o.strategy);
    if (k < least)
      throw std::invalid_argument("--async " + o.async + " with --strategy " + o.strategy + ": the rule is applied to the " +
                                  std::to_string(k) + " buffered updates of each server step and needs at least " +
                                  std::to_string(least) + "; raise K");
  }
  if ((o.dp_clip != 0 || o.dp_noise != 0) && o.clients < in_flight + k - 1)
    throw std::invalid_argument("--async " + o.async + " with differential privacy needs --clients >= " +
                                std::to_string(in_flight + k - 1) +
                                " (clients in flight + K - 1): a client whose update waits in the buffer is not sent out "
                                "again before the server step");
}

shared_data load_data(const simulation_options& o) {
  labelled_data all;
  if (o.data.empty())
    all = load_fashion_mnist(o.data_dir.empty() ? fashion_mnist_dir : o.data_dir);
  else if (o.data.rfind("npz:", 0) == 0)
    all = load_npz(o.data.substr(4));
  else
    all = load_idx_dir(o.data.substr(4));
  if (all.train.size() < 1 || all.test.size() < 1)
    throw std::invalid_argument("the dataset has " + std::to_string(all.train.size()) + " training and " +
                                std::to_string(all.test.size()) + " test examples: a simulation needs both");
  if (o.train_limit && static_cast<std::int64_t>(o.train_limit) < all.train.size()) {
    const auto n = static_cast<std::int64_t>(o.train_limit);
    all.train.images = all.train.images.slice(0, n).clone();
    all.train.labels = all.train.labels.slice(0, n).clone();
    if (all.client_train.defined()) all.client_train = all.client_train.slice(0, n).clone();
  }
  return std::make_shared<const fashion_mnist>(std::move(all));
}

void size_client_state(engine_state& e) {
  e.state_floats = e.rule.control_variates ? e.dim : 0;
  e.transform_offset.clear();
  const std::size_t update = e.strategy->update_floats(e.dim);
  for (auto& t : e.transforms) {
    e.transform_offset.push_back(e.state_floats);
    e.state_floats += t->client_state_floats(update);
  }
}

double work_seconds(const engine_state& e, std::uint64_t client, splitmix64& g) {
  const auto& o = e.options;
  splitmix64 speed{derive_seed(o.seed, stream_speed + client)};
  double factor = 0;
  if (e.latency.exponential) {
    factor = -e.latency.parameter * std::log(1.0 - speed.uniform01());
  } else {  // log-normal, by Box-Muller from the client's seed
    const double u1 = 1.0 - speed.uniform01(), u2 = speed.uniform01();
    factor = std::exp(e.latency.parameter * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
  const auto& off = e.part.offsets;
  const double examples = static_cast<double>(off[client + 1] - off[client]);
  const double jitter = -0.1 * std::log(1.0 - g.uniform01());
  const double work = o.local_steps > 0 ? static_cast<double>(o.local_steps) * o.batch : examples * o.local_epochs;
  return factor * work * o.sample_seconds + jitter;
}

weight_bounds client_weight_bounds(const engine_state& e, std::size_t per_round) {
  const double uniform = static_cast<double>(per_round);
  if (e.rule.uniform_weights) return {.max = 1, .round_sum = uniform};
  std::vector<std::uint32_t> sizes(e.part.clients());
  for (std::size_t c = 0; c < sizes.size(); ++c) sizes[c] = e.part.offsets[c + 1] - e.part.offsets[c];
  const std::size_t k = std::min(per_round, sizes.size());
  if (k == 0) return {.max = 1, .round_sum = uniform};
  std::nth_element(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(k - 1), sizes.end(), std::greater<>());
  double largest = 0, sum = 0;  // the k largest sizes are sizes[0, k)
  for (std::size_t i = 0; i < k; ++i) {
    largest = std::max(largest, static_cast<double>(sizes[i]));
    sum += sizes[i];
  }
  if (largest == 0) return {.max = 1, .round_sum = uniform};  // no client holds an example
  return {.max = largest, .round_sum = sum};
}


}  // namespace troupe::federated::detail
