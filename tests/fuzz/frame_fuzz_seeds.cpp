// Writes the fuzzer's seed corpus: valid frames of every kind, inline and body payloads, streams
// of several frames. Each file starts with the chunking byte frame_fuzz.cpp reads.
//   frame_fuzz_seeds <dir>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "net/wire.hpp"
#include "troupe/core/shared_span.hpp"

using namespace troupe::net;

namespace {

std::vector<std::byte> payload(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
  return v;
}

// A frame whose small payload travels as the raw body (the decoder accepts any body size; the
// encoder uses the body only from inline_payload_limit on, too large for a seed).
std::vector<std::byte> with_body(envelope env, std::size_t body) {
  env.payload.clear();
  auto f = encode_frame_bytes(env);
  frame_header h = frame_header::read(f.data());
  h.flags = frame_header::flag_body;
  h.body_bytes = body;
  h.write(f.data());
  auto b = payload(body, 3);
  f.insert(f.end(), b.begin(), b.end());
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: frame_fuzz_seeds <dir>\n");
    return 1;
  }
  std::vector<std::vector<std::byte>> frames;
  envelope call{envelope_kind::call, 7, 3, 11, 12, 0, "", payload(40, 1), {}};
  envelope tell{envelope_kind::tell, 9, 1, 0, 0, 0, "", payload(3, 2), {}};
  envelope reply{envelope_kind::reply, 0, 0, 11, 12, 0, "", payload(100, 3), {}};
  envelope err{envelope_kind::error, 0, 0, 11, 12, 5, "connection lost", {}, {}};
  envelope ctl{envelope_kind::control, 0, 1, 0, 0, 0, "", payload(32, 4), {}};
  // A ring all-reduce segment: call, step, segment, length and 64 floats (frame_fuzz decodes
  // every payload as one).
  std::vector<float> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 3.0f;
  envelope segment{envelope_kind::tell, 9, 2, 0, 0, 0, "", troupe::encode(std::make_tuple(
      std::uint64_t{1}, std::uint32_t{0}, std::uint32_t{0}, std::uint64_t{256},
      troupe::shared_span<float>::copy_of(values))), {}};
  for (const auto& e : {call, tell, reply, err, ctl, segment}) frames.push_back(encode_frame_bytes(e));
  frames.push_back(with_body(call, 200));
  frames.push_back(with_body(reply, 1));
  std::vector<std::byte> stream;
  for (const auto& f : frames) stream.insert(stream.end(), f.begin(), f.end());
  frames.push_back(stream);

  int n = 0;
  for (const auto& f : frames) {
    for (unsigned char chunk : {0, 1, 7}) {
      std::string path = std::string(argv[1]) + "/seed-" + std::to_string(n++);
      std::ofstream out(path, std::ios::binary);
      out.put(static_cast<char>(chunk));
      out.write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size()));
      if (!out) {
        std::fprintf(stderr, "frame_fuzz_seeds: cannot write %s\n", path.c_str());
        return 1;
      }
    }
  }
  std::printf("frame_fuzz_seeds: %d seeds in %s\n", n, argv[1]);
  return 0;
}
