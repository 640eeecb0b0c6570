#pragma once
/// @file
/// Partitions of a dataset among clients: one shared index array and, per client, a range in
/// it, so that a million clients cost eight bytes of offsets each rather than a vector each.
///
///   iid            a seeded permutation cut into near-equal pieces (as shard_iid)
///   dirichlet:A    label skew, each class split by Dirichlet(A) proportions (shard_dirichlet)
///   shards:K       K classes per client as in McMahan et al. (2017): indices sorted by label,
///                  cut into clients * K equal shards, K random shards per client
///   powerlaw:A     IID content, sizes drawn from a Pareto(A) law (a few large clients, many
///                  small ones), each client holding at least one example

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "troupe/core/tensor.hpp"

namespace troupe::federated {

struct partition {
  std::vector<std::uint32_t> indices;  ///< every example at most once, client by client
  std::vector<std::uint32_t> offsets;  ///< clients + 1 entries; client c holds [offsets[c], offsets[c+1])

  std::size_t clients() const noexcept { return offsets.empty() ? 0 : offsets.size() - 1; }
  std::span<const std::uint32_t> shard(std::size_t client) const {
    return {indices.data() + offsets.at(client), indices.data() + offsets.at(client + 1)};
  }
};

/// Partitions `labels` (1-D u8/i32/i64 host tensor) among `clients` by `spec` (see the file
/// comment). Throws std::invalid_argument for a malformed spec, clients < 1, more clients than
/// examples (dirichlet, shards, powerlaw), or a parameter out of range.
partition make_partition(const std::string& spec, const tensor& labels, std::size_t clients,
                         std::uint64_t seed);

partition partition_iid(std::size_t examples, std::size_t clients, std::uint64_t seed);
partition partition_dirichlet(const tensor& labels, std::size_t clients, double alpha, std::uint64_t seed);
partition partition_shards(const tensor& labels, std::size_t clients, int per_client, std::uint64_t seed);
partition partition_power_law(std::size_t examples, std::size_t clients, double exponent, std::uint64_t seed);
/// The natural partition a data set gives (a writer per client): example i goes to client
/// client_of[i] (u32 [N]), each client's examples in example order. Throws
/// std::invalid_argument when client_of is not a u32 vector or names a client >= clients.
partition partition_assigned(const tensor& client_of, std::size_t clients);

}  // namespace troupe::federated
