#include "troupe/federated/partition.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <stdexcept>

#include "spec.hpp"
#include "troupe/federated/rng.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {

namespace {

std::vector<std::int64_t> labels_of(const tensor& labels) {
  if (labels.rank() != 1 || !labels.where().is_cpu())
    throw std::invalid_argument("partition: labels must be a 1-D host tensor, not " + labels.str());
  std::vector<std::int64_t> out(static_cast<std::size_t>(labels.dim(0)));
  switch (labels.type()) {
    case dtype::u8: std::copy_n(labels.data<std::uint8_t>().data(), out.size(), out.begin()); break;
    case dtype::i32: std::copy_n(labels.data<std::int32_t>().data(), out.size(), out.begin()); break;
    case dtype::i64: std::copy_n(labels.data<std::int64_t>().data(), out.size(), out.begin()); break;
    default: throw std::invalid_argument("partition: labels must be u8, i32 or i64, not " + labels.str());
  }
  for (auto l : out)
    if (l < 0) throw std::invalid_argument("partition: a label is negative");
  return out;
}

void check_clients(std::size_t clients, std::size_t examples, const char* what, bool one_each) {
  if (clients < 1) throw std::invalid_argument("a partition needs at least one client");
  if (clients > 0xFFFFFFFFull || examples > 0xFFFFFFFFull)
    throw std::invalid_argument("partitions hold at most 2^32 - 1 clients and examples");
  if (one_each && clients > examples)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(clients) + " clients but only " +
                                std::to_string(examples) + " examples (every client needs one)");
}

/// Cuts `order` into consecutive pieces of the given sizes.
partition cut(std::vector<std::uint32_t> order, const std::vector<std::size_t>& sizes) {
  partition p;
  p.indices = std::move(order);
  p.offsets.reserve(sizes.size() + 1);
  std::size_t at = 0;
  p.offsets.push_back(0);
  for (auto s : sizes) p.offsets.push_back(static_cast<std::uint32_t>(at += s));
  return p;
}

std::vector<std::uint32_t> shuffled(std::size_t n, std::uint64_t seed) {
  const auto order = shuffled_indices(static_cast<std::int64_t>(n), seed);
  return {order.begin(), order.end()};
}

double parameter(const std::string& spec, const std::string& text) {
  return detail::spec_number(text, "partition '" + spec + "'");
}

}  // namespace

partition partition_iid(std::size_t examples, std::size_t clients, std::uint64_t seed) {
  check_clients(clients, examples, "iid", false);
  std::vector<std::size_t> sizes(clients, examples / clients);
  for (std::size_t c = 0; c < examples % clients; ++c) ++sizes[c];
  return cut(shuffled(examples, seed), sizes);
}

partition partition_dirichlet(const tensor& labels, std::size_t clients, double alpha, std::uint64_t seed) {
  check_clients(clients, static_cast<std::size_t>(labels.defined() ? labels.dim(0) : 0), "dirichlet", true);
  if (clients > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw std::invalid_argument("dirichlet: too many clients");
  const auto shards = shard_dirichlet(labels, static_cast<int>(clients), alpha, seed);
  partition p;
  p.offsets.push_back(0);
  for (const auto& s : shards) {
    for (auto i : s) p.indices.push_back(static_cast<std::uint32_t>(i));
    p.offsets.push_back(static_cast<std::uint32_t>(p.indices.size()));
  }
  return p;
}

partition partition_shards(const tensor& labels, std::size_t clients, int per_client, std::uint64_t seed) {
  const auto y = labels_of(labels);
  if (per_client < 1) throw std::invalid_argument("shards:K needs K >= 1");
  check_clients(clients, y.size(), "shards", true);
  const std::size_t count = clients * static_cast<std::size_t>(per_client);
  if (count > y.size())
    throw std::invalid_argument("shards:" + std::to_string(per_client) + " with " + std::to_string(clients) +
                                " clients needs " + std::to_string(count) + " shards of at least one example; there are " +
                                std::to_string(y.size()) + " examples");
  std::vector<std::uint32_t> by_label(y.size());
  std::iota(by_label.begin(), by_label.end(), 0u);
  std::stable_sort(by_label.begin(), by_label.end(), [&](std::uint32_t a, std::uint32_t b) { return y[a] < y[b]; });
  // Shard s covers [start(s), start(s + 1)) of the sorted order; the first n % count are one longer.
  const std::size_t base = y.size() / count, extra = y.size() % count;
  auto start = [&](std::size_t s) { return s * base + std::min(s, extra); };
  std::vector<std::uint32_t> shard_order(count);
  std::iota(shard_order.begin(), shard_order.end(), 0u);
  splitmix64 g{seed};
  for (std::size_t i = count; i-- > 1;) std::swap(shard_order[i], shard_order[g.below(i + 1)]);
  partition p;
  p.indices.reserve(y.size());
  p.offsets.push_back(0);
  for (std::size_t c = 0; c < clients; ++c) {
    for (int k = 0; k < per_client; ++k) {
      const std::size_t s = shard_order[c * static_cast<std::size_t>(per_client) + static_cast<std::size_t>(k)];
      p.indices.insert(p.indices.end(), by_label.begin() + static_cast<std::ptrdiff_t>(start(s)),
                       by_label.begin() + static_cast<std::ptrdiff_t>(start(s + 1)));
    }
    p.offsets.push_back(static_cast<std::uint32_t>(p.indices.size()));
  }
  return p;
}

partition partition_power_law(std::size_t examples, std::size_t clients, double exponent, std::uint64_t seed) {
  check_clients(clients, examples, "powerlaw", true);
  if (!(exponent > 0)) throw std::invalid_argument("powerlaw:A needs A > 0");
  // Pareto(A) weights by inversion, then one example each and the rest in proportion. In logs,
  // scaled by the largest: a small A makes (1 - u)^(-1/A) overflow (every weight infinite, and
  // the shares NaN), while the largest client simply takes nearly everything.
  splitmix64 g{seed ^ 0x5851F42D4C957F2Dull};
  std::vector<double> w(clients);
  double top = 0;
  for (auto& v : w) top = std::max(top, v = -std::log(1.0 - g.uniform01()) / exponent);
  double total = 0;
  for (auto& v : w) total += (v = std::exp(v - top));
  const std::size_t spare = examples - clients;
  std::vector<std::size_t> sizes(clients);
  std::size_t used = 0;
  for (std::size_t c = 0; c < clients; ++c) used += (sizes[c] = 1 + static_cast<std::size_t>(std::floor(spare * (w[c] / total))));
  // What flooring left over goes to the clients in order, one each.
  for (std::size_t c = 0; used < examples; c = (c + 1) % clients, ++used) ++sizes[c];
  return cut(shuffled(examples, seed), sizes);
}

partition partition_assigned(const tensor& client_of, std::size_t clients) {
  if (!client_of.defined() || client_of.type() != dtype::u32 || client_of.rank() != 1 || !client_of.where().is_cpu())
    throw std::invalid_argument("partition_assigned: the assignment must be a u32 vector on the host");
  const auto of = client_of.data<std::uint32_t>();
  partition p;
  p.offsets.assign(clients + 1, 0);
  for (std::size_t i = 0; i < of.size(); ++i) {
    if (of[i] >= clients)
      throw std::invalid_argument("example " + std::to_string(i) + " belongs to client " + std::to_string(of[i]) + "; there are " +
                                  std::to_string(clients) + " clients");
    ++p.offsets[of[i] + 1];
  }
  for (std::size_t c = 0; c < clients; ++c) p.offsets[c + 1] += p.offsets[c];
  p.indices.resize(of.size());
  std::vector<std::uint32_t> next(p.offsets.begin(), p.offsets.end() - 1);
  for (std::size_t i = 0; i < of.size(); ++i) p.indices[next[of[i]]++] = static_cast<std::uint32_t>(i);
  return p;
}

partition make_partition(const std::string& spec, const tensor& labels, std::size_t clients, std::uint64_t seed) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const std::size_t n = labels.defined() ? static_cast<std::size_t>(labels.dim(0)) : 0;
  if (name == "iid" && colon == std::string::npos) return partition_iid(n, clients, seed);
  if (name == "dirichlet") {
    if (arg.empty()) throw std::invalid_argument("partition 'dirichlet' needs its alpha: dirichlet:0.5");
    const double alpha = parameter(spec, arg);
    if (!(alpha > 0)) throw std::invalid_argument("partition '" + spec + "': alpha must be positive");
    return partition_dirichlet(labels, clients, alpha, seed);
  }
  if (name == "shards") {
    const double k = parameter(spec, arg);
    if (k != std::floor(k) || k < 1 || k > 1e6)
      throw std::invalid_argument("partition '" + spec + "': K must be a positive whole number");
    return partition_shards(labels, clients, static_cast<int>(k), seed);
  }
  if (name == "powerlaw") {
    if (arg.empty()) throw std::invalid_argument("partition 'powerlaw' needs its exponent: powerlaw:1.5");
    return partition_power_law(n, clients, parameter(spec, arg), seed);
  }
  throw std::invalid_argument("unknown partition '" + spec + "' (use iid, dirichlet:A, shards:K or powerlaw:A)");
}

}  // namespace troupe::federated
