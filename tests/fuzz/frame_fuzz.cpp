// libFuzzer target for the frame decoder (`make fuzz`). Hostile bytes must never crash, hang or
// allocate past the limits, and whatever the decoder accepts must survive being encoded and
// decoded again unchanged (the round trip is the oracle). Each accepted payload is also decoded
// as the arguments of a ring all-reduce segment (a shared_span<float> viewing the frame's pooled
// buffer, as node dispatch decodes it): a view must lie inside that buffer, and the values must
// survive the round trip through the splicing encoder.
//
// The first input byte chooses how the rest is split into chunks, so that the decoder's state
// machine is exercised at every boundary, not only with whole buffers.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <tuple>
#include <vector>

#include "net/wire.hpp"
#include "troupe/core/error.hpp"
#include "troupe/core/shared_span.hpp"

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

using segment_args = std::tuple<std::uint64_t, std::uint32_t, std::uint32_t, std::uint64_t, troupe::shared_span<float>>;

bool same_values(const segment_args& a, const segment_args& b) {
  const auto& x = std::get<4>(a);
  const auto& y = std::get<4>(b);
  return std::get<0>(a) == std::get<0>(b) && std::get<1>(a) == std::get<1>(b) && std::get<2>(a) == std::get<2>(b) &&
         std::get<3>(a) == std::get<3>(b) && x.size() == y.size() &&
         (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

void decode_as_segment(std::vector<std::byte> payload) {
  auto owner = share_payload(std::move(payload));
  segment_args args;
  try {
    args = troupe::decode<segment_args>(*owner, owner);
  } catch (const troupe::error& e) {
    if (e.code_value() != troupe::errc::decode_error) broken("a payload refused with another code than decode_error");
    return;
  }
  const auto& v = std::get<4>(args);
  const auto* begin = owner->data();
  const auto* at = reinterpret_cast<const std::byte*>(v.data());
  if (!v.empty() && v.owner() == owner && (at < begin || at + v.size() * sizeof(float) > begin + owner->size()))
    broken("a view outside its frame's buffer");
  auto flat = troupe::encode_pieces(args).flatten();
  auto again = troupe::decode<segment_args>(flat);
  if (!same_values(args, again)) broken("a segment changed in the round trip");
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
    decode_as_segment(std::move(env->payload));
  }
  return 0;
}
