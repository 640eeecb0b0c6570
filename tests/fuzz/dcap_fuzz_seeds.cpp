// Writes dcap_fuzz's seeds to the directory given: hand-made quotes of every layout (version 3
// SGX; version 4 TDX; version 5 SGX, TDX 1.0 and TDX 1.5; one zero-padded), prefixed by the byte
// that selects the quote parser, and a PCK certificate's SGX extensions (DER) prefixed by the
// byte that selects their reader.

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../federated/dcap_synthetic.hpp"

namespace synthetic = troupe::federated::dcap::synthetic;

namespace {

void write(const std::string& dir, const std::string& name, unsigned char kind, const std::vector<std::uint8_t>& m) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(kind));
  out.write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(m.size()));
}

std::vector<std::uint8_t> tlv(std::uint8_t tag, const std::vector<std::uint8_t>& v) {
  std::vector<std::uint8_t> b{tag};
  if (v.size() >= 128) {
    b.push_back(0x82);
    b.push_back(static_cast<std::uint8_t>(v.size() >> 8));
  }
  b.push_back(static_cast<std::uint8_t>(v.size()));
  b.insert(b.end(), v.begin(), v.end());
  return b;
}

// SEQUENCE { SEQUENCE { OID 1.2.840.113741.1.13.1.<arcs>, value } ... }.
std::vector<std::uint8_t> item(std::vector<std::uint8_t> arcs, const std::vector<std::uint8_t>& value) {
  std::vector<std::uint8_t> oid{0x2a, 0x86, 0x48, 0x86, 0xf8, 0x4d, 0x01, 0x0d, 0x01};
  oid.insert(oid.end(), arcs.begin(), arcs.end());
  auto body = tlv(0x06, oid);
  body.insert(body.end(), value.begin(), value.end());
  return tlv(0x30, body);
}

std::vector<std::uint8_t> extensions() {
  std::vector<std::uint8_t> tcb, all;
  auto add = [](std::vector<std::uint8_t>& to, const std::vector<std::uint8_t>& it) { to.insert(to.end(), it.begin(), it.end()); };
  for (std::uint8_t i = 1; i <= 16; ++i) add(tcb, item({2, i}, tlv(0x02, {i})));
  add(tcb, item({2, 17}, tlv(0x02, {0x0d})));
  add(tcb, item({2, 18}, tlv(0x04, std::vector<std::uint8_t>(16, 3))));
  add(all, item({1}, tlv(0x04, std::vector<std::uint8_t>(16, 1))));
  add(all, item({2}, tlv(0x30, tcb)));
  add(all, item({3}, tlv(0x04, {0, 0})));
  add(all, item({4}, tlv(0x04, {0x00, 0xa0, 0x67, 0x11, 0x00, 0x00})));
  return tlv(0x30, all);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dcap_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  write(dir, "v3-sgx", 0, synthetic::quote(3, false));
  write(dir, "v4-tdx", 0, synthetic::quote(4, true));
  write(dir, "v5-sgx", 0, synthetic::quote(5, false));
  write(dir, "v5-td10", 0, synthetic::quote(5, true));
  write(dir, "v5-td15", 0, synthetic::quote(5, true, true));
  auto padded = synthetic::quote(4, true, false, 0);
  padded.resize(padded.size() + 64, 0);
  write(dir, "v4-padded-no-auth", 0, padded);
  write(dir, "pck-extensions", 1, extensions());
  return 0;
}
