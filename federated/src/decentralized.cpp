// Decentralized training: the peer actor (its model, its shard, the models its neighbours sent
// it) and the driver that tells the peers when to train and when to average. The driver only
// orders the phases; models travel between the peers as messages, and the driver reads them
// only to measure (the consensus error, the mean model's accuracy).
//
// Each averaging is two phases: every peer involved sends its model to the peers that need it
// (tells), then every peer mixes what it received. A peer's tell is in its receiver's mailbox
// before the sender's reply reaches the driver, and the driver asks for the mix only after the
// replies of the first phase: so the mix always finds the models it needs.

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "engine.hpp"
#include "troupe/actors/actor_system.hpp"
#include "troupe/actors/collective.hpp"
#include "troupe/federated/decentralized.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {

namespace {

using detail::clock_type;
using detail::since;

constexpr std::uint64_t stream_gossip = 10ull << 32;  // + round

/// What every peer reads: the data, the trainers (one per worker thread).
struct peer_context {
  shared_data data;
  trainer_factory factory;
  std::size_t dim = 0;
  std::mutex mutex;
  std::map<std::thread::id, std::unique_ptr<local_trainer>> trainers;

  local_trainer& trainer() {
    std::lock_guard lock(mutex);
    auto& t = trainers[std::this_thread::get_id()];
    if (!t) t = factory(data);
    return *t;
  }
};

class peer {
public:
  peer(std::uint32_t index, std::vector<float> model, std::span<const std::uint32_t> shard, std::uint64_t seed,
       peer_context* ctx)
      : index_(index), model_(std::move(model)), shard_(shard), rng_{seed}, ctx_(ctx) {}

  void connect(std::vector<actor_ref<peer>> neighbours, std::vector<std::uint32_t> ids, mixing_row weights,
               actor_ref<ring_member> ring) {
    neighbours_ = std::move(neighbours);
    ids_ = std::move(ids);
    weights_ = std::move(weights);
    ring_ = std::move(ring);
  }

  /// Local training of the model in place (gossip and allreduce rounds).
  local_result train(int epochs, int steps, int batch, double lr) { return train_into(model_, epochs, steps, batch, lr); }

  /// D-PSGD's first phase: the change one SGD step makes at x_i (kept for the mix), and x_i to
  /// every neighbour. Returns the step's result.
  local_result dpsgd_send(int batch, double lr) {
    local_result r;
    if (ctx_) {
      delta_ = model_;
      r = train_into(delta_, 1, 1, batch, lr);
      for (std::size_t k = 0; k < delta_.size(); ++k) delta_[k] -= model_[k];
    }
    send_to_neighbours();
    return r;
  }
  /// Sends the model to every neighbour (averaging without training).
  void send_to_neighbours() {
    for (std::size_t e = 0; e < neighbours_.size(); ++e) neighbours_[e].tell(&peer::take, index_, model_);
  }
  /// Sends the model to one peer (a gossip edge).
  void send_to(actor_ref<peer> other) { other.tell(&peer::take, index_, model_); }

  void take(std::uint32_t from, std::vector<float> model) { inbox_[from] = std::move(model); }

  /// x_i <- W_ii x_i + sum_j W_ij x_j (+ D-PSGD's step), neighbours in ascending order, as
  /// metropolis_step computes it.
  void mix_neighbours() {
    const float self = static_cast<float>(weights_.self);
    for (auto& x : model_) x *= self;
    for (std::size_t e = 0; e < ids_.size(); ++e) {
      auto it = inbox_.find(ids_[e]);
      if (it == inbox_.end() || it->second.size() != model_.size())
        throw std::logic_error("peer " + std::to_string(index_) + ": no model from neighbour " + std::to_string(ids_[e]));
      const float w = static_cast<float>(weights_.neighbour[e]);
      for (std::size_t k = 0; k < model_.size(); ++k) model_[k] += w * it->second[k];
    }
    if (!delta_.empty())
      for (std::size_t k = 0; k < model_.size(); ++k) model_[k] += delta_[k];
    delta_.clear();
    inbox_.clear();
  }

  /// A gossip edge's second phase: the pair's average.
  void mix_pair(std::uint32_t other) {
    auto it = inbox_.find(other);
    if (it == inbox_.end() || it->second.size() != model_.size())
      throw std::logic_error("peer " + std::to_string(index_) + ": no model from gossip partner " + std::to_string(other));
    for (std::size_t k = 0; k < model_.size(); ++k) model_[k] = 0.5f * model_[k] + 0.5f * it->second[k];
    inbox_.erase(it);
  }

  /// The exact mean of every peer's model, by the ring all-reduce.
  task<void> average_all() {
    model_ = co_await ring_.ask(&ring_member::allreduce, model_, reduce_op::mean);
  }

  std::vector<float> model() const { return model_; }

private:
  local_result train_into(std::vector<float>& x, int epochs, int steps, int batch, double lr) {
    auto& t = ctx_->trainer();
    local_job job;
    job.client = index_;
    job.global = x;
    job.shard = shard_;
    job.epochs = epochs;
    job.steps = steps;
    job.batch = batch;
    job.lr = lr;
    auto own = t.working_model();
    if (own.size() == x.size()) {
      std::copy(x.begin(), x.end(), own.begin());
      auto r = t.train(job, own, rng_);
      std::copy(own.begin(), own.end(), x.begin());
      return r;
    }
    std::vector<float> work = x;
    auto r = t.train(job, work, rng_);
    x = std::move(work);
    return r;
  }

  std::uint32_t index_;
  std::vector<float> model_, delta_;
  std::span<const std::uint32_t> shard_;
  splitmix64 rng_;
  peer_context* ctx_;
  std::vector<actor_ref<peer>> neighbours_;
  std::vector<std::uint32_t> ids_;
  mixing_row weights_;
  actor_ref<ring_member> ring_;
  std::map<std::uint32_t, std::vector<float>> inbox_;
};

template <class T>
void wait_all(std::vector<future<T>>& f) {
  for (auto& x : f) x.get();
  f.clear();
}

/// The peers of one run, connected along `g` (and in a ring, for the all-reduce).
struct peer_group {
  std::unique_ptr<actor_system> system;
  std::vector<actor_ref<peer>> peers;
  std::vector<actor_ref<ring_member>> ring;

  std::vector<std::vector<float>> models() {
    std::vector<future<std::vector<float>>> f;
    for (auto& p : peers) f.push_back(p.ask(&peer::model));
    std::vector<std::vector<float>> out;
    for (auto& x : f) out.push_back(x.get());
    return out;
  }

  /// One Metropolis averaging of every peer (D-PSGD's, with its step when `train`).
  double metropolis(const topology& g, bool train, int batch, double lr, std::uint64_t& bytes, std::size_t dim) {
    double loss = 0;
    std::vector<future<local_result>> sent;
    std::vector<future<void>> plain;
    for (auto& p : peers) {
      if (train) sent.push_back(p.ask(&peer::dpsgd_send, batch, lr));
      else plain.push_back(p.ask(&peer::send_to_neighbours));
    }
    for (auto& f : sent) loss += f.get().loss;
    wait_all(plain);
    for (std::size_t i = 0; i < peers.size(); ++i) bytes += 4 * dim * g.neighbours[i].size();
    for (auto& p : peers) plain.push_back(p.ask(&peer::mix_neighbours));
    wait_all(plain);
    return loss / static_cast<double>(peers.size());
  }

  /// One round of randomized gossip: `edges` applied as if one after another, in batches of
  /// edges that share no peer.
  void gossip(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges, std::uint64_t& bytes, std::size_t dim) {
    std::vector<bool> busy(peers.size(), false);
    std::vector<std::pair<std::uint32_t, std::uint32_t>> batch;
    auto flush = [&] {
      std::vector<future<void>> f;
      for (auto [i, j] : batch) {
        f.push_back(peers[i].ask(&peer::send_to, peers[j]));
        f.push_back(peers[j].ask(&peer::send_to, peers[i]));
      }
      wait_all(f);
      for (auto [i, j] : batch) {
        f.push_back(peers[i].ask(&peer::mix_pair, j));
        f.push_back(peers[j].ask(&peer::mix_pair, i));
        busy[i] = busy[j] = false;
        bytes += 2 * 4 * dim;
      }
      wait_all(f);
      batch.clear();
    };
    for (auto e : edges) {
      if (busy[e.first] || busy[e.second]) flush();
      busy[e.first] = busy[e.second] = true;
      batch.push_back(e);
    }
    flush();
  }
};

peer_group make_group(const topology& g, const std::vector<std::vector<float>>& initial,
                      const std::vector<std::span<const std::uint32_t>>& shards, std::uint64_t seed, unsigned threads,
                      peer_context* ctx, bool ring) {
  peer_group grp;
  grp.system = std::make_unique<actor_system>(system_config{.threads = threads});
  const auto w = metropolis_weights(g);
  for (std::uint32_t i = 0; i < g.size(); ++i)
    grp.peers.push_back(grp.system->spawn<peer>(i, initial[i], shards.empty() ? std::span<const std::uint32_t>{} : shards[i],
                                                derive_seed(seed, detail::stream_client + i), ctx));
  if (ring) grp.ring = spawn_ring(*grp.system, g.size(), {});
  std::vector<future<void>> f;
  for (std::uint32_t i = 0; i < g.size(); ++i) {
    std::vector<actor_ref<peer>> refs;
    for (auto j : g.neighbours[i]) refs.push_back(grp.peers[j]);
    f.push_back(grp.peers[i].ask(&peer::connect, std::move(refs), g.neighbours[i], w[i],
                                 ring ? grp.ring[i] : actor_ref<ring_member>()));
  }
  wait_all(f);
  return grp;
}

std::vector<float> mean_of(const std::vector<std::vector<float>>& models) {
  std::vector<double> acc(models.empty() ? 0 : models[0].size(), 0.0);
  for (const auto& m : models)
    for (std::size_t k = 0; k < acc.size(); ++k) acc[k] += m[k];
  std::vector<float> out(acc.size());
  for (std::size_t k = 0; k < acc.size(); ++k) out[k] = static_cast<float>(acc[k] / static_cast<double>(models.size()));
  return out;
}

void check_decentralized(const decentralized_options& d) {
  const auto& o = d.base;
  if (d.mode != "gossip" && d.mode != "dpsgd" && d.mode != "allreduce")
    throw std::invalid_argument("--decentralized " + d.mode + ": expected gossip, dpsgd or allreduce");
  if (o.rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  if (o.batch < 1) throw std::invalid_argument("--batch must be at least 1");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw std::invalid_argument("--lr must be a positive number");
  if (o.eval_every < 1) throw std::invalid_argument("--eval-every must be at least 1");
  if (o.local_steps < 0 || o.local_epochs < 1) throw std::invalid_argument("--local-steps must be >= 0 and --local-epochs >= 1");
  if (o.device != "cpu") throw std::invalid_argument("--decentralized trains on the CPU (--device cpu)");
  if (o.clients > 100000) throw std::invalid_argument("--decentralized keeps a model per client: at most 100000 clients");
}

}  // namespace

decentralized_summary run_decentralized(const decentralized_options& d, shared_data data, trainer_factory trainer,
                                        const std::function<void(const decentralized_report&)>& report) {
  check_decentralized(d);
  const auto& o = d.base;
  const auto t0 = clock_type::now();
  const auto g = make_topology(d.mode == "allreduce" ? "complete" : d.topology, o.clients,
                               derive_seed(o.seed, detail::stream_partition + 1));
  peer_context ctx;
  if (!trainer) {
    if (o.trainer != "mlp") throw std::invalid_argument("--decentralized trains the mlp trainer's model (--trainer mlp)");
    trainer = make_trainer_factory(o);
  }
  ctx.factory = std::move(trainer);
  if (!data) data = detail::load_data(o);
  ctx.data = data;
  auto evaluator = ctx.factory(ctx.data);
  ctx.dim = evaluator->dim();
  partition part;
  if (data->client_train.defined()) {  // the data's own partition, as a simulation takes it
    const auto of = data->client_train.data<std::uint32_t>();
    const std::size_t named = of.empty() ? 0 : static_cast<std::size_t>(*std::max_element(of.begin(), of.end())) + 1;
    if (named != o.clients)
      throw std::invalid_argument("the data assigns its training examples to " + std::to_string(named) +
                                  " clients (client_train): run with --clients " + std::to_string(named));
    part = partition_assigned(data->client_train, o.clients);
  } else {
    part = make_partition(o.partition, data->train.labels, o.clients, derive_seed(o.seed, detail::stream_partition));
  }
  std::vector<std::span<const std::uint32_t>> shards;
  for (std::size_t c = 0; c < o.clients; ++c) shards.push_back(part.shard(c));
  std::vector<float> initial(ctx.dim);
  evaluator->initialize(initial, derive_seed(o.seed, detail::stream_model));
  const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  auto grp = make_group(g, std::vector<std::vector<float>>(o.clients, initial), shards, o.seed, threads, &ctx,
                        d.mode == "allreduce");
  // D-PSGD's round: --local-steps iterations, or the steps of one pass over the mean shard.
  const int iterations = o.local_steps > 0 ? o.local_steps
                                           : std::max(1, static_cast<int>((part.indices.size() / o.clients +
                                                                           static_cast<std::size_t>(o.batch) - 1) /
                                                                          static_cast<std::size_t>(o.batch)));
  decentralized_summary s;
  std::uint64_t bytes = 0;
  for (int r = 1; r <= o.rounds; ++r) {
    decentralized_report rep;
    rep.round = r;
    if (d.mode == "dpsgd") {
      double loss = 0;
      for (int it = 0; it < iterations; ++it) loss += grp.metropolis(g, true, o.batch, o.lr, bytes, ctx.dim);
      rep.train_loss = loss / iterations;
    } else {
      std::vector<future<local_result>> f;
      for (auto& p : grp.peers) f.push_back(p.ask(&peer::train, o.local_epochs, o.local_steps, o.batch, o.lr));
      double loss = 0;
      for (auto& x : f) loss += x.get().loss;
      rep.train_loss = loss / static_cast<double>(o.clients);
      if (d.mode == "gossip") {
        grp.gossip(gossip_edges(g, o.clients, derive_seed(o.seed, stream_gossip + static_cast<std::uint64_t>(r))), bytes,
                   ctx.dim);
      } else {
        std::vector<future<void>> a;
        for (auto& p : grp.peers) a.push_back(p.ask(&peer::average_all));
        wait_all(a);
        for (std::size_t i = 0; i < o.clients; ++i) bytes += 4 * ring_elements_sent(ctx.dim, o.clients, i);
      }
    }
    if (!std::isfinite(rep.train_loss))
      throw std::runtime_error("round " + std::to_string(r) + " diverged: the training loss is not finite (lower --lr)");
    rep.bytes = bytes;
    if (r % o.eval_every == 0 || r == o.rounds) {
      const auto models = grp.models();
      rep.consensus_error = consensus_error(models);
      const auto mean = mean_of(models);
      const auto e = evaluator->evaluate(mean);
      rep.evaluated = true;
      rep.accuracy = e.accuracy;
      rep.loss = e.loss;
      s.final_accuracy = e.accuracy;
      s.final_loss = e.loss;
      s.consensus_error = rep.consensus_error;
      if (r == o.rounds) s.mean_model = mean;
    }
    rep.seconds = since(t0);
    if (report) report(rep);
  }
  s.rounds = o.rounds;
  s.bytes = bytes;
  s.seconds = since(t0);
  return s;
}

std::vector<std::vector<std::vector<float>>> run_averaging(const topology& g, const std::string& mode,
                                                           std::vector<std::vector<float>> models, int steps,
                                                           std::uint64_t seed, unsigned threads) {
  if (mode != "gossip" && mode != "dpsgd") throw std::invalid_argument("run_averaging: mode " + mode + " (gossip or dpsgd)");
  if (models.size() != g.size()) throw std::invalid_argument("run_averaging: one model per peer");
  std::vector<std::vector<std::vector<float>>> out{models};
  auto grp = make_group(g, models, {}, seed, threads, nullptr, false);
  std::uint64_t bytes = 0;
  const std::size_t dim = models.empty() ? 0 : models[0].size();
  for (int t = 1; t <= steps; ++t) {
    if (mode == "dpsgd") grp.metropolis(g, false, 1, 0, bytes, dim);
    else grp.gossip(gossip_edges(g, g.size(), derive_seed(seed, stream_gossip + static_cast<std::uint64_t>(t))), bytes, dim);
    out.push_back(grp.models());
  }
  return out;
}

}  // namespace troupe::federated
