// The graph of federated graph learning: PCA through the BLAS and LAPACK, the k nearest
// neighbours by cosine similarity in blocks of rows (one BLAS product per block, so that the
// n x n similarities never exist whole), their brute-force reference, and symmetrization.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "troupe/federated/graph.hpp"
#include "troupe/kernels/gemm.hpp"
#include "troupe/kernels/svd.hpp"

namespace troupe::federated {

namespace {

void check_matrix(std::span<const float> x, std::int64_t rows, std::int64_t dims, const char* what) {
  if (rows < 1 || dims < 1) throw std::invalid_argument(std::string(what) + ": rows and dims must be at least 1");
  if (x.size() != static_cast<std::size_t>(rows) * static_cast<std::size_t>(dims))
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(x.size()) + " values for " + std::to_string(rows) +
                                " x " + std::to_string(dims));
}

/// Rows scaled to unit length (a zero row stays zero), as an f32 tensor.
tensor unit_rows(std::span<const float> x, std::int64_t rows, std::int64_t dims) {
  auto u = tensor::empty({rows, dims});
  auto out = u.data<float>();
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* row = x.data() + i * dims;
    double norm = 0;
    for (std::int64_t d = 0; d < dims; ++d) norm += static_cast<double>(row[d]) * row[d];
    const float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.0f;
    for (std::int64_t d = 0; d < dims; ++d) out[static_cast<std::size_t>(i * dims + d)] = row[d] * inv;
  }
  return u;
}

}  // namespace

pca_basis fit_pca(std::span<const float> x, std::int64_t rows, std::int64_t dims, std::int64_t components) {
  check_matrix(x, rows, dims, "fit_pca");
  if (rows < 2) throw std::invalid_argument("fit_pca: needs at least 2 rows");
  if (components < 1 || components > dims)
    throw std::invalid_argument("fit_pca: components must be in 1.." + std::to_string(dims));
  pca_basis b;
  b.dims = dims;
  b.components = components;
  b.mean.assign(static_cast<std::size_t>(dims), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t d = 0; d < dims; ++d) b.mean[static_cast<std::size_t>(d)] += x[static_cast<std::size_t>(i * dims + d)];
  for (auto& m : b.mean) m /= static_cast<double>(rows);
  auto centred = tensor::empty({rows, dims});
  {
    auto c = centred.data<float>();
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t d = 0; d < dims; ++d) {
        const auto k = static_cast<std::size_t>(i * dims + d);
        c[k] = static_cast<float>(x[k] - b.mean[static_cast<std::size_t>(d)]);
      }
  }
  auto cov = tensor::empty({dims, dims});
  kernels::gemm(centred, true, centred, false, cov, 1.0f / static_cast<float>(rows - 1), 0.0f);
  // The float product is symmetric only to rounding: LAPACK gets its symmetric part in double.
  const auto c = cov.data<float>();
  std::vector<double> sym(static_cast<std::size_t>(dims * dims));
  for (std::int64_t i = 0; i < dims; ++i)
    for (std::int64_t j = 0; j < dims; ++j)
      sym[static_cast<std::size_t>(i * dims + j)] =
          0.5 * (static_cast<double>(c[static_cast<std::size_t>(i * dims + j)]) + c[static_cast<std::size_t>(j * dims + i)]);
  const auto s = kernels::svd(sym, dims, dims);
  b.axes.assign(s.vt.begin(), s.vt.begin() + components * dims);
  b.variance.assign(s.s.begin(), s.s.begin() + components);
  return b;
}

std::vector<float> pca_project(const pca_basis& b, std::span<const float> x, std::int64_t rows) {
  check_matrix(x, rows, b.dims, "pca_project");
  auto centred = tensor::empty({rows, b.dims});
  auto c = centred.data<float>();
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t d = 0; d < b.dims; ++d) {
      const auto k = static_cast<std::size_t>(i * b.dims + d);
      c[k] = static_cast<float>(x[k] - b.mean[static_cast<std::size_t>(d)]);
    }
  auto axes = tensor::empty({b.components, b.dims});
  auto a = axes.data<float>();
  for (std::size_t k = 0; k < a.size(); ++k) a[k] = static_cast<float>(b.axes[k]);
  auto out = tensor::empty({rows, b.components});
  kernels::gemm(centred, false, axes, true, out);
  auto o = out.data<float>();
  return {o.begin(), o.end()};
}

std::vector<std::uint32_t> top_k(std::span<const float> scores, std::size_t self, int k) {
  if (k < 1 || static_cast<std::size_t>(k) >= scores.size() + (self < scores.size() ? 0 : 1))
    throw std::invalid_argument("top_k: k must be in 1.." + std::to_string(scores.size() - 1));
  // The best k so far, best first. Candidates come in ascending index, so one that only ties
  // the worst kept ranks after it (the lower index wins): only a strictly higher score enters.
  std::vector<std::pair<float, std::uint32_t>> best;
  best.reserve(static_cast<std::size_t>(k) + 1);
  for (std::size_t j = 0; j < scores.size(); ++j) {
    if (j == self) continue;
    const float s = scores[j];
    if (best.size() == static_cast<std::size_t>(k) && !(s > best.back().first)) continue;
    auto at = best.end();
    while (at != best.begin() && s > (at - 1)->first) --at;
    best.insert(at, {s, static_cast<std::uint32_t>(j)});
    if (best.size() > static_cast<std::size_t>(k)) best.pop_back();
  }
  std::vector<std::uint32_t> out;
  for (const auto& [s, j] : best) out.push_back(j);
  return out;
}

std::vector<std::uint32_t> nearest_neighbours(std::span<const float> x, std::int64_t rows, std::int64_t dims, int k,
                                              unsigned threads) {
  check_matrix(x, rows, dims, "nearest_neighbours");
  if (k < 1 || k >= rows) throw std::invalid_argument("nearest_neighbours: k must be in 1.." + std::to_string(rows - 1));
  const tensor u = unit_rows(x, rows, dims);
  std::vector<std::uint32_t> out(static_cast<std::size_t>(rows) * static_cast<std::size_t>(k));
  // 256 rows per block: 256 x 70,000 similarities are 72 MB per thread.
  constexpr std::int64_t block = 256;
  const std::int64_t blocks = (rows + block - 1) / block;
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(blocks)));
  auto work = [&](unsigned t) {
    tensor sims;
    for (std::int64_t b = t; b < blocks; b += threads) {
      const std::int64_t begin = b * block, end = std::min(rows, begin + block);
      if (!sims.defined() || sims.dim(0) != end - begin) sims = tensor::empty({end - begin, rows});
      kernels::gemm(u.slice(begin, end), false, u, true, sims);
      const auto s = sims.data<float>();
      for (std::int64_t i = begin; i < end; ++i) {
        const auto best = top_k(s.subspan(static_cast<std::size_t>((i - begin) * rows), static_cast<std::size_t>(rows)),
                                static_cast<std::size_t>(i), k);
        std::copy(best.begin(), best.end(), out.begin() + i * k);
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& p : pool) p.join();
  return out;
}

std::vector<std::uint32_t> nearest_neighbours_reference(std::span<const float> x, std::int64_t rows, std::int64_t dims,
                                                        int k) {
  check_matrix(x, rows, dims, "nearest_neighbours_reference");
  if (k < 1 || k >= rows) throw std::invalid_argument("nearest_neighbours_reference: k must be in 1.." + std::to_string(rows - 1));
  std::vector<double> norm(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    double s = 0;
    for (std::int64_t d = 0; d < dims; ++d) s += static_cast<double>(x[static_cast<std::size_t>(i * dims + d)]) * x[static_cast<std::size_t>(i * dims + d)];
    norm[static_cast<std::size_t>(i)] = std::sqrt(s);
  }
  std::vector<std::uint32_t> out;
  for (std::int64_t i = 0; i < rows; ++i) {
    std::vector<std::pair<double, std::uint32_t>> all;
    for (std::int64_t j = 0; j < rows; ++j) {
      if (j == i) continue;
      double dot = 0;
      for (std::int64_t d = 0; d < dims; ++d)
        dot += static_cast<double>(x[static_cast<std::size_t>(i * dims + d)]) * x[static_cast<std::size_t>(j * dims + d)];
      const double n = norm[static_cast<std::size_t>(i)] * norm[static_cast<std::size_t>(j)];
      all.push_back({n > 0 ? dot / n : 0.0, static_cast<std::uint32_t>(j)});
    }
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    for (int m = 0; m < k; ++m) out.push_back(all[static_cast<std::size_t>(m)].second);
  }
  return out;
}

node_graph symmetrize(std::span<const std::uint32_t> nearest, std::size_t nodes, int k) {
  if (k < 1 || nearest.size() != nodes * static_cast<std::size_t>(k))
    throw std::invalid_argument("symmetrize: expected nodes x k neighbour indices");
  std::vector<std::pair<std::uint32_t, std::uint32_t>> pairs;  // (lower, higher), each edge once
  pairs.reserve(nearest.size());
  for (std::size_t i = 0; i < nodes; ++i)
    for (int m = 0; m < k; ++m) {
      const std::uint32_t j = nearest[i * static_cast<std::size_t>(k) + static_cast<std::size_t>(m)];
      if (j >= nodes) throw std::invalid_argument("symmetrize: neighbour " + std::to_string(j) + " is no node");
      if (j == i) continue;
      const auto a = static_cast<std::uint32_t>(i);
      pairs.push_back({std::min(a, j), std::max(a, j)});
    }
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  node_graph g;
  std::vector<std::uint64_t> count(nodes, 0);
  for (auto [a, b] : pairs) ++count[a], ++count[b];
  g.offsets.assign(nodes + 1, 0);
  for (std::size_t i = 0; i < nodes; ++i) g.offsets[i + 1] = g.offsets[i] + count[i];
  g.neighbours.resize(g.offsets[nodes]);
  std::vector<std::uint64_t> fill(g.offsets.begin(), g.offsets.end() - 1);
  // Pairs in ascending (a, b): each row receives its neighbours in ascending order.
  for (auto [a, b] : pairs) g.neighbours[fill[a]++] = b;
  for (auto [a, b] : pairs) g.neighbours[fill[b]++] = a;
  for (std::size_t i = 0; i < nodes; ++i)
    std::sort(g.neighbours.begin() + static_cast<std::ptrdiff_t>(g.offsets[i]),
              g.neighbours.begin() + static_cast<std::ptrdiff_t>(g.offsets[i + 1]));
  return g;
}

std::size_t cross_client_edges(const node_graph& g, std::span<const std::uint32_t> client_of) {
  if (client_of.size() != g.nodes()) throw std::invalid_argument("cross_client_edges: one client per node");
  std::size_t cross = 0;
  for (std::size_t i = 0; i < g.nodes(); ++i)
    for (auto j : g.of(i))
      if (j > i && client_of[j] != client_of[i]) ++cross;
  return cross;
}

}  // namespace troupe::federated
