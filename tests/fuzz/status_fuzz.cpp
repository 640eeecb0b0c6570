// libFuzzer target for the cluster status report's decoder (`make fuzz`): the bytes a node's
// report (op::node_stats) or a head's answer (op::cluster_status) arrive as, decoded with the
// codecs of actors/src/net/status_codec.hpp. Hostile bytes must never crash or hang, and fail only
// with the codec's decode error; a report that decodes must encode back to bytes that decode to
// the same encoding (the oracle below).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "net/status_codec.hpp"
#include "troupe/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  std::vector<troupe::node_status> nodes;
  try {
    nodes = troupe::decode<std::vector<troupe::node_status>>(bytes);
  } catch (const troupe::error& e) {
    if (e.code_value() != troupe::errc::decode_error) {
      std::fprintf(stderr, "status_fuzz: failed with another error than decode_error: %s\n", e.what());
      std::abort();
    }
    return 0;
  }
  const auto once = troupe::encode(nodes);
  const auto twice = troupe::encode(troupe::decode<std::vector<troupe::node_status>>(once));
  if (once != twice) {
    std::fprintf(stderr, "status_fuzz: a decoded report does not encode the same twice\n");
    std::abort();
  }
  return 0;
}
