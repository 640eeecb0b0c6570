// SplitFed: client actors with their bottoms, one server top, FedAvg of the bottoms after each
// round.

#include "troupe/federated/splitfed.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "troupe/actors/actor_system.hpp"
#include "troupe/kernels/data.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

#include "engine.hpp"

namespace troupe::federated {
namespace {

using detail::since;

constexpr std::uint64_t stream_init = 1, stream_shards = 2, stream_order = 3ull << 32;

std::unique_ptr<kernels::optimizer> sgd(std::vector<kernels::parameter*> params, double lr) {
  kernels::hyperparameters hp;
  hp.lr = lr;
  return std::make_unique<kernels::optimizer>(kernels::optimizer_kind::sgd, std::vector<kernels::param_group>{{params, hp, {}}});
}

/// Normalized u8 pixels (as the trainers normalize them) or f32 features of rows `rows`.
tensor features(const labelled_data& d, const dataset& split, std::span<const std::int64_t> rows) {
  tensor x = gather_rows(split.images, rows);
  x = x.reshape({static_cast<std::int64_t>(rows.size()), x.numel() / std::max<std::int64_t>(1, static_cast<std::int64_t>(rows.size()))});
  if (x.type() != dtype::u8) return x;
  return normalize(x, d.mean, d.stddev);
}

struct setup {
  shared_data data;
  std::vector<std::vector<std::int64_t>> shards;
  std::unique_ptr<kernels::sequential> init;  // the whole MLP's initial weights
};

setup prepare(const splitfed_options& o, shared_data data) {
  if (o.clients < 1) throw std::invalid_argument("--clients must be at least 1");
  if (o.rounds < 1 || o.batch < 1) throw std::invalid_argument("--rounds and --batch must be at least 1");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw std::invalid_argument("--lr must be positive");
  if (o.eval_every < 1) throw std::invalid_argument("--eval-every must be at least 1");
  if (o.model.rfind("mlp:", 0) != 0 || kernels::mlp_sizes(o.model).size() < 3)
    throw std::invalid_argument("--split horizontal needs an MLP with a hidden layer (--model mlp:IN-H1-...-OUT), not '" +
                                o.model + "'");
  setup s;
  if (!data) {
    simulation_options so;
    so.data = o.data;
    so.data_dir = o.data_dir;
    so.train_limit = o.train_limit;
    data = detail::load_data(so);
  }
  s.data = std::move(data);
  const std::int64_t n = s.data->train.size();
  if (static_cast<std::int64_t>(o.clients) > n)
    throw std::invalid_argument("--clients " + std::to_string(o.clients) + " is more than the " + std::to_string(n) + " training examples");
  const int k = static_cast<int>(o.clients);
  const std::uint64_t shard_seed = derive_seed(o.seed, stream_shards);
  if (o.partition == "iid")
    s.shards = shard_iid(n, k, shard_seed);
  else if (o.partition.rfind("dirichlet:", 0) == 0) {
    std::size_t used = 0;
    double alpha = 0;
    try {
      alpha = std::stod(o.partition.substr(10), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != o.partition.size() - 10)
      throw std::invalid_argument("--partition " + o.partition + ": '" + o.partition.substr(10) + "' is not a number");
    s.shards = shard_dirichlet(s.data->train.labels, k, alpha, shard_seed);
  } else {
    throw std::invalid_argument("--split horizontal takes --partition iid or dirichlet:A, not '" + o.partition + "'");
  }
  s.init = kernels::make_mlp(o.model);
  s.init->initialize(derive_seed(o.seed, stream_init));
  const std::int64_t features_per_row = n > 0 ? s.data->train.images.numel() / n : 0;
  if (kernels::mlp_sizes(o.model)[0] != features_per_row)
    throw std::invalid_argument("model '" + o.model + "' takes " + std::to_string(kernels::mlp_sizes(o.model)[0]) +
                                " inputs but the data has " + std::to_string(features_per_row) + " features");
  return s;
}

/// The order client `k` walks its shard in round `round`.
std::vector<std::int64_t> round_order(const splitfed_options& o, const std::vector<std::int64_t>& shard, int round, std::size_t k) {
  const auto perm = shuffled_indices(static_cast<std::int64_t>(shard.size()),
                                     derive_seed(o.seed, stream_order + static_cast<std::uint64_t>(round) * o.clients + k));
  std::vector<std::int64_t> out(shard.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = shard[perm[i]];
  return out;
}

void copy_values(const std::vector<kernels::parameter*>& from, const std::vector<kernels::parameter*>& to) {
  for (std::size_t i = 0; i < from.size(); ++i) {
    auto f = from[i]->value.data<float>();
    std::copy(f.begin(), f.end(), to[i]->value.data<float>().begin());
  }
}

std::vector<float> flat_values(kernels::sequential& m) {
  std::vector<float> out;
  for (auto* p : m.parameters()) out.insert(out.end(), p->value.data<float>().begin(), p->value.data<float>().end());
  return out;
}

void load_flat(kernels::sequential& m, std::span<const float> values) {
  std::size_t at = 0;
  for (auto* p : m.parameters()) {
    auto v = p->value.data<float>();
    if (at + v.size() > values.size()) throw std::invalid_argument("SplitFed: a bottom of the wrong size");
    std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(at), v.size(), v.begin());
    at += v.size();
  }
  if (at != values.size()) throw std::invalid_argument("SplitFed: a bottom of the wrong size");
}

/// The bottom: the MLP's first linear layer and its ReLU.
std::unique_ptr<kernels::sequential> make_bottom(std::int64_t in, std::int64_t hidden) {
  auto b = std::make_unique<kernels::sequential>();
  b->add(kernels::make_linear(in, hidden));
  b->add(kernels::make_relu());
  return b;
}

/// A SplitFed client, an actor: its shard and, during a round, its bottom model and optimizer
/// (freed between rounds: a client holds no model while idle).
class splitfed_client {
public:
  splitfed_client(shared_data data, std::vector<std::int64_t> shard, std::int64_t in, std::int64_t hidden, double lr)
      : data_(std::move(data)), shard_(std::move(shard)), in_(in), hidden_(hidden), lr_(lr) {}
  /// Starts a round from the global bottom (its parameters, flat), walking the shard in the
  /// order `order_seed` gives (as round_order does).
  void start_round(std::vector<float> bottom, std::uint64_t order_seed) {
    model_ = make_bottom(in_, hidden_);
    load_flat(*model_, bottom);
    opt_ = sgd(model_->parameters(), lr_);
    const auto perm = shuffled_indices(static_cast<std::int64_t>(shard_.size()), order_seed);
    order_.resize(shard_.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = shard_[perm[i]];
    next_ = 0;
  }
  /// The cut-layer activations and the labels of the round's next `batch` examples (no rows
  /// when the shard is done).
  std::pair<tensor, tensor> forward(std::size_t batch) {
    const std::size_t rows = std::min(batch, order_.size() - next_);
    const std::span<const std::int64_t> examples(order_.data() + next_, rows);
    next_ += rows;
    keep_.clear();
    if (rows == 0) return {tensor::empty({0, hidden_}), tensor::empty({0}, dtype::u8)};
    return {model_->forward(features(*data_, data_->train, examples), keep_, true), gather_rows(data_->train.labels, examples)};
  }
  /// Steps the bottom on the cut layer's gradient from the server.
  void backward(tensor dh) {
    model_->backward(dh, keep_);
    opt_->step();
    opt_->zero_grad();
  }
  /// The bottom after the round (flat); the model is freed.
  std::vector<float> finish_round() {
    auto out = flat_values(*model_);
    opt_.reset();
    model_.reset();
    keep_.clear();
    return out;
  }

private:
  shared_data data_;
  std::vector<std::int64_t> shard_, order_;
  std::int64_t in_, hidden_;
  double lr_;
  std::size_t next_ = 0;
  std::unique_ptr<kernels::sequential> model_;
  std::unique_ptr<kernels::optimizer> opt_;
  kernels::saved_activations keep_;
};

}  // namespace

splitfed_summary run_splitfed(const splitfed_options& o, shared_data data,
                              const std::function<void(const splitfed_progress&)>& report) {
  const auto t0 = detail::clock_type::now();
  setup s = prepare(o, std::move(data));
  const auto sizes = kernels::mlp_sizes(o.model);
  // The top: the MLP after its first layer and ReLU, at the server (this thread).
  std::string top_spec = "mlp:" + std::to_string(sizes[1]);
  for (std::size_t i = 2; i < sizes.size(); ++i) top_spec += "-" + std::to_string(sizes[i]);
  auto init = s.init->parameters();
  auto global_bottom = make_bottom(sizes[0], sizes[1]);
  auto top = kernels::make_mlp(top_spec);
  copy_values({init[0], init[1]}, global_bottom->parameters());
  copy_values(std::vector<kernels::parameter*>(init.begin() + 2, init.end()), top->parameters());
  auto top_opt = sgd(top->parameters(), o.lr);

  actor_system sys{system_config{.threads = o.threads}};
  std::vector<actor_ref<splitfed_client>> clients;
  for (std::size_t k = 0; k < o.clients; ++k)
    clients.push_back(sys.spawn<splitfed_client>(s.data, s.shards[k], sizes[0], sizes[1], o.lr));

  splitfed_summary sum;
  double bytes = 0;
  const std::int64_t n_total = s.data->train.size();
  const std::int64_t test_rows = o.test_limit > 0 ? std::min<std::int64_t>(o.test_limit, s.data->test.size()) : s.data->test.size();
  for (int round = 1; round <= o.rounds; ++round) {
    const std::vector<float> global = flat_values(*global_bottom);
    std::vector<double> average(global.size(), 0.0);
    double loss_sum = 0;
    // The server serves the clients one after another on its one top.
    for (std::size_t k = 0; k < o.clients; ++k) {
      const std::size_t shard_size = s.shards[k].size();
      if (shard_size == 0) continue;
      auto& client = clients[k];
      client.ask(&splitfed_client::start_round, global,
                 derive_seed(o.seed, stream_order + static_cast<std::uint64_t>(round) * o.clients + k))
          .get();
      for (;;) {
        auto [h, labels] = client.ask(&splitfed_client::forward, static_cast<std::size_t>(o.batch)).get();
        if (h.dim(0) == 0) break;
        bytes += static_cast<double>(h.nbytes() + labels.nbytes());  // client -> server
        kernels::saved_activations keep;
        const tensor logits = top->forward(h, keep, true);
        tensor dl;
        loss_sum += kernels::softmax_cross_entropy(logits, labels, dl) * static_cast<double>(h.dim(0));
        tensor dh = top->backward(dl, keep);
        top_opt->step();
        top_opt->zero_grad();
        bytes += static_cast<double>(dh.nbytes());  // server -> client
        client.ask(&splitfed_client::backward, std::move(dh)).get();
        ++sum.steps;
      }
      // FedAvg of the bottoms, weighted by shard size (in double: one client's weight is 1
      // exactly, so its bottom passes unchanged).
      const auto bottom = client.ask(&splitfed_client::finish_round).get();
      const double w = static_cast<double>(shard_size) / static_cast<double>(n_total);
      for (std::size_t i = 0; i < bottom.size(); ++i) average[i] += w * bottom[i];
    }
    std::vector<float> next(average.begin(), average.end());
    load_flat(*global_bottom, next);
    if (round % o.eval_every == 0 || round == o.rounds) {
      double tl = 0;
      std::int64_t correct = 0;
      for (std::int64_t first = 0; first < test_rows; first += 1000) {
        const std::int64_t rows = std::min<std::int64_t>(1000, test_rows - first);
        std::vector<std::int64_t> idx(static_cast<std::size_t>(rows));
        for (std::int64_t i = 0; i < rows; ++i) idx[i] = first + i;
        kernels::saved_activations a, b;
        const tensor logits = top->forward(global_bottom->forward(features(*s.data, s.data->test, idx), a, false), b, false);
        const tensor labels = s.data->test.labels.slice(first, first + rows);
        tensor dl;
        tl += kernels::softmax_cross_entropy(logits, labels, dl) * static_cast<double>(rows);
        correct += kernels::count_correct(logits, labels);
      }
      sum.final_accuracy = static_cast<double>(correct) / static_cast<double>(test_rows);
      sum.final_loss = tl / static_cast<double>(test_rows);
      if (report) report({round, o.rounds, sum.final_accuracy, sum.final_loss, loss_sum / static_cast<double>(n_total), since(t0)});
    }
  }
  sum.bytes_per_step = sum.steps > 0 ? bytes / static_cast<double>(sum.steps) : 0;
  sum.model = flat_values(*global_bottom);
  const auto top_values = flat_values(*top);
  sum.model.insert(sum.model.end(), top_values.begin(), top_values.end());
  sum.seconds = since(t0);
  return sum;
}

std::vector<float> splitfed_reference(const splitfed_options& o, shared_data data) {
  if (o.clients != 1) throw std::invalid_argument("splitfed_reference: plain SGD is SplitFed with one client");
  setup s = prepare(o, std::move(data));
  auto& whole = *s.init;
  auto opt = sgd(whole.parameters(), o.lr);
  for (int round = 1; round <= o.rounds; ++round) {
    const auto order = round_order(o, s.shards[0], round, 0);
    for (std::size_t first = 0; first < order.size(); first += static_cast<std::size_t>(o.batch)) {
      const std::size_t rows = std::min<std::size_t>(static_cast<std::size_t>(o.batch), order.size() - first);
      const std::span<const std::int64_t> batch(order.data() + first, rows);
      kernels::saved_activations keep;
      const tensor logits = whole.forward(features(*s.data, s.data->train, batch), keep, true);
      tensor dl;
      kernels::softmax_cross_entropy(logits, gather_rows(s.data->train.labels, batch), dl);
      whole.backward(dl, keep);
      opt->step();
      opt->zero_grad();
    }
  }
  std::vector<float> out;
  for (auto* p : whole.parameters()) out.insert(out.end(), p->value.data<float>().begin(), p->value.data<float>().end());
  return out;
}

}  // namespace troupe::federated
