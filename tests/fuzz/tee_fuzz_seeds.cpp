// Writes tee_fuzz's seeds into the directory given: a dense and a sparse sealed-update payload
// (first byte 0) and a TPMS_ATTEST quote laid out as swtpm makes one (first byte 1).
//
//   tee_fuzz_seeds DIR

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tee_payload.hpp"

using namespace troupe::federated::tee;

namespace {

void write(const std::string& file, std::uint8_t selector, const bytes& b) {
  std::ofstream out(file, std::ios::binary);
  out.put(static_cast<char>(selector));
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tee_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  write(dir + "/dense", 0, encode_payload({.round = 3, .client = 7, .weight = 60, .dim = 4, .sparse = false, .index = {}, .value = {1, -2, 0.5f, 0}}));
  write(dir + "/sparse", 0,
        encode_payload({.round = 3, .client = 7, .weight = 60, .dim = 16, .sparse = true, .index = {2, 9, 0xFFFFFFFFu}, .value = {1, -2, 0}}));
  // magic, TPM_ST_ATTEST_QUOTE, qualifiedSigner (34 bytes), extraData (32), clockInfo, firmware,
  // one SHA-256 selection of PCR 16, its 32-byte digest.
  bytes q = {0xff, 0x54, 0x43, 0x47, 0x80, 0x18, 0x00, 0x22, 0x00, 0x0b};
  q.resize(q.size() + 32, 0x6c);
  q.insert(q.end(), {0x00, 0x20});
  q.resize(q.size() + 32, 0x33);
  q.resize(q.size() + 16, 0x00);
  q.push_back(0x01);  // safe
  q.resize(q.size() + 8, 0x78);
  q.insert(q.end(), {0x00, 0x00, 0x00, 0x01, 0x00, 0x0b, 0x03, 0x00, 0x00, 0x01, 0x00, 0x20});
  q.resize(q.size() + 32, 0x76);
  write(dir + "/tpm_quote", 1, q);
  return 0;
}
