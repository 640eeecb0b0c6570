// libFuzzer target for the frame decoder (`make fuzz`). Hostile bytes must never crash, hang or
// allocate past the limits, and whatever the decoder accepts must survive being encoded and
// decoded again unchanged (the round trip is the oracle).
//
// The first input byte chooses how the rest is split into chunks, so that the decoder's state
// machine is exercised at every boundary, not only with whole buffers.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "net/wire.hpp"

using namespace troupe::net;

namespace {

wire_limits fuzz_limits() {
  wire_limits l;
  l.max_frame_bytes = 1u << 20;
  l.max_envelope_bytes = 64u << 10;
  l.max_segments = 16;
  l.traversal_limit_words = 8u << 10;
  l.nesting_limit = 8;
  l.max_error_message = 4096;
  return l;
}

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "frame_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = data[0] == 0 ? size : data[0];
  auto bytes = std::as_bytes(std::span(data + 1, size - 1));

  const auto limits = fuzz_limits();
  frame_decoder d(limits);
  bool ok = true;
  for (std::size_t at = 0; ok && at < bytes.size(); at += chunk) ok = d.feed(bytes.subspan(at, std::min(chunk, bytes.size() - at)));
  if (ok) ok = d.finish();
  if (!ok && (!d.failed() || d.error().message.empty())) broken("a refusal without a reason");
  if (d.feed(bytes.first(std::min<std::size_t>(bytes.size(), 1))) && d.failed()) broken("an error that is not sticky");

  while (auto env = d.pop()) {
    if (validate(*env, limits)) broken("an accepted envelope that breaks the rules");
    auto again = encode_frame_bytes(*env);
    frame_decoder d2(limits);
    if (!d2.feed(again) || !d2.finish()) broken("an accepted envelope does not decode after re-encoding");
    auto back = d2.pop();
    if (!back || !(*back == *env) || d2.pop()) broken("an envelope changed in the round trip");
  }
  return 0;
}
