// FedGCN's exchange as messages, and the graph run: the graph client actor (its nodes, their
// features and edges), the server actor that adds the clients' neighbourhood sums, the driver
// that orders the phases, and run_graph, which builds the graph and hands the propagated
// features to a FedAvg simulation of SGC's linear layer.
//
// One exchanged hop is three phases. (1) Every client computes, for every node it knows (its own
// and their neighbours), the fixed-point sum of its own nodes' terms over that node's closed
// neighbourhood, and tells the server. (2) The server adds what every client sent into one
// table and tells each client the sums of its own nodes. (3) Every client scales its sums into
// its nodes' new rows. The driver starts a phase only after every reply of the one before; a
// tell made inside an actor method is in its receiver's mailbox before that method's reply
// reaches the driver, so each phase finds the messages of the one before.

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "engine.hpp"
#include "graph_fixed.hpp"
#include "troupe/actors/actor_system.hpp"
#include "troupe/core/file.hpp"
#include "troupe/federated/graph.hpp"
#include "troupe/federated/partition.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {

namespace {

using detail::clock_type;
using detail::since;
using detail::stream_graph;

class gcn_server;

class gcn_client {
public:
  /// `own`: the client's nodes, ascending; `features`: their rows; `edges[m]`: own[m]'s
  /// neighbours in the whole graph, ascending.
  gcn_client(std::uint32_t index, std::vector<std::uint32_t> own, std::vector<float> features, std::int64_t dims,
             std::vector<std::vector<std::uint32_t>> edges)
      : index_(index), own_(std::move(own)), h_(std::move(features)), dims_(static_cast<std::size_t>(dims)),
        edges_(std::move(edges)) {
    for (std::size_t m = 0; m < own_.size(); ++m) {
      known_.push_back(own_[m]);
      known_.insert(known_.end(), edges_[m].begin(), edges_[m].end());
    }
    std::sort(known_.begin(), known_.end());
    known_.erase(std::unique(known_.begin(), known_.end()), known_.end());
  }

  void connect(actor_ref<gcn_server> server) { server_ = std::move(server); }

  /// Phase 1: the sums of this client's terms over every known node's closed neighbourhood, to
  /// the server. Returns the bytes sent.
  std::uint64_t send_sums();
  /// Phase 2's message: the whole graph's sums of the client's own nodes, in own order.
  void take(std::vector<std::int64_t> sums) { pending_ = std::move(sums); }
  /// Phase 3: (Â H)_i for the own nodes.
  void finish_exchange() {
    if (pending_.size() != h_.size())
      throw std::logic_error("graph client " + std::to_string(index_) + ": no sums from the server");
    for (std::size_t m = 0; m < own_.size(); ++m) {
      const double inv = detail::inverse_sqrt_degree(edges_[m].size() + 1);
      for (std::size_t f = 0; f < dims_; ++f) h_[m * dims_ + f] = detail::fixed_row_value(pending_[m * dims_ + f], inv);
    }
    pending_.clear();
  }

  /// A propagation over the edges between the client's own nodes, degrees counted there.
  void local_hop() {
    std::vector<std::vector<std::size_t>> inside(own_.size());  // positions in own_ of own neighbours
    std::vector<double> inv(own_.size());
    for (std::size_t m = 0; m < own_.size(); ++m) {
      for (auto j : edges_[m]) {
        auto it = std::lower_bound(own_.begin(), own_.end(), j);
        if (it != own_.end() && *it == j) inside[m].push_back(static_cast<std::size_t>(it - own_.begin()));
      }
      inv[m] = detail::inverse_sqrt_degree(inside[m].size() + 1);
    }
    std::vector<std::int64_t> terms(h_.size()), sum(dims_);
    for (std::size_t m = 0; m < own_.size(); ++m)
      for (std::size_t f = 0; f < dims_; ++f) terms[m * dims_ + f] = detail::fixed_term(h_[m * dims_ + f], inv[m]);
    for (std::size_t m = 0; m < own_.size(); ++m) {
      for (std::size_t f = 0; f < dims_; ++f) sum[f] = terms[m * dims_ + f];
      for (auto p : inside[m])
        for (std::size_t f = 0; f < dims_; ++f) sum[f] += terms[p * dims_ + f];
      for (std::size_t f = 0; f < dims_; ++f) h_[m * dims_ + f] = detail::fixed_row_value(sum[f], inv[m]);
    }
  }

  std::vector<float> features() const { return h_; }

private:
  std::uint32_t index_;
  std::vector<std::uint32_t> own_, known_;
  std::vector<float> h_;
  std::size_t dims_;
  std::vector<std::vector<std::uint32_t>> edges_;
  std::vector<std::int64_t> pending_;
  actor_ref<gcn_server> server_;
};

class gcn_server {
public:
  gcn_server(std::size_t nodes, std::int64_t dims)
      : dims_(static_cast<std::size_t>(dims)), table_(nodes * dims_, 0) {}

  void connect(std::vector<actor_ref<gcn_client>> clients) {
    clients_ = std::move(clients);
    owners_.assign(clients_.size(), {});
  }

  /// Phase 1's message from client `client`: its own nodes, the nodes it knows and its sums.
  void take_sums(std::uint32_t client, std::vector<std::uint32_t> own, std::vector<std::uint32_t> known,
                 std::vector<std::int64_t> sums) {
    if (client >= clients_.size() || sums.size() != known.size() * dims_)
      throw std::logic_error("graph server: a malformed message from client " + std::to_string(client));
    for (std::size_t k = 0; k < known.size(); ++k) {
      if (known[k] >= table_.size() / dims_) throw std::logic_error("graph server: node " + std::to_string(known[k]) + " is no node");
      std::int64_t* row = table_.data() + static_cast<std::size_t>(known[k]) * dims_;
      for (std::size_t f = 0; f < dims_; ++f) row[f] += sums[k * dims_ + f];
    }
    owners_[client] = std::move(own);
  }

  /// Phase 2: each client's own nodes' sums back to it; the table starts again from zero.
  /// Returns the bytes sent.
  std::uint64_t distribute() {
    std::uint64_t bytes = 0;
    for (std::size_t c = 0; c < clients_.size(); ++c) {
      std::vector<std::int64_t> out(owners_[c].size() * dims_);
      for (std::size_t m = 0; m < owners_[c].size(); ++m)
        std::copy_n(table_.data() + static_cast<std::size_t>(owners_[c][m]) * dims_, dims_, out.data() + m * dims_);
      bytes += 8 * out.size();
      clients_[c].tell(&gcn_client::take, std::move(out));
    }
    std::fill(table_.begin(), table_.end(), 0);
    return bytes;
  }

private:
  std::size_t dims_;
  std::vector<std::int64_t> table_;
  std::vector<actor_ref<gcn_client>> clients_;
  std::vector<std::vector<std::uint32_t>> owners_;
};

std::uint64_t gcn_client::send_sums() {
  std::vector<std::int64_t> sums(known_.size() * dims_, 0), term(dims_);
  auto slot = [&](std::uint32_t node) {
    return static_cast<std::size_t>(std::lower_bound(known_.begin(), known_.end(), node) - known_.begin());
  };
  for (std::size_t m = 0; m < own_.size(); ++m) {
    const double inv = detail::inverse_sqrt_degree(edges_[m].size() + 1);
    for (std::size_t f = 0; f < dims_; ++f) term[f] = detail::fixed_term(h_[m * dims_ + f], inv);
    auto add = [&](std::uint32_t node) {
      std::int64_t* row = sums.data() + slot(node) * dims_;
      for (std::size_t f = 0; f < dims_; ++f) row[f] += term[f];
    };
    add(own_[m]);
    for (auto j : edges_[m]) add(j);
  }
  const std::uint64_t bytes = 4 * own_.size() + (4 + 8 * dims_) * known_.size();
  server_.tell(&gcn_server::take_sums, index_, own_, known_, std::move(sums));
  return bytes;
}

template <class T>
std::vector<T> get_all(std::vector<future<T>>& f) {
  std::vector<T> out;
  for (auto& x : f) out.push_back(x.get());
  f.clear();
  return out;
}

void wait_all(std::vector<future<void>>& f) {
  for (auto& x : f) x.get();
  f.clear();
}

}  // namespace

fedgcn_features run_fedgcn(const node_graph& g, std::span<const float> x, std::int64_t dims,
                           std::span<const std::uint32_t> client_of, std::size_t clients, int depth, int exact_hops,
                           unsigned threads) {
  const auto t0 = clock_type::now();
  if (dims < 1) throw std::invalid_argument("run_fedgcn: dims must be at least 1");
  if (x.size() != g.nodes() * static_cast<std::size_t>(dims) || client_of.size() != g.nodes())
    throw std::invalid_argument("run_fedgcn: one feature row and one client per node");
  if (depth < 0 || exact_hops < 0 || exact_hops > depth)
    throw std::invalid_argument("run_fedgcn: the exchanged hops must be in 0..depth (" + std::to_string(depth) + ")");
  if (clients < 1) throw std::invalid_argument("run_fedgcn: at least one client");
  const auto d = static_cast<std::size_t>(dims);
  std::vector<std::vector<std::uint32_t>> own(clients);
  for (std::size_t i = 0; i < g.nodes(); ++i) {
    if (client_of[i] >= clients)
      throw std::invalid_argument("run_fedgcn: node " + std::to_string(i) + " belongs to client " +
                                  std::to_string(client_of[i]) + " of " + std::to_string(clients));
    own[client_of[i]].push_back(static_cast<std::uint32_t>(i));
  }
  actor_system system{system_config{.threads = threads ? threads : std::max(1u, std::thread::hardware_concurrency())}};
  std::vector<actor_ref<gcn_client>> refs;
  for (std::size_t c = 0; c < clients; ++c) {
    std::vector<float> rows(own[c].size() * d);
    std::vector<std::vector<std::uint32_t>> edges;
    for (std::size_t m = 0; m < own[c].size(); ++m) {
      std::copy_n(x.data() + static_cast<std::size_t>(own[c][m]) * d, d, rows.data() + m * d);
      const auto nb = g.of(own[c][m]);
      edges.emplace_back(nb.begin(), nb.end());
    }
    refs.push_back(system.spawn<gcn_client>(static_cast<std::uint32_t>(c), own[c], std::move(rows), dims, std::move(edges)));
  }
  auto server = system.spawn<gcn_server>(g.nodes(), dims);
  server.ask(&gcn_server::connect, refs).get();
  std::vector<future<void>> done;
  for (auto& r : refs) done.push_back(r.ask(&gcn_client::connect, server));
  wait_all(done);
  fedgcn_features out;
  for (int hop = 0; hop < depth; ++hop) {
    if (hop < exact_hops) {
      std::vector<future<std::uint64_t>> sent;
      for (auto& r : refs) sent.push_back(r.ask(&gcn_client::send_sums));
      for (auto b : get_all(sent)) out.uplink_bytes += b;
      out.downlink_bytes += server.ask(&gcn_server::distribute).get();
      for (auto& r : refs) done.push_back(r.ask(&gcn_client::finish_exchange));
    } else {
      for (auto& r : refs) done.push_back(r.ask(&gcn_client::local_hop));
    }
    wait_all(done);
  }
  std::vector<future<std::vector<float>>> rows;
  for (auto& r : refs) rows.push_back(r.ask(&gcn_client::features));
  out.features.assign(x.size(), 0.0f);
  for (std::size_t c = 0; c < clients; ++c) {
    const auto h = rows[c].get();
    for (std::size_t m = 0; m < own[c].size(); ++m)
      std::copy_n(h.data() + m * d, d, out.features.data() + static_cast<std::size_t>(own[c][m]) * d);
  }
  out.seconds = since(t0);
  return out;
}

int parse_graph_spec(const std::string& spec) {
  const std::string prefix = "knn:";
  if (spec.rfind(prefix, 0) != 0 || spec.size() == prefix.size() || spec.size() > prefix.size() + 4 ||
      !std::all_of(spec.begin() + static_cast<std::ptrdiff_t>(prefix.size()), spec.end(), [](char c) { return c >= '0' && c <= '9'; }))
    throw std::invalid_argument("--graph " + spec + ": expected knn:K (K nearest neighbours, 1 to 1000)");
  const int k = std::stoi(spec.substr(prefix.size()));
  if (k < 1 || k > 1000) throw std::invalid_argument("--graph " + spec + ": K must be in 1..1000");
  return k;
}

void check_graph_options(const graph_options& g) {
  const auto& o = g.base;
  if (g.k < 1 || g.k > 1000) throw std::invalid_argument("--graph knn:K: K must be in 1..1000");
  if (g.depth < 0 || g.depth > 8) throw std::invalid_argument("--graph-depth " + std::to_string(g.depth) + ": must be in 0..8");
  if (g.hops < 0 || g.hops > g.depth)
    throw std::invalid_argument("--graph-hops " + std::to_string(g.hops) + ": must be in 0.." + std::to_string(g.depth) +
                                " (at most --graph-depth, the propagations SGC makes)");
  if (!(g.beta > 0) || !std::isfinite(g.beta)) throw std::invalid_argument("--graph-beta must be a positive number");
  if (g.labelled < 1) throw std::invalid_argument("--graph-labelled must be at least 1");
  if (g.components < 1) throw std::invalid_argument("the PCA needs at least one component");
  if (o.rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  if (o.clients < 1 || o.clients > 100000) throw std::invalid_argument("--graph takes 1 to 100000 clients");
  if (o.eval_every < 1) throw std::invalid_argument("--eval-every must be at least 1");
  if (o.device != "cpu") throw std::invalid_argument("--graph trains on the CPU (--device cpu)");
  if (o.trainer != "mlp") throw std::invalid_argument("--graph trains SGC's linear layer (--trainer mlp)");
}

graph_summary run_graph(const graph_options& g, const std::function<void(const progress&)>& report) {
  check_graph_options(g);
  const auto& o = g.base;
  const auto start = clock_type::now();
  const auto data = detail::load_data(o);
  const std::int64_t n_train = data->train.size(), n_test = data->test.size(), n = n_train + n_test;
  if (g.labelled > static_cast<std::size_t>(n_train))
    throw std::invalid_argument("--graph-labelled " + std::to_string(g.labelled) + ": there are " + std::to_string(n_train) +
                                " training images");
  if (static_cast<std::int64_t>(o.clients) > n)
    throw std::invalid_argument("--clients " + std::to_string(o.clients) + ": more clients than the " + std::to_string(n) + " nodes");
  // The nodes' pixels: training images first, then the test images.
  auto flat = [&](const tensor& images) {
    return images.type() == dtype::u8 ? normalize(images, data->mean, data->stddev) : images.clone();
  };
  const tensor train_x = flat(data->train.images), test_x = flat(data->test.images);
  const std::int64_t pixels = train_x.numel() / n_train;
  if (pixels != test_x.numel() / std::max<std::int64_t>(1, n_test))
    throw std::invalid_argument("--graph: the training and test images differ in size");
  if (g.components > pixels)
    throw std::invalid_argument("--graph: " + std::to_string(g.components) + " principal components of " +
                                std::to_string(pixels) + " features");
  std::vector<float> x(static_cast<std::size_t>(n * pixels));
  std::copy_n(train_x.data<float>().data(), train_x.numel(), x.data());
  std::copy_n(test_x.data<float>().data(), test_x.numel(), x.data() + train_x.numel());
  const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());

  graph_summary s;
  s.nodes = static_cast<std::size_t>(n);
  s.test_nodes = static_cast<std::size_t>(n_test);
  const auto t_build = clock_type::now();
  const auto basis = fit_pca(x, n, pixels, g.components);
  auto z = pca_project(basis, x, n);
  x = {};
  const auto graph = symmetrize(nearest_neighbours(z, n, g.components, g.k, threads), static_cast<std::size_t>(n), g.k);
  s.graph_build_s = since(t_build);
  s.graph_edges = graph.edges();
  // The features: the components scaled to unit variance.
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < g.components; ++c) {
      const double v = basis.variance[static_cast<std::size_t>(c)];
      if (v > 0) z[static_cast<std::size_t>(i * g.components + c)] /= static_cast<float>(std::sqrt(v));
    }

  // Nodes to clients: Dirichlet(beta) over every node's label.
  auto labels = tensor::empty({n}, dtype::u8);
  {
    auto l = labels.data<std::uint8_t>();
    const auto a = data->train.labels.data<std::uint8_t>(), b = data->test.labels.data<std::uint8_t>();
    std::copy(a.begin(), a.end(), l.begin());
    std::copy(b.begin(), b.end(), l.begin() + n_train);
  }
  const auto part = partition_dirichlet(labels, o.clients, g.beta, derive_seed(o.seed, stream_graph));
  std::vector<std::uint32_t> client_of(static_cast<std::size_t>(n));
  for (std::size_t c = 0; c < o.clients; ++c)
    for (auto i : part.shard(c)) client_of[i] = static_cast<std::uint32_t>(c);
  s.cross_client_edges = cross_client_edges(graph, client_of);

  const auto fed = run_fedgcn(graph, z, g.components, client_of, o.clients, g.depth, g.hops, threads);
  s.fedgcn_s = fed.seconds;
  s.fedgcn_bytes = fed.uplink_bytes + fed.downlink_bytes;

  // The labelled nodes: a seeded choice of training nodes, in ascending order.
  std::vector<std::int64_t> chosen;
  {
    auto order = shuffled_indices(n_train, derive_seed(derive_seed(o.seed, stream_graph), 1));
    chosen.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(g.labelled));
    std::sort(chosen.begin(), chosen.end());
  }
  s.labelled = chosen.size();
  const auto dims = static_cast<std::size_t>(g.components);
  labelled_data sgc;
  sgc.classes = data->classes;
  sgc.mean = 0;
  sgc.stddev = 1;
  sgc.train.images = tensor::empty({static_cast<std::int64_t>(chosen.size()), g.components});
  sgc.train.labels = tensor::empty({static_cast<std::int64_t>(chosen.size())}, dtype::u8);
  sgc.client_train = tensor::empty({static_cast<std::int64_t>(chosen.size())}, dtype::u32);
  {
    auto xi = sgc.train.images.data<float>();
    auto yi = sgc.train.labels.data<std::uint8_t>();
    auto ci = sgc.client_train.data<std::uint32_t>();
    const auto l = labels.data<std::uint8_t>();
    for (std::size_t r = 0; r < chosen.size(); ++r) {
      const auto node = static_cast<std::size_t>(chosen[r]);
      std::copy_n(fed.features.data() + node * dims, dims, xi.data() + r * dims);
      yi[r] = l[node];
      ci[r] = client_of[node];
    }
    if (*std::max_element(ci.begin(), ci.end()) + 1 != o.clients)
      throw std::invalid_argument("--graph: client " + std::to_string(o.clients - 1) +
                                  " holds no labelled node (raise --graph-labelled or use fewer --clients)");
  }
  sgc.test.images = tensor::empty({n_test, g.components});
  std::copy_n(fed.features.data() + static_cast<std::size_t>(n_train) * dims, static_cast<std::size_t>(n_test) * dims,
              sgc.test.images.data<float>().data());
  sgc.test.labels = data->test.labels.clone();

  // FedAvg of SGC's weights: a linear layer on the propagated features.
  simulation_options so = o;
  so.model = "mlp:" + std::to_string(g.components) + "-" + std::to_string(data->classes);
  so.data.clear();
  so.data_dir.clear();
  so.train_limit = 0;
  simulation sim(so, std::make_shared<const labelled_data>(std::move(sgc)));
  double round_seconds = 0;
  auto& t = s.training;
  for (int r = 1; r <= o.rounds; ++r) {
    const round_report rr = sim.run_round();
    round_seconds += rr.seconds;
    const auto model = sim.global_model();
    if (!std::all_of(model.begin(), model.end(), [](float v) { return std::isfinite(v); }))
      throw std::runtime_error("round " + std::to_string(r) + " diverged: the model is no longer finite (lower --lr)");
    progress p;
    p.round = &rr;
    p.rounds = o.rounds;
    if (r % o.eval_every == 0 || r == o.rounds) {
      p.evaluated = true;
      p.eval = sim.evaluate();
      t.final_accuracy = p.eval.accuracy;
      t.final_loss = p.eval.loss;
    }
    t.uplink_bytes += rr.uplink_bytes;
    p.rounds_per_s = r / round_seconds;
    p.seconds = since(start);
    p.simulated_seconds = sim.simulated_seconds();
    p.uplink_bytes = t.uplink_bytes;
    if (report) report(p);
  }
  const auto model = sim.global_model();
  t.model_crc32 = troupe::crc32(std::as_bytes(model));
  t.rounds = o.rounds;
  t.rounds_per_s = round_seconds > 0 ? o.rounds / round_seconds : 0.0;
  t.seconds = since(start);
  t.peak_rss_mb = peak_rss_mb();
  return s;
}

}  // namespace troupe::federated
