// libFuzzer target for the decoder of zero-knowledge norm proofs (`make fuzz`). Hostile bytes
// must never crash or hang; a refusal is a std::invalid_argument; the two backends (the project's
// ristretto255 and libsodium's) accept exactly the same bytes, with the same message when they
// refuse; whatever they accept encodes back to the same bytes, and verifies or fails with a
// reason, never throwing, with the same verdict on both.
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

#include "zk_group_r255.hpp"
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
  std::string refused_fast, refused_sodium;
  norm_proof<r255_group> fast;
  norm_proof<sodium_group> reference;
  try {
    fast = decode<r255_group>(p, bytes);
  } catch (const std::invalid_argument& e) {
    refused_fast = e.what();
    if (refused_fast.rfind("norm proof: ", 0) != 0) broken("a refusal without its prefix: " + refused_fast);
  }
  try {
    reference = decode<sodium_group>(p, bytes);
  } catch (const std::invalid_argument& e) {
    refused_sodium = e.what();
  }
  if (refused_fast != refused_sodium)
    broken("the backends' decoders disagree: r255 '" + refused_fast + "', sodium '" + refused_sodium + "'");
  if (!refused_fast.empty()) return 0;
  const auto again = encode<r255_group>(p, fast);
  if (again.size() != bytes.size() || !std::equal(again.begin(), again.end(), bytes.begin()))
    broken("an accepted proof does not encode back to its bytes");
  if (encode<sodium_group>(p, reference) != again) broken("the backends encode an accepted proof differently");
  const std::vector<std::int64_t> opened(p.dim, 1);
  const auto v = verify_norm(bytes, p, opened, group_backend::fast);
  if (!v.ok && v.reason.empty()) broken("a failed verdict without a reason");
  const auto w = verify_norm(bytes, p, opened, group_backend::sodium);
  if (v.ok != w.ok) broken("the backends' verdicts differ: r255 '" + v.reason + "', sodium '" + w.reason + "'");
  return 0;
}
