// Writes zk_fuzz's seeds to the directory given: valid proofs for each statement the first byte
// selects (prefixed by that byte), a truncated one and a header alone.

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "troupe/federated/zkproof.hpp"

using namespace troupe::federated::zk;

namespace {
void write(const std::string& dir, const std::string& name, unsigned char kind, const std::vector<std::uint8_t>& m) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(kind));
  out.write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(m.size()));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: zk_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  for (unsigned char kind = 0; kind < 4; ++kind) {
    const norm_params p{.dim = 1u + (kind & 1u), .bits = (kind & 2u) ? 16 : 8, .bound = 1.0};
    const std::vector<std::int64_t> x(p.dim, 1);
    const auto proof = prove_norm(x, p);
    write(dir, "proof-" + std::to_string(kind), kind, proof);
    if (kind == 0) {
      write(dir, "truncated", kind, std::vector<std::uint8_t>(proof.begin(), proof.end() - 40));
      write(dir, "header", kind, std::vector<std::uint8_t>(proof.begin(), proof.begin() + 12));
    }
  }
  return 0;
}
