// libFuzzer target for the decoder of zero-knowledge norm proofs (`make fuzz`). Hostile bytes
// must never crash or hang; a refusal is a std::invalid_argument; whatever the decoder accepts
// encodes back to the same bytes, and verifies or fails with a reason, never throwing.
//
// The first input byte chooses the statement (d = 1 or 2, k = 8 or 16); the rest is the proof.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "zk_group_sodium.hpp"
#include "zk_norm.hpp"

using namespace troupe::federated::zk;

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "zk_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > 4096) return 0;
  const norm_params p{.dim = 1 + (data[0] & 1u), .bits = (data[0] & 2u) ? 16 : 8, .bound = 1.0};
  const std::span<const std::uint8_t> bytes(data + 1, size - 1);
  norm_proof<sodium_group> proof;
  try {
    proof = decode<sodium_group>(p, bytes);
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind("norm proof: ", 0) != 0) broken(std::string("a refusal without its prefix: ") + e.what());
    return 0;
  }
  const auto again = encode<sodium_group>(p, proof);
  if (again.size() != bytes.size() || !std::equal(again.begin(), again.end(), bytes.begin()))
    broken("an accepted proof does not encode back to its bytes");
  const std::vector<std::int64_t> opened(p.dim, 1);
  const auto v = verify_norm(bytes, p, opened);
  if (!v.ok && v.reason.empty()) broken("a failed verdict without a reason");
  return 0;
}
