// Graphs of peers for decentralized training, their Metropolis–Hastings weights, the consensus
// error, and the plain references of one averaging step and of gossip's edge draws.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/federated/decentralized.hpp"
#include "troupe/federated/rng.hpp"

namespace troupe::federated {

namespace {

void add_edge(topology& g, std::uint32_t a, std::uint32_t b) {
  g.neighbours[a].push_back(b);
  g.neighbours[b].push_back(a);
}

void finish(topology& g) {
  for (auto& n : g.neighbours) {
    std::sort(n.begin(), n.end());
    n.erase(std::unique(n.begin(), n.end()), n.end());
  }
}

// A D-regular graph (the configuration model): each node's D half-edges paired at random among
// the pairs that keep the graph simple; when none is left the draw starts again (as in Steger
// and Wormald's algorithm).
bool try_random_regular(topology& g, std::size_t n, std::size_t d, splitmix64& rng) {
  g.neighbours.assign(n, {});
  std::vector<std::uint32_t> half_edges;
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < d; ++k) half_edges.push_back(i);
  auto linked = [&](std::uint32_t a, std::uint32_t b) {
    const auto& na = g.neighbours[a];
    return std::find(na.begin(), na.end(), b) != na.end();
  };
  while (!half_edges.empty()) {
    bool paired = false;
    for (int tries = 0; tries < 64 && !paired; ++tries) {
      const auto i = rng.below(half_edges.size()), j = rng.below(half_edges.size());
      const auto a = half_edges[i], b = half_edges[j];
      if (i == j || a == b || linked(a, b)) continue;
      add_edge(g, a, b);
      half_edges.erase(half_edges.begin() + static_cast<std::ptrdiff_t>(std::max(i, j)));
      half_edges.erase(half_edges.begin() + static_cast<std::ptrdiff_t>(std::min(i, j)));
      paired = true;
    }
    if (paired) continue;
    // Few half-edges left, or unlucky: look for any suitable pair before giving this draw up.
    std::vector<std::pair<std::size_t, std::size_t>> ok;
    for (std::size_t i = 0; i < half_edges.size(); ++i)
      for (std::size_t j = i + 1; j < half_edges.size(); ++j)
        if (half_edges[i] != half_edges[j] && !linked(half_edges[i], half_edges[j])) ok.emplace_back(i, j);
    if (ok.empty()) return false;
    const auto [i, j] = ok[rng.below(ok.size())];
    add_edge(g, half_edges[i], half_edges[j]);
    half_edges.erase(half_edges.begin() + static_cast<std::ptrdiff_t>(j));
    half_edges.erase(half_edges.begin() + static_cast<std::ptrdiff_t>(i));
  }
  finish(g);
  return true;
}

}  // namespace

topology make_topology(const std::string& spec, std::size_t n, std::uint64_t seed) {
  topology g;
  g.name = spec;
  const std::string sizes = " (--clients " + std::to_string(n) + ")";
  if (n < 2) throw std::invalid_argument("--topology " + spec + ": decentralized training needs at least 2 clients" + sizes);
  if (spec == "ring") {
    if (n < 3) throw std::invalid_argument("--topology ring needs at least 3 clients" + sizes);
    g.neighbours.assign(n, {});
    for (std::uint32_t i = 0; i < n; ++i) add_edge(g, i, static_cast<std::uint32_t>((i + 1) % n));
    finish(g);
    return g;
  }
  if (spec == "complete") {
    g.neighbours.assign(n, {});
    for (std::uint32_t i = 0; i < n; ++i)
      for (std::uint32_t j = i + 1; j < n; ++j) add_edge(g, i, j);
    finish(g);
    return g;
  }
  if (spec == "torus") {
    std::size_t rows = 0;
    for (std::size_t r = 3; r * r <= n; ++r)
      if (n % r == 0) rows = r;
    if (rows == 0)
      throw std::invalid_argument("--topology torus needs --clients R*C with R, C >= 3 (e.g. 9, 12, 100)" + sizes);
    const std::size_t cols = n / rows;
    g.neighbours.assign(n, {});
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        const auto i = static_cast<std::uint32_t>(r * cols + c);
        add_edge(g, i, static_cast<std::uint32_t>(r * cols + (c + 1) % cols));
        add_edge(g, i, static_cast<std::uint32_t>(((r + 1) % rows) * cols + c));
      }
    finish(g);
    g.name = "torus " + std::to_string(rows) + "x" + std::to_string(cols);
    return g;
  }
  const std::string rr = "random-regular:";
  if (spec.rfind(rr, 0) == 0) {
    const auto text = spec.substr(rr.size());
    std::size_t d = 0, used = 0;
    try {
      d = std::stoul(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || text.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("--topology " + spec + ": D must be a whole number (random-regular:D)");
    if (d < 1 || d >= n)
      throw std::invalid_argument("--topology " + spec + ": the degree must be between 1 and clients - 1" + sizes);
    if ((n * d) % 2 != 0)
      throw std::invalid_argument("--topology " + spec + ": clients * D must be even for a D-regular graph" + sizes);
    splitmix64 rng{seed};
    for (int attempt = 0; attempt < 1000; ++attempt)
      if (try_random_regular(g, n, d, rng) && is_connected(g)) return g;
    throw std::invalid_argument("--topology " + spec + ": no connected " + std::to_string(d) +
                                "-regular graph was drawn in 1000 attempts; raise D" + sizes);
  }
  throw std::invalid_argument("--topology " + spec + ": expected ring, torus, random-regular:D or complete");
}

bool is_connected(const topology& g) {
  if (g.size() == 0) return true;
  std::vector<bool> seen(g.size(), false);
  std::vector<std::uint32_t> stack{0};
  seen[0] = true;
  std::size_t reached = 1;
  while (!stack.empty()) {
    const auto v = stack.back();
    stack.pop_back();
    for (auto u : g.neighbours[v])
      if (!seen[u]) {
        seen[u] = true;
        ++reached;
        stack.push_back(u);
      }
  }
  return reached == g.size();
}

std::vector<mixing_row> metropolis_weights(const topology& g) {
  std::vector<mixing_row> w(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    double rest = 1;
    for (auto j : g.neighbours[i]) {
      const double wij = 1.0 / (1.0 + static_cast<double>(std::max(g.neighbours[i].size(), g.neighbours[j].size())));
      w[i].neighbour.push_back(wij);
      rest -= wij;
    }
    w[i].self = rest;
  }
  return w;
}

double consensus_error(const std::vector<std::vector<float>>& models) {
  if (models.empty()) return 0;
  const std::size_t n = models.size(), dim = models[0].size();
  for (const auto& m : models)
    if (m.size() != dim) throw std::invalid_argument("consensus_error: models of different sizes");
  std::vector<double> mean(dim, 0.0);
  for (const auto& m : models)
    for (std::size_t k = 0; k < dim; ++k) mean[k] += m[k];
  for (auto& x : mean) x /= static_cast<double>(n);
  double sq = 0;
  for (const auto& m : models)
    for (std::size_t k = 0; k < dim; ++k) {
      const double d = m[k] - mean[k];
      sq += d * d;
    }
  return std::sqrt(sq / static_cast<double>(n));
}

std::vector<std::vector<float>> metropolis_step(const topology& g, const std::vector<mixing_row>& w,
                                                const std::vector<std::vector<float>>& models) {
  std::vector<std::vector<float>> out(models.size());
  for (std::size_t i = 0; i < models.size(); ++i) {
    out[i].resize(models[i].size());
    const float self = static_cast<float>(w[i].self);
    for (std::size_t k = 0; k < models[i].size(); ++k) out[i][k] = self * models[i][k];
    for (std::size_t e = 0; e < g.neighbours[i].size(); ++e) {
      const float wij = static_cast<float>(w[i].neighbour[e]);
      const auto& xj = models[g.neighbours[i][e]];
      for (std::size_t k = 0; k < xj.size(); ++k) out[i][k] += wij * xj[k];
    }
  }
  return out;
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> gossip_edges(const topology& g, std::size_t count,
                                                                  std::uint64_t seed) {
  splitmix64 rng{seed};
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  edges.reserve(count);
  for (std::size_t k = 0; k < count; ++k) {
    const auto i = static_cast<std::uint32_t>(rng.below(g.size()));
    const auto& ni = g.neighbours[i];
    edges.emplace_back(i, ni[rng.below(ni.size())]);
  }
  return edges;
}

}  // namespace troupe::federated
