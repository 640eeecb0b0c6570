// Writes psi_fuzz's seeds to the directory given: an honest peer's first and second messages
// (prefixed by the byte that selects them), and short and empty ones.

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "troupe/federated/psi.hpp"

using namespace troupe::federated;

namespace {
void write(const std::string& dir, const std::string& name, unsigned char kind, const std::vector<std::byte>& m) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(kind));
  out.write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(m.size()));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: psi_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  psi_party fuzzed({3, 5, 8, 13, 21, 34}, 1), peer({5, 8, 100, 200}, 1);
  const auto fuzzed_first = fuzzed.blinded_ids();
  const auto peer_first = peer.blinded_ids();
  write(dir, "first", 0, peer_first);
  write(dir, "second", 1, peer.blind_peer(fuzzed_first));
  write(dir, "empty-first", 0, {});
  write(dir, "one-element", 0, std::vector<std::byte>(peer_first.begin(), peer_first.begin() + 32));
  write(dir, "short-second", 1, std::vector<std::byte>(peer_first.begin(), peer_first.begin() + 40));
  return 0;
}
