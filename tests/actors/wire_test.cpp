#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <troupe/core/codec.hpp>

#include "net/wire.hpp"

namespace {

using namespace troupe::net;

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

envelope a_call(std::size_t payload_bytes, unsigned seed = 1) {
  envelope e;
  e.kind = envelope_kind::call;
  e.target = 0x1122334455667788ull;
  e.method = 42;
  e.request_id = 7 + seed;
  e.reply_to = 99;
  e.payload = random_bytes(payload_bytes, seed);
  return e;
}

std::vector<envelope> decode_all(std::span<const std::byte> bytes, std::size_t chunk, wire_limits limits = {}) {
  frame_decoder d(limits);
  for (std::size_t i = 0; i < bytes.size(); i += chunk) {
    auto n = std::min(chunk, bytes.size() - i);
    EXPECT_TRUE(d.feed(bytes.subspan(i, n))) << to_string(d.error().code) << ": " << d.error().message;
  }
  EXPECT_TRUE(d.finish());
  std::vector<envelope> out;
  while (auto e = d.pop()) out.push_back(std::move(*e));
  return out;
}

wire_error decode_error(std::span<const std::byte> bytes, wire_limits limits = {}) {
  frame_decoder d(limits);
  if (d.feed(bytes)) d.finish();
  EXPECT_EQ(d.ready(), 0u);
  return d.error();
}

template <class T>
void put(std::vector<std::byte>& v, std::size_t at, T x) {
  std::memcpy(v.data() + at, &x, sizeof(T));
}

TEST(Wire, EveryKindRoundTripsWithItsFields) {
  std::vector<envelope> sent;
  sent.push_back(a_call(100));
  envelope tell;
  tell.kind = envelope_kind::tell;
  tell.target = 5;
  tell.method = 3;
  sent.push_back(tell);
  envelope reply;
  reply.kind = envelope_kind::reply;
  reply.request_id = 8;
  reply.reply_to = 99;
  reply.payload = random_bytes(17, 3);
  sent.push_back(reply);
  envelope err;
  err.kind = envelope_kind::error;
  err.request_id = 8;
  err.error_code = 1;
  err.error_message = "the target actor stopped";
  sent.push_back(err);
  envelope ctl;
  ctl.kind = envelope_kind::control;
  ctl.method = 9;
  sent.push_back(ctl);

  std::vector<std::byte> stream;
  for (const auto& e : sent) {
    auto f = encode_frame_bytes(e);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  EXPECT_EQ(decode_all(stream, stream.size()), sent);
}

TEST(Wire, ArgumentCodecBytesSurviveTheTrip) {
  auto args = std::make_tuple(std::string("weights"), std::vector<float>{1.5f, -2.25f, 3.0f}, 12345ll);
  auto e = a_call(0);
  e.payload = troupe::encode(args);
  auto got = decode_all(encode_frame_bytes(e), 1 << 20);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ((troupe::decode<std::tuple<std::string, std::vector<float>, long long>>(got[0].payload)), args);
}

TEST(Wire, LargePayloadsTravelAsTheRawBodyWithoutACopy) {
  auto e = a_call(inline_payload_limit + 1000, 5);
  const auto* payload_data = e.payload.data();
  auto expect = e;
  auto f = encode_frame(std::move(e));
  EXPECT_EQ(f.body.bytes.data(), payload_data);  // moved, not copied
  EXPECT_LT(f.head.size(), 256u);
  auto h = frame_header::read(f.head.data());
  EXPECT_EQ(h.flags, frame_header::flag_body);
  EXPECT_EQ(h.body_bytes, expect.payload.size());
  EXPECT_EQ(h.envelope_bytes + frame_header::size, f.head.size());

  auto small = encode_frame(a_call(inline_payload_limit - 1));
  EXPECT_EQ(small.body.size(), 0u);
  EXPECT_EQ(frame_header::read(small.head.data()).flags, 0);

  std::vector<std::byte> stream = f.head;
  stream.insert(stream.end(), f.body.bytes.begin(), f.body.bytes.end());
  auto got = decode_all(stream, 4096);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], expect);
}

TEST(Wire, SplicedRunsAreWrittenFromTheirOwnMemoryAndArriveAsOnePayload) {
  // A payload of own bytes with two runs of other memory spliced in (at the start of the own
  // bytes' middle and at their end), as a shared_span argument makes.
  auto run1 = std::make_shared<std::vector<std::byte>>(random_bytes(30'000, 21));
  auto run2 = std::make_shared<std::vector<std::byte>>(random_bytes(5'000, 22));
  auto e = a_call(40, 20);
  e.splices.push_back({10, run1, std::span<const std::byte>(*run1)});
  e.splices.push_back({40, run2, std::span<const std::byte>(*run2).subspan(1000)});
  std::vector<std::byte> flat(e.payload.begin(), e.payload.begin() + 10);
  flat.insert(flat.end(), run1->begin(), run1->end());
  flat.insert(flat.end(), e.payload.begin() + 10, e.payload.end());
  flat.insert(flat.end(), run2->begin() + 1000, run2->end());
  EXPECT_EQ(e.payload_size(), flat.size());
  auto expect = e;
  expect.payload = flat;
  expect.splices.clear();
  EXPECT_EQ(e, expect);  // equality compares the payloads' bytes

  auto f = encode_frame(e);
  EXPECT_EQ(frame_header::read(f.head.data()).body_bytes, flat.size());
  std::vector<const std::byte*> pieces;
  std::vector<std::byte> stream;
  f.for_each_piece([&](std::span<const std::byte> p) {
    pieces.push_back(p.data());
    stream.insert(stream.end(), p.begin(), p.end());
  });
  ASSERT_EQ(pieces.size(), 5u);  // head, own bytes, run 1, own bytes, run 2
  EXPECT_EQ(pieces[2], run1->data());
  EXPECT_EQ(pieces[4], run2->data() + 1000);
  auto got = decode_all(stream, 777);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, flat);
  EXPECT_TRUE(got[0].splices.empty());

  // A payload below inline_payload_limit with a splice travels inline, the run copied in.
  auto small_run = std::make_shared<std::vector<std::byte>>(random_bytes(100, 23));
  auto s = a_call(8, 24);
  s.splices.push_back({8, small_run, std::span<const std::byte>(*small_run)});
  auto small = encode_frame(s);
  EXPECT_EQ(small.body.size(), 0u);
  auto got_small = decode_all(encode_frame_bytes(s), 64);
  ASSERT_EQ(got_small.size(), 1u);
  EXPECT_EQ(got_small[0], s);
}

TEST(Wire, BodyBuffersComeBackForTheNextFrameWithoutAZeroFill) {
  // Filled with a pattern, given back, taken again for a frame of the same size: the same
  // memory, the pattern still there (no zero fill).
  body_pool pool(1u << 20);
  auto first = pool.take(300'000);
  ASSERT_EQ(first.size(), 300'000u);
  std::memset(first.data(), 0x6b, first.size());
  const auto* at = first.data();
  pool.give_back(std::move(first));
  EXPECT_EQ(pool.kept(), 1u);
  auto again = pool.take(300'000);
  EXPECT_EQ(again.data(), at);
  EXPECT_EQ(again[123], std::byte{0x6b});
  EXPECT_EQ(pool.kept(), 0u);
  // The smallest buffer that fits; none that fits: a new one.
  auto big = pool.take(600'000);
  const auto* big_at = big.data();
  pool.give_back(std::move(big));
  pool.give_back(std::move(again));
  EXPECT_EQ(pool.take(250'000).data(), at);
  EXPECT_EQ(pool.take(350'000).data(), big_at);
  EXPECT_EQ(pool.take(700'000).size(), 700'000u);
  // Bounded: beyond its bytes, and buffers too small to be bodies, are freed.
  pool.give_back(std::vector<std::byte>(700'000));
  pool.give_back(std::vector<std::byte>(700'000));
  EXPECT_EQ(pool.kept(), 1u);
  pool.give_back(std::vector<std::byte>(100));
  EXPECT_EQ(pool.kept(), 1u);
  // A shared payload comes back when its last owner is gone.
  body_pool mine(1u << 20);
  auto shared = share_payload(std::vector<std::byte>(inline_payload_limit), mine);
  auto copy = shared;
  shared.reset();
  EXPECT_EQ(mine.kept(), 0u);
  copy.reset();
  EXPECT_EQ(mine.kept(), 1u);
}

TEST(Wire, BodyBuffersAreTakenAgainOnlyByBodiesOfAtLeastHalfTheirSize) {
  body_pool pool(std::size_t{64} << 20);
  // A kept 16 MiB buffer is not what a 16 KiB body gets: a view of that body would keep 1024
  // times its bytes alive.
  std::vector<std::byte> huge(body_pool::largest_kept);
  const auto* huge_at = huge.data();
  pool.give_back(std::move(huge));
  ASSERT_EQ(pool.kept(), 1u);
  auto small = pool.take(inline_payload_limit);
  EXPECT_NE(small.data(), huge_at);
  EXPECT_LE(small.capacity(), 2 * inline_payload_limit);
  EXPECT_EQ(pool.kept(), 1u);
  // Half its size and up takes it (twice the body, exactly, included).
  EXPECT_EQ(pool.take(body_pool::largest_kept / 2).data(), huge_at);
  EXPECT_EQ(pool.kept(), 0u);
  // Among several, the smallest that holds the body; none within twice its size: a new buffer.
  std::vector<const std::byte*> at;
  for (std::size_t kib : {100u, 200u, 150u}) {
    std::vector<std::byte> b(kib << 10);
    at.push_back(b.data());
    pool.give_back(std::move(b));
  }
  EXPECT_EQ(pool.take(120u << 10).data(), at[2]);  // 150 KiB
  EXPECT_EQ(pool.take(120u << 10).data(), at[1]);  // 200 KiB, within 240
  auto fresh = pool.take(120u << 10);               // 100 KiB is too small
  EXPECT_NE(fresh.data(), at[0]);
  EXPECT_EQ(fresh.capacity(), std::size_t{120} << 10);
  EXPECT_EQ(pool.take(60u << 10).data(), at[0]);  // 100 KiB is within 120
  EXPECT_EQ(pool.kept(), 0u);
  // Of equal buffers, the one given back last comes first.
  std::vector<std::byte> b1(64u << 10), b2(64u << 10);
  const auto* b2_at = b2.data();
  pool.give_back(std::move(b1));
  pool.give_back(std::move(b2));
  EXPECT_EQ(pool.take(64u << 10).data(), b2_at);
}

// Holds a payload of the shared pool until static destruction, after the pool's own static
// storage would have been destroyed had it been an ordinary static: this object is made before
// main, so it is destroyed after any static made later. Sanitizer builds catch a pool that is
// gone by then (heap-use-after-free).
struct payload_held_to_exit {
  std::shared_ptr<const std::vector<std::byte>> payload;
  ~payload_held_to_exit() { payload.reset(); }  // gives its buffer back to body_pool::shared()
} held_to_exit;

TEST(Wire, PayloadsReleasedAtExitGiveTheirBuffersBackToALivePool) {
  held_to_exit.payload = share_payload(body_pool::shared().take(inline_payload_limit));
  EXPECT_EQ(held_to_exit.payload->size(), inline_payload_limit);
}

TEST(Wire, DecodesFramesFedOneByteAtATime) {
  std::vector<envelope> sent{a_call(0, 1), a_call(3, 2), a_call(inline_payload_limit + 3, 3), a_call(1, 4)};
  std::vector<std::byte> stream;
  for (const auto& e : sent) {
    auto f = encode_frame_bytes(e);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  EXPECT_EQ(decode_all(stream, 1), sent);
}

TEST(Wire, DecodesFramesSplitAtRandomPoints) {
  std::mt19937 rng(11);
  std::vector<envelope> sent;
  std::vector<std::byte> stream;
  for (unsigned i = 0; i < 40; ++i) {
    sent.push_back(a_call(rng() % 3 == 0 ? inline_payload_limit + rng() % 5000 : rng() % 300, i));
    auto f = encode_frame_bytes(sent.back());
    stream.insert(stream.end(), f.begin(), f.end());
  }
  frame_decoder d;
  std::size_t at = 0;
  while (at < stream.size()) {
    auto n = std::min<std::size_t>(1 + rng() % 3000, stream.size() - at);
    ASSERT_TRUE(d.feed(std::span<const std::byte>(stream).subspan(at, n)));
    at += n;
  }
  std::vector<envelope> got;
  while (auto e = d.pop()) got.push_back(std::move(*e));
  EXPECT_EQ(got, sent);
  EXPECT_TRUE(d.idle());
}

TEST(Wire, ABodyCanBeReadStraightIntoItsFinalBuffer) {
  auto e = a_call(200'000, 9);
  auto f = encode_frame(e);
  frame_decoder d;
  ASSERT_TRUE(d.feed(f.head));
  auto space = d.body_space();
  ASSERT_EQ(space.size(), f.body.size());
  std::memcpy(space.data(), f.body.bytes.data(), 1000);
  ASSERT_TRUE(d.commit_body(1000));
  EXPECT_EQ(d.body_space().size(), f.body.size() - 1000);
  EXPECT_EQ(d.ready(), 0u);
  auto rest = d.body_space();
  std::memcpy(rest.data(), f.body.bytes.data() + 1000, rest.size());
  ASSERT_TRUE(d.commit_body(rest.size()));
  auto got = d.pop();
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, e);
  EXPECT_EQ(got->payload.data(), space.data());  // the very buffer the reader wrote into
  EXPECT_FALSE(d.commit_body(1));                 // nothing is awaited now
}

TEST(Wire, RefusesAForeignStreamAtItsFirstFourBytes) {
  frame_decoder d;
  const char http[] = "GET / HTTP/1.1\r\n";
  EXPECT_FALSE(d.feed(std::as_bytes(std::span(http, 4))));
  EXPECT_EQ(d.error().code, wire_errc::bad_magic);
  EXPECT_FALSE(d.feed(std::as_bytes(std::span(http, 4))));  // sticky
}

TEST(Wire, RefusesBadHeaders) {
  auto good = encode_frame_bytes(a_call(10));
  auto with = [&](std::size_t at, auto value) {
    auto f = good;
    put(f, at, value);
    return decode_error(f);
  };
  EXPECT_EQ(with(4, std::uint16_t{1}).code, wire_errc::bad_version);  // before the status report changed
  EXPECT_EQ(with(4, std::uint16_t{3}).code, wire_errc::bad_version);
  EXPECT_EQ(with(6, std::uint16_t{4}).code, wire_errc::bad_header);          // unknown flag
  EXPECT_EQ(with(12, std::uint32_t{1}).code, wire_errc::bad_header);         // reserved
  EXPECT_EQ(with(8, std::uint32_t{12}).code, wire_errc::bad_header);         // not a multiple of 8
  EXPECT_EQ(with(8, std::uint32_t{0}).code, wire_errc::bad_header);          // no envelope
  EXPECT_EQ(with(6, frame_header::flag_body).code, wire_errc::bad_header);   // flag, no body
  EXPECT_EQ(with(16, std::uint64_t{8}).code, wire_errc::bad_header);         // body, no flag
  auto e = with(4, std::uint16_t{7});
  EXPECT_NE(e.message.find("version 7"), std::string::npos) << e.message;
}

TEST(Wire, RefusesOversizedFramesBeforeAllocatingThem) {
  auto f = encode_frame_bytes(a_call(10));
  put(f, 6, frame_header::flag_body);
  put(f, 16, std::uint64_t{1} << 62);
  EXPECT_EQ(decode_error(std::span(f).first(frame_header::size)).code, wire_errc::frame_too_large);

  auto g = encode_frame_bytes(a_call(10));
  put(g, 8, std::uint32_t{0xfffffff8u});
  EXPECT_EQ(decode_error(std::span(g).first(frame_header::size)).code, wire_errc::frame_too_large);

  wire_limits small;
  small.max_frame_bytes = 64 << 10;
  auto big = encode_frame_bytes(a_call(100'000));
  auto e = decode_error(big, small);
  EXPECT_EQ(e.code, wire_errc::frame_too_large);
  EXPECT_NE(e.message.find("65536"), std::string::npos) << e.message;
  EXPECT_EQ(decode_all(encode_frame_bytes(a_call(60'000)), 999, small).size(), 1u);
}

TEST(Wire, RefusesAStreamThatEndsInsideAFrame) {
  auto f = encode_frame_bytes(a_call(inline_payload_limit + 10));
  for (std::size_t cut : {std::size_t{3}, std::size_t{30}, f.size() - 1}) {
    auto e = decode_error(std::span(f).first(cut));
    EXPECT_EQ(e.code, wire_errc::truncated) << cut;
  }
}

TEST(Wire, RefusesMalformedSegmentTables) {
  auto good = encode_frame_bytes(a_call(10));
  auto with = [&](std::size_t at, std::uint32_t value) {
    auto f = good;
    put(f, at, value);
    return decode_error(f);
  };
  const std::size_t table = frame_header::size;
  EXPECT_EQ(with(table, 1000).code, wire_errc::malformed_segments);      // too many segments
  EXPECT_EQ(with(table, 40).code, wire_errc::truncated);                 // table larger than the envelope
  EXPECT_EQ(with(table + 4, 1000).code, wire_errc::truncated);           // segment past the end
  EXPECT_EQ(with(table + 4, 1).code, wire_errc::malformed_segments);     // words after the segment
  EXPECT_EQ(with(table + 4, 0).code, wire_errc::malformed_segments);     // empty root segment
}

TEST(Wire, RefusesEnvelopesCapnProtoCannotRead) {
  auto f = encode_frame_bytes(a_call(10));
  // The root pointer (first word of the segment): a struct pointer far past the segment.
  const std::size_t root = frame_header::size + 8;
  put(f, root, std::uint32_t{1000u << 2});
  auto e = decode_error(f);
  EXPECT_EQ(e.code, wire_errc::malformed_segments);
  EXPECT_NE(e.message.find("Cap'n Proto"), std::string::npos) << e.message;
}

TEST(Wire, AppliesCapnProtoTraversalLimits) {
  wire_limits tight;
  tight.traversal_limit_words = 16;
  auto e = decode_error(encode_frame_bytes(a_call(1000)), tight);
  EXPECT_EQ(e.code, wire_errc::malformed_segments);
  EXPECT_EQ(decode_all(encode_frame_bytes(a_call(8)), 64, tight).size(), 1u);
}

TEST(Wire, RefusesEnvelopesThatBreakTheRules) {
  auto c = a_call(4);
  c.target = 0;
  EXPECT_EQ(decode_error(encode_frame_bytes(c)).code, wire_errc::bad_envelope);
  c = a_call(4);
  c.request_id = 0;
  EXPECT_EQ(decode_error(encode_frame_bytes(c)).code, wire_errc::bad_envelope);
  envelope err;
  err.kind = envelope_kind::error;
  err.request_id = 3;  // but no error code
  EXPECT_EQ(decode_error(encode_frame_bytes(err)).code, wire_errc::bad_envelope);
  c = a_call(4);
  c.error_message = "not an error";
  EXPECT_EQ(decode_error(encode_frame_bytes(c)).code, wire_errc::bad_envelope);
  envelope ctl;
  ctl.kind = envelope_kind::control;
  EXPECT_EQ(decode_error(encode_frame_bytes(ctl)).code, wire_errc::bad_envelope);

  // An unknown kind: the kind is the first 16 bits of the root struct's data section.
  auto f = encode_frame_bytes(a_call(4));
  const std::size_t kind_at = frame_header::size + 8 + 8;
  ASSERT_EQ(static_cast<int>(f[kind_at]), static_cast<int>(envelope_kind::call));
  put(f, kind_at, std::uint16_t{77});
  auto e = decode_error(f);
  EXPECT_EQ(e.code, wire_errc::bad_envelope);
  EXPECT_NE(e.message.find("77"), std::string::npos) << e.message;
  put(f, kind_at, std::uint16_t{0});
  EXPECT_EQ(decode_error(f).code, wire_errc::bad_envelope);

  wire_limits short_messages;
  short_messages.max_error_message = 8;
  err.error_code = 2;
  err.error_message = "a message longer than eight bytes";
  EXPECT_EQ(decode_error(encode_frame_bytes(err), short_messages).code, wire_errc::bad_envelope);
}

TEST(Wire, RefusesAPayloadBothInlineAndInTheBody) {
  auto f = encode_frame_bytes(a_call(10));
  f.push_back(std::byte{1});
  put(f, 6, frame_header::flag_body);
  put(f, 16, std::uint64_t{1});
  EXPECT_EQ(decode_error(f).code, wire_errc::bad_envelope);
}

TEST(Wire, AnErrorStopsTheStreamButFramesBeforeItAreKept) {
  auto stream = encode_frame_bytes(a_call(5));
  auto bad = encode_frame_bytes(a_call(5));
  put(bad, 0, std::uint32_t{0xdeadbeef});
  stream.insert(stream.end(), bad.begin(), bad.end());
  auto after = encode_frame_bytes(a_call(5));
  stream.insert(stream.end(), after.begin(), after.end());
  frame_decoder d;
  EXPECT_FALSE(d.feed(stream));
  EXPECT_EQ(d.error().code, wire_errc::bad_magic);
  EXPECT_EQ(d.ready(), 1u);
}

}  // namespace
