// Writes npz_fuzz's seed corpus: valid .npz archives (stored and deflated entries, u8 images
// and f32 features, labels of several integer dtypes, with and without client_train) and valid
// .npy arrays of each role. Each file starts with the byte npz_fuzz.cpp reads to choose.
//   npz_fuzz_seeds <dir>

#include <zip.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

using bytes = std::vector<std::uint8_t>;

bytes npy(const std::string& descr, const std::string& shape, const bytes& data, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<std::uint8_t>(major), 0};
  for (std::size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<std::uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

bytes pattern(std::size_t n, unsigned seed) {
  bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>((i * 131 + seed * 17) & 0xff);
  return out;
}

struct entry {
  std::string name;
  bytes data;
};

// The archive's bytes, written by libzip to `scratch` and read back.
bytes zip_of(const std::vector<entry>& entries, int method, const std::string& scratch) {
  int error = 0;
  zip_t* z = zip_open(scratch.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  if (!z) return {};
  for (const entry& e : entries) {
    zip_source_t* src = zip_source_buffer(z, e.data.data(), e.data.size(), 0);
    const zip_int64_t i = src ? zip_file_add(z, e.name.c_str(), src, 0) : -1;
    if (i < 0 || zip_set_file_compression(z, static_cast<zip_uint64_t>(i), method, 0) != 0) {
      zip_discard(z);
      return {};
    }
  }
  if (zip_close(z) != 0) return {};
  std::ifstream in(scratch, std::ios::binary);
  bytes out{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::remove(scratch.c_str());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: npz_fuzz_seeds <dir>\n");
    return 1;
  }
  const std::string dir = argv[1];
  // (first byte, rest) pairs.
  std::vector<std::pair<std::uint8_t, bytes>> seeds;

  bytes f32_clean;  // finite floats: small integers as f32 little-endian
  for (int i = 0; i < 6; ++i) {
    const float v = static_cast<float>(i) - 2.5f;
    const auto* b = reinterpret_cast<const std::uint8_t*>(&v);
    f32_clean.insert(f32_clean.end(), b, b + 4);
  }
  const std::vector<std::vector<entry>> sets = {
      {{"x_train.npy", npy("|u1", "(4, 3, 2)", pattern(24, 1))},
       {"y_train.npy", npy("<i8", "(4,)", {0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})},
       {"x_test.npy", npy("|u1", "(2, 3, 2)", pattern(12, 2))},
       {"y_test.npy", npy("|u1", "(2,)", {1, 0})}},
      {{"x_train.npy", npy("<f4", "(3, 2)", f32_clean)},
       {"y_train.npy", npy(">i2", "(3,)", {0, 1, 0, 0, 0, 2})},
       {"x_test.npy", npy("<f4", "(1, 2)", bytes(f32_clean.begin(), f32_clean.begin() + 8), 2)},
       {"y_test.npy", npy("<u4", "(1,)", {1, 0, 0, 0}, 3)},
       {"client_train.npy", npy("<u2", "(3,)", {0, 0, 4, 0, 1, 0})}},
      {{"x_train.npy", npy("|u1", "(2, 2)", {0, 255, 17, 3})},
       {"y_train.npy", npy("|i1", "(2,)", {1, 0})},
       {"x_test.npy", npy("|u1", "(0, 2)", {})},
       {"y_test.npy", npy("|u1", "(0,)", {})},
       {"client_train.npy", npy(">i8", "(2,)", {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0})}},
  };
  const std::string scratch = dir + "/scratch.zip";
  for (const auto& set : sets)
    for (const int method : {ZIP_CM_STORE, ZIP_CM_DEFLATE}) {
      bytes archive = zip_of(set, method, scratch);
      if (archive.empty()) {
        std::fprintf(stderr, "npz_fuzz_seeds: libzip could not write %s\n", scratch.c_str());
        return 1;
      }
      seeds.emplace_back(0, std::move(archive));
    }
  // Single arrays: the first byte's role is (byte / 2) % 3: 1 features, 3 labels, 5 clients.
  seeds.emplace_back(1, npy("|u1", "(4, 3, 2)", pattern(24, 1)));
  seeds.emplace_back(1, npy(">f4", "(2, 3)", bytes(f32_clean.rbegin(), f32_clean.rend())));
  seeds.emplace_back(3, npy("<i4", "(3,)", {2, 0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0}));
  seeds.emplace_back(5, npy("<u8", "(2,)", {7, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0}, 2));

  int n = 0;
  for (const auto& [mode, data] : seeds) {
    const std::string path = dir + "/seed-" + std::to_string(n++);
    std::ofstream out(path, std::ios::binary);
    out.put(static_cast<char>(mode));
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    if (!out) {
      std::fprintf(stderr, "npz_fuzz_seeds: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("npz_fuzz_seeds: %d seeds in %s\n", n, dir.c_str());
  return 0;
}
