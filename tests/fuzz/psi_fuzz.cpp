// libFuzzer target for the private set intersection's decoding of a peer's messages (`make
// fuzz`). Hostile bytes must never crash or hang; a refusal is a std::invalid_argument and leaves
// the party as it was (a valid message is accepted after it); whatever is accepted must keep the
// protocol's promises (the oracle below).
//
// The first input byte chooses the message: even, the peer's first message (blind_peer); odd,
// the peer's second message (intersect), after a valid first round.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/federated/psi.hpp"

using namespace troupe::federated;

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "psi_fuzz: %s\n", what.c_str());
  std::abort();
}

const std::vector<std::uint64_t> own_ids{3, 5, 8, 13, 21, 34};

// An honest peer's first message, for the round the intersect case needs.
const std::vector<std::byte>& honest_first() {
  static const std::vector<std::byte> m = psi_party({5, 8, 100, 200}, 1).blinded_ids();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > 32 * 64 + 1) return 0;  // up to 64 elements: each costs scalar multiplications
  const std::span<const std::byte> message(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  psi_party party(own_ids, 1);
  (void)party.blinded_ids();
  if (data[0] % 2 == 0) {
    try {
      const auto second = party.blind_peer(message);
      if (second.size() != message.size()) broken("blind_peer answered with another length");
      if (party.peer_size() != message.size() / 32) broken("the peer's size is not its element count");
    } catch (const std::invalid_argument&) {
      if (party.peer_size() != 0) broken("a refused first message changed the party");
      (void)party.blind_peer(honest_first());  // the refusal left it usable
    }
    return 0;
  }
  (void)party.blind_peer(honest_first());
  try {
    const auto common = party.intersect(message);
    if (!std::is_sorted(common.begin(), common.end())) broken("the intersection is not ascending");
    for (auto id : common)
      if (std::find(own_ids.begin(), own_ids.end(), id) == own_ids.end()) broken("an ID the party never held");
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
