// Federated graph learning: the PCA against its definition (orthonormal axes, the eigen-equation,
// the variance it drops), the blocked kNN against brute force, the symmetrized graph, the
// fixed-point propagation against the double reference, FedGCN's features by messages against
// the centralised Â^K X bit for bit, the cross-client edges under IID assignment, and one client
// against centralised training.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "troupe/core/file.hpp"
#include "troupe/federated/graph.hpp"
#include "troupe/federated/partition.hpp"
#include "troupe/federated/rng.hpp"
#include "troupe/kernels/data.hpp"

namespace {

using namespace troupe::federated;

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// A kNN graph of random points: n nodes, about k..2k neighbours each.
node_graph random_graph(std::size_t n, int k, std::uint32_t seed) {
  const auto x = gaussian(n * 8, seed);
  return symmetrize(nearest_neighbours(x, static_cast<std::int64_t>(n), 8, k), n, k);
}

std::vector<std::uint32_t> random_clients(std::size_t n, std::uint32_t clients, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> c(n);
  for (auto& x : c) x = static_cast<std::uint32_t>(rng() % clients);
  return c;
}

TEST(GraphPca, AxesAreOrthonormalEigenvectorsOfTheCovarianceAndDropTheRestOfTheVariance) {
  // 800 rows of 12 columns with very different variances and correlations.
  const std::int64_t rows = 800, dims = 12, k = 4;
  auto base = gaussian(static_cast<std::size_t>(rows * dims), 3);
  std::vector<float> x(base.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t d = 0; d < dims; ++d) {
      float v = base[static_cast<std::size_t>(i * dims + d)] * static_cast<float>(dims - d) + 2.0f;
      if (d > 0) v += 0.5f * base[static_cast<std::size_t>(i * dims)];
      x[static_cast<std::size_t>(i * dims + d)] = v;
    }
  const auto b = fit_pca(x, rows, dims, k);
  // The covariance in double, from its definition.
  std::vector<double> mean(dims, 0.0), cov(static_cast<std::size_t>(dims * dims), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t d = 0; d < dims; ++d) mean[d] += x[static_cast<std::size_t>(i * dims + d)] / static_cast<double>(rows);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t a = 0; a < dims; ++a)
      for (std::int64_t c = 0; c < dims; ++c)
        cov[static_cast<std::size_t>(a * dims + c)] += (x[static_cast<std::size_t>(i * dims + a)] - mean[a]) *
                                                       (x[static_cast<std::size_t>(i * dims + c)] - mean[c]) / (rows - 1);
  for (std::int64_t d = 0; d < dims; ++d) EXPECT_NEAR(b.mean[d], mean[d], 1e-9);
  double trace = 0;
  for (std::int64_t d = 0; d < dims; ++d) trace += cov[static_cast<std::size_t>(d * dims + d)];
  for (std::int64_t p = 0; p < k; ++p) {
    if (p > 0) {
      EXPECT_GE(b.variance[p - 1], b.variance[p]);
    }
    for (std::int64_t q = 0; q < k; ++q) {
      double dot = 0;
      for (std::int64_t d = 0; d < dims; ++d) dot += b.axes[p * dims + d] * b.axes[q * dims + d];
      EXPECT_NEAR(dot, p == q ? 1.0 : 0.0, 1e-9) << "axes " << p << ", " << q;
    }
    // C v = lambda v, to the float product's rounding (relative to the largest eigenvalue).
    for (std::int64_t a = 0; a < dims; ++a) {
      double cv = 0;
      for (std::int64_t d = 0; d < dims; ++d) cv += cov[static_cast<std::size_t>(a * dims + d)] * b.axes[p * dims + d];
      EXPECT_NEAR(cv, b.variance[p] * b.axes[p * dims + a], 1e-5 * b.variance[0]) << "axis " << p;
    }
  }
  // What the k axes leave out is the sum of the other eigenvalues: the trace less theirs.
  const auto z = pca_project(b, x, rows);
  double residual = 0, kept = 0;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t d = 0; d < dims; ++d) {
      double rec = mean[d];
      for (std::int64_t p = 0; p < k; ++p) rec += z[static_cast<std::size_t>(i * k + p)] * b.axes[p * dims + d];
      const double e = x[static_cast<std::size_t>(i * dims + d)] - rec;
      residual += e * e / (rows - 1);
    }
  for (std::int64_t p = 0; p < k; ++p) kept += b.variance[p];
  EXPECT_NEAR(residual, trace - kept, 1e-4 * trace);
  EXPECT_THROW(fit_pca(x, rows, dims, dims + 1), std::invalid_argument);
  EXPECT_THROW(fit_pca(x, rows, dims, 0), std::invalid_argument);
}

TEST(GraphKnn, TopKRanksByScoreThenByTheLowerIndex) {
  const std::vector<float> s = {0.5f, 0.9f, 0.5f, 0.9f, 0.1f, 0.5f};
  EXPECT_EQ(top_k(s, 99, 4), (std::vector<std::uint32_t>{1, 3, 0, 2}));
  EXPECT_EQ(top_k(s, 1, 3), (std::vector<std::uint32_t>{3, 0, 2}));
  EXPECT_EQ(top_k(s, 0, 5), (std::vector<std::uint32_t>{1, 3, 2, 5, 4}));
  EXPECT_THROW(top_k(s, 0, 6), std::invalid_argument);
}

TEST(GraphKnn, BlockedBlasNeighboursMatchBruteForce) {
  // 700 rows: three blocks of rows, on two threads.
  const std::int64_t rows = 700, dims = 20;
  const int k = 7;
  const auto x = gaussian(static_cast<std::size_t>(rows * dims), 11);
  const auto fast = nearest_neighbours(x, rows, dims, k, 2);
  const auto ref = nearest_neighbours_reference(x, rows, dims, k);
  ASSERT_EQ(fast.size(), ref.size());
  auto cosine = [&](std::int64_t i, std::int64_t j) {
    double dot = 0, ni = 0, nj = 0;
    for (std::int64_t d = 0; d < dims; ++d) {
      const double a = x[static_cast<std::size_t>(i * dims + d)], b = x[static_cast<std::size_t>(j * dims + d)];
      dot += a * b, ni += a * a, nj += b * b;
    }
    return dot / std::sqrt(ni * nj);
  };
  std::size_t differ = 0;
  for (std::int64_t i = 0; i < rows; ++i)
    for (int m = 0; m < k; ++m) {
      const auto a = fast[static_cast<std::size_t>(i * k + m)], b = ref[static_cast<std::size_t>(i * k + m)];
      if (a == b) continue;
      ++differ;  // only where float rounding can reorder two all but equal similarities
      EXPECT_NEAR(cosine(i, a), cosine(i, b), 1e-6) << "row " << i << " rank " << m;
    }
  EXPECT_LE(differ, 2u);
  EXPECT_EQ(nearest_neighbours(x, rows, dims, k, 1), fast) << "the thread count changed the graph";
}

TEST(GraphKnn, DuplicatePointsAreNeighboursAndZeroRowsAreHandled) {
  // Rows 0 and 3 are the same direction: each is the other's nearest. Row 4 is zero.
  const std::vector<float> x = {1, 0, 0, 0, 1, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0};
  const auto nn = nearest_neighbours(x, 5, 3, 1);
  EXPECT_EQ(nn[0], 3u);
  EXPECT_EQ(nn[3], 0u);
  EXPECT_EQ(nearest_neighbours_reference(x, 5, 3, 1), nn);
  EXPECT_THROW(nearest_neighbours(x, 5, 3, 5), std::invalid_argument);
}

TEST(GraphKnn, SymmetrizedGraphHasEveryListedEdgeBothWaysOnceAndNoSelfLoop) {
  const std::size_t n = 300;
  const int k = 5;
  const auto x = gaussian(n * 6, 5);
  const auto nn = nearest_neighbours(x, n, 6, k);
  const auto g = symmetrize(nn, n, k);
  std::set<std::pair<std::uint32_t, std::uint32_t>> expected;
  for (std::size_t i = 0; i < n; ++i)
    for (int m = 0; m < k; ++m) {
      const auto j = nn[i * k + m], a = static_cast<std::uint32_t>(i);
      expected.insert({std::min(a, j), std::max(a, j)});
    }
  EXPECT_EQ(g.edges(), expected.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto row = g.of(i);
    EXPECT_TRUE(std::is_sorted(row.begin(), row.end()));
    EXPECT_GE(row.size(), static_cast<std::size_t>(k));
    for (auto j : row) {
      EXPECT_NE(j, i);
      const auto a = static_cast<std::uint32_t>(i);
      EXPECT_TRUE(expected.count({std::min(a, j), std::max(a, j)})) << i << "-" << j;
    }
  }
}

TEST(GraphPropagate, FixedPointSumsMatchTheDoubleReference) {
  const std::size_t n = 500;
  const std::int64_t d = 6;
  const auto g = random_graph(n, 6, 7);
  const auto x = gaussian(n * d, 8, 2.0f);
  for (int depth : {0, 1, 2, 3}) {
    const auto fast = propagate(g, x, d, depth);
    const auto ref = propagate_reference(g, x, d, depth);
    for (std::size_t k = 0; k < fast.size(); ++k) ASSERT_NEAR(fast[k], ref[k], 1e-5 + 1e-6 * std::fabs(ref[k])) << depth;
  }
  // Â's rows of a constant vector: (Â 1)_i = sum_j 1 / sqrt(d_i d_j), by hand for node 0.
  std::vector<float> ones(n, 1.0f);
  const auto one = propagate(g, ones, 1, 1);
  double hand = 1.0 / static_cast<double>(g.degree(0));
  for (auto j : g.of(0)) hand += 1.0 / std::sqrt(static_cast<double>(g.degree(0) * g.degree(j)));
  EXPECT_NEAR(one[0], hand, 1e-6);
  auto big = x;
  big[3] = 1e9f;
  EXPECT_THROW(propagate(g, big, d, 1), std::invalid_argument);
}

TEST(FedGcn, ExchangedHopsEqualTheCentralisedPropagationBitForBit) {
  const std::size_t n = 900;
  const std::int64_t d = 5;
  const auto g = random_graph(n, 8, 21);
  const auto x = gaussian(n * d, 22);
  const auto client_of = random_clients(n, 7, 23);
  ASSERT_GT(cross_client_edges(g, client_of), g.edges() / 2);
  const auto central = propagate(g, x, d, 2);
  const auto fed = run_fedgcn(g, x, d, client_of, 7, 2, 2, 3);
  ASSERT_EQ(fed.features.size(), central.size());
  EXPECT_EQ(std::memcmp(fed.features.data(), central.data(), central.size() * sizeof(float)), 0)
      << "2-hop FedGCN's features differ from the centralised A^2 X";
  // Ids and sums: own nodes' 4 bytes once, then per known node 4 + 8 * d up and 8 * d down.
  std::uint64_t known = 0;
  for (std::uint32_t c = 0; c < 7; ++c) {
    std::set<std::uint32_t> k;
    for (std::size_t i = 0; i < n; ++i)
      if (client_of[i] == c) {
        k.insert(static_cast<std::uint32_t>(i));
        for (auto j : g.of(i)) k.insert(j);
      }
    known += k.size();
  }
  EXPECT_EQ(fed.uplink_bytes, 2 * (4 * n + (4 + 8 * d) * known));
  EXPECT_EQ(fed.downlink_bytes, 2 * 8 * d * n);
  // One exchanged hop: exact A X, then the second hop inside each client.
  const auto one = run_fedgcn(g, x, d, client_of, 7, 2, 1, 2);
  const auto one_ref = propagate(g, x, d, 2, client_of, 1);
  EXPECT_EQ(std::memcmp(one.features.data(), one_ref.data(), one_ref.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(one.features.data(), central.data(), central.size() * sizeof(float)), 0);
  // A single propagation exchanged is exact A X.
  const auto ax = run_fedgcn(g, x, d, client_of, 7, 1, 1, 2);
  const auto ax_ref = propagate(g, x, d, 1);
  EXPECT_EQ(std::memcmp(ax.features.data(), ax_ref.data(), ax_ref.size() * sizeof(float)), 0);
}

TEST(FedGcn, ZeroHopsIsTheGraphWithoutItsCrossClientEdges) {
  const std::size_t n = 600;
  const std::int64_t d = 4;
  const auto g = random_graph(n, 6, 31);
  const auto x = gaussian(n * d, 32);
  const auto client_of = random_clients(n, 4, 33);
  // The graph of the edges inside clients, built by hand.
  std::vector<std::uint32_t> none;
  node_graph inside;
  inside.offsets = {0};
  for (std::size_t i = 0; i < n; ++i) {
    for (auto j : g.of(i))
      if (client_of[j] == client_of[i]) inside.neighbours.push_back(j);
    inside.offsets.push_back(inside.neighbours.size());
  }
  const auto expected = propagate(inside, x, d, 2);
  const auto fed = run_fedgcn(g, x, d, client_of, 4, 2, 0, 2);
  EXPECT_EQ(std::memcmp(fed.features.data(), expected.data(), expected.size() * sizeof(float)), 0);
  EXPECT_EQ(fed.uplink_bytes + fed.downlink_bytes, 0u) << "no hop exchanged, nothing sent";
  EXPECT_EQ(propagate(g, x, d, 2, client_of, 0), expected);
}

TEST(GraphPartition, CrossClientEdgeFractionIsOneMinusOneOverClientsUnderIidAssignment) {
  // A graph of 20,000 nodes (about 14 neighbours each), labels of 10 classes.
  const std::size_t n = 20000;
  const auto g = random_graph(n, 10, 41);
  auto labels = troupe::tensor::empty({static_cast<std::int64_t>(n)}, troupe::dtype::u8);
  auto l = labels.data<std::uint8_t>();
  std::mt19937 rng(42);
  for (auto& y : l) y = static_cast<std::uint8_t>(rng() % 10);
  for (std::size_t clients : {2u, 5u, 10u, 50u}) {
    const auto part = partition_dirichlet(labels, clients, 10000.0, derive_seed(9, clients));
    std::vector<std::uint32_t> client_of(n);
    for (std::size_t c = 0; c < clients; ++c)
      for (auto i : part.shard(c)) client_of[i] = static_cast<std::uint32_t>(c);
    const double fraction = static_cast<double>(cross_client_edges(g, client_of)) / static_cast<double>(g.edges());
    EXPECT_NEAR(fraction, 1.0 - 1.0 / static_cast<double>(clients), 0.01) << clients << " clients";
  }
}

TEST(GraphRun, OneClientTrainsOnTheCentralisedPropagationAsCentralisedTrainingDoes) {
  // 3,000 labelled training images and the 10,000 test images: 13,000 nodes.
  graph_options g;
  g.base.train_limit = 3000;
  g.base.clients = 1;
  g.base.per_round = 1;
  g.base.rounds = 3;
  g.base.local_steps = 30;
  g.base.eval_every = 3;
  g.base.threads = 2;
  g.labelled = 3000;
  const auto run = run_graph(g);
  EXPECT_EQ(run.nodes, 13000u);
  EXPECT_EQ(run.cross_client_edges, 0u);
  EXPECT_GE(run.graph_edges, 13000u * 10 / 2);
  EXPECT_GT(run.fedgcn_bytes, 0u);
  g.hops = 0;
  const auto local = run_graph(g);
  EXPECT_EQ(local.fedgcn_bytes, 0u);
  EXPECT_EQ(local.training.model_crc32, run.training.model_crc32) << "one client: no edge crosses, the hops change nothing";

  // Centralised: the same pipeline by hand, Â² X over the whole graph, one simulation client.
  auto all = troupe::load_fashion_mnist();
  const auto tr = troupe::normalize(all.train.images.slice(0, 3000).clone()), te = troupe::normalize(all.test.images);
  std::vector<float> x(tr.data<float>().begin(), tr.data<float>().end());
  x.insert(x.end(), te.data<float>().begin(), te.data<float>().end());
  const std::int64_t n = 13000;
  const auto b = fit_pca(x, n, 784, 50);
  auto z = pca_project(b, x, n);
  const auto graph = symmetrize(nearest_neighbours(z, n, 50, 10, 2), n, 10);
  EXPECT_EQ(graph.edges(), run.graph_edges);
  for (std::int64_t i = 0; i < n; ++i)
    for (int c = 0; c < 50; ++c) z[i * 50 + c] /= static_cast<float>(std::sqrt(b.variance[c]));
  const auto h = propagate(graph, z, 50, 2);
  troupe::labelled_data data;
  data.mean = 0;
  data.stddev = 1;
  data.train.images = troupe::tensor::from(std::span<const float>(h.data(), 3000 * 50), {3000, 50});
  data.train.labels = all.train.labels.slice(0, 3000).clone();
  data.test.images = troupe::tensor::from(std::span<const float>(h.data() + 3000 * 50, 10000 * 50), {10000, 50});
  data.test.labels = all.test.labels;
  data.client_train = troupe::tensor::zeros({3000}, troupe::dtype::u32);
  simulation_options o = g.base;
  o.model = "mlp:50-10";
  o.train_limit = 0;
  simulation sim(o, std::make_shared<const troupe::labelled_data>(std::move(data)));
  for (int r = 0; r < 3; ++r) sim.run_round();
  const auto model = sim.global_model();
  EXPECT_EQ(troupe::crc32(std::as_bytes(model)), run.training.model_crc32);
  EXPECT_NEAR(sim.evaluate().accuracy, run.training.final_accuracy, 1e-12);
  EXPECT_GT(run.training.final_accuracy, 0.5);
}

TEST(GraphOptions, RefusesWhatCannotRun) {
  EXPECT_EQ(parse_graph_spec("knn:10"), 10);
  for (const char* bad : {"knn", "knn:", "knn:0", "knn:-3", "knn:1001", "kmeans:5", "knn:5x", "knn:99999999999"})
    EXPECT_THROW(parse_graph_spec(bad), std::invalid_argument) << bad;
  graph_options g;
  g.hops = 3;
  EXPECT_THROW(check_graph_options(g), std::invalid_argument);
  g.hops = 2;
  g.beta = 0;
  EXPECT_THROW(check_graph_options(g), std::invalid_argument);
  g.beta = 1;
  g.labelled = 0;
  EXPECT_THROW(check_graph_options(g), std::invalid_argument);
  g.labelled = 10;
  g.base.trainer = "noop";
  EXPECT_THROW(check_graph_options(g), std::invalid_argument);
}

}  // namespace
