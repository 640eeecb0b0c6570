// Â^depth X in one place, with the fixed-point sums of graph_fixed.hpp (what FedGCN's clients
// and server compute by messages), and the plain double-precision reference.

#include <stdexcept>
#include <string>

#include "graph_fixed.hpp"
#include "troupe/federated/graph.hpp"

namespace troupe::federated {

namespace {

void check_features(const node_graph& g, std::span<const float> x, std::int64_t dims, int depth) {
  if (dims < 1) throw std::invalid_argument("propagate: dims must be at least 1");
  if (depth < 0) throw std::invalid_argument("propagate: depth must be at least 0");
  if (x.size() != g.nodes() * static_cast<std::size_t>(dims))
    throw std::invalid_argument("propagate: " + std::to_string(x.size()) + " features for " + std::to_string(g.nodes()) +
                                " nodes of " + std::to_string(dims));
}

}  // namespace

std::vector<float> propagate(const node_graph& g, std::span<const float> x, std::int64_t dims, int depth,
                             std::span<const std::uint32_t> client_of, int exact_hops) {
  check_features(g, x, dims, depth);
  const bool partitioned = !client_of.empty();
  if (partitioned && client_of.size() != g.nodes()) throw std::invalid_argument("propagate: one client per node");
  const auto n = g.nodes();
  const auto d = static_cast<std::size_t>(dims);
  std::vector<float> h(x.begin(), x.end()), next(h.size());
  std::vector<double> inv(n);
  std::vector<std::int64_t> terms(h.size()), sum(d);
  for (int t = 0; t < depth; ++t) {
    const bool local = partitioned && t >= exact_hops;
    auto inside = [&](std::size_t i, std::uint32_t j) { return !local || client_of[j] == client_of[i]; };
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t degree = 1;
      for (auto j : g.of(i)) degree += inside(i, j) ? 1 : 0;
      inv[i] = detail::inverse_sqrt_degree(degree);
    }
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t f = 0; f < d; ++f) terms[j * d + f] = detail::fixed_term(h[j * d + f], inv[j]);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t f = 0; f < d; ++f) sum[f] = terms[i * d + f];
      for (auto j : g.of(i))
        if (inside(i, j))
          for (std::size_t f = 0; f < d; ++f) sum[f] += terms[j * d + f];
      for (std::size_t f = 0; f < d; ++f) next[i * d + f] = detail::fixed_row_value(sum[f], inv[i]);
    }
    h.swap(next);
  }
  return h;
}

std::vector<double> propagate_reference(const node_graph& g, std::span<const float> x, std::int64_t dims, int depth) {
  check_features(g, x, dims, depth);
  const auto n = g.nodes();
  const auto d = static_cast<std::size_t>(dims);
  std::vector<double> h(x.begin(), x.end()), next(h.size());
  for (int t = 0; t < depth; ++t) {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t f = 0; f < d; ++f) {
        // (Â h)_i = sum over j in N(i) + {i} of h_j / sqrt(d_i d_j)
        double s = h[i * d + f] / static_cast<double>(g.degree(i));
        for (auto j : g.of(i)) s += h[j * d + f] / std::sqrt(static_cast<double>(g.degree(i)) * static_cast<double>(g.degree(j)));
        next[i * d + f] = s;
      }
    h.swap(next);
  }
  return h;
}

}  // namespace troupe::federated
