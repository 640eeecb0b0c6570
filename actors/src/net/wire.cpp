#include "net/wire.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>
#include <utility>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "net/envelope.capnp.h"

namespace troupe::net {

static_assert(std::endian::native == std::endian::little,
              "the frame header is little-endian; big-endian hosts need byte swaps here");
static_assert(sizeof(capnp::word) == sizeof(std::uint64_t));

std::string_view to_string(envelope_kind k) noexcept {
  switch (k) {
    case envelope_kind::call: return "call";
    case envelope_kind::tell: return "tell";
    case envelope_kind::reply: return "reply";
    case envelope_kind::error: return "error";
    case envelope_kind::control: return "control";
  }
  return "unknown";
}

std::string_view to_string(wire_errc e) noexcept {
  switch (e) {
    case wire_errc::ok: return "ok";
    case wire_errc::bad_magic: return "bad magic";
    case wire_errc::bad_version: return "bad version";
    case wire_errc::bad_header: return "bad header";
    case wire_errc::frame_too_large: return "frame too large";
    case wire_errc::truncated: return "truncated";
    case wire_errc::malformed_segments: return "malformed segments";
    case wire_errc::bad_envelope: return "bad envelope";
  }
  return "unknown";
}

void frame_header::write(std::byte* out) const noexcept {
  std::memcpy(out + 0, &magic, 4);
  std::memcpy(out + 4, &version, 2);
  std::memcpy(out + 6, &flags, 2);
  std::memcpy(out + 8, &envelope_bytes, 4);
  std::memcpy(out + 12, &reserved, 4);
  std::memcpy(out + 16, &body_bytes, 8);
}

frame_header frame_header::read(const std::byte* in) noexcept {
  frame_header h;
  std::memcpy(&h.magic, in + 0, 4);
  std::memcpy(&h.version, in + 4, 2);
  std::memcpy(&h.flags, in + 6, 2);
  std::memcpy(&h.envelope_bytes, in + 8, 4);
  std::memcpy(&h.reserved, in + 12, 4);
  std::memcpy(&h.body_bytes, in + 16, 8);
  return h;
}

std::size_t envelope::payload_size() const noexcept {
  std::size_t n = payload.size();
  for (const auto& s : splices) n += s.run.size();
  return n;
}

bool operator==(const envelope& a, const envelope& b) {
  if (a.kind != b.kind || a.target != b.target || a.method != b.method || a.request_id != b.request_id ||
      a.reply_to != b.reply_to || a.error_code != b.error_code || a.error_message != b.error_message)
    return false;
  if (a.splices.empty() && b.splices.empty()) return a.payload == b.payload;
  return encoded_pieces{a.payload, a.splices}.flatten() == encoded_pieces{b.payload, b.splices}.flatten();
}

outbound_frame encode_frame(envelope env) {
  outbound_frame out;
  const bool as_body = env.payload_size() >= inline_payload_limit;
  if (!as_body && !env.splices.empty()) {
    env.payload = encoded_pieces{std::move(env.payload), std::move(env.splices)}.flatten();
    env.splices.clear();
  }

  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::Envelope>();
  root.setKind(static_cast<schema::Kind>(env.kind));
  root.setTarget(env.target);
  root.setMethod(env.method);
  root.setRequestId(env.request_id);
  root.setReplyTo(env.reply_to);
  root.setErrorCode(env.error_code);
  if (!env.error_message.empty())
    root.setErrorMessage(capnp::Text::Reader(env.error_message.data(), env.error_message.size()));
  if (!as_body && !env.payload.empty())
    root.setPayload(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(env.payload.data()),
                                        env.payload.size()));
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();

  frame_header h;
  h.envelope_bytes = static_cast<std::uint32_t>(bytes.size());
  if (as_body) {
    h.flags = frame_header::flag_body;
    h.body_bytes = env.payload_size();
    out.body = encoded_pieces{std::move(env.payload), std::move(env.splices)};
  }
  out.head.resize(frame_header::size + bytes.size());
  h.write(out.head.data());
  std::memcpy(out.head.data() + frame_header::size, bytes.begin(), bytes.size());
  return out;
}

std::vector<std::byte> encode_frame_bytes(envelope env) {
  auto f = encode_frame(std::move(env));
  auto body = std::move(f.body).flatten();
  f.head.insert(f.head.end(), body.begin(), body.end());
  return std::move(f.head);
}

std::vector<std::byte> body_pool::take(std::size_t n) {
  std::vector<std::byte> v;
  if (n >= inline_payload_limit && n <= largest_kept) {
    std::lock_guard lock(mu_);
    // The smallest kept buffer that holds n bytes, if it is at most twice as large: a small
    // body never holds on to a large buffer (a view of it would keep the whole buffer alive).
    auto it = free_.lower_bound(n);
    if (it != free_.end() && it->first <= 2 * n) {
      bytes_ -= it->first;
      v = std::move(it->second);
      free_.erase(it);
    }
  }
  v.resize(n);
  return v;
}

void body_pool::give_back(std::vector<std::byte> buffer) noexcept {
  const auto capacity = buffer.capacity();
  if (capacity < inline_payload_limit || capacity > largest_kept) return;
  std::lock_guard lock(mu_);
  if (bytes_ + capacity > limit_) return;  // freed by the caller, after the lock
  try {
    // Before its equals: the buffer given back last is taken first, while its pages are warm.
    free_.emplace_hint(free_.lower_bound(capacity), capacity, std::move(buffer));
    bytes_ += capacity;
  } catch (const std::bad_alloc&) {
  }
}

std::size_t body_pool::kept() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

body_pool& body_pool::shared() {
  // Leaked on purpose: payloads released after static destruction (a static actor system, a
  // detached thread) still give their buffers back to a live pool.
  static auto* pool = new body_pool;
  return *pool;
}

std::shared_ptr<const std::vector<std::byte>> share_payload(std::vector<std::byte> payload, body_pool& pool) {
  return std::shared_ptr<const std::vector<std::byte>>(new std::vector<std::byte>(std::move(payload)),
                                                       [&pool](const std::vector<std::byte>* v) {
                                                         std::unique_ptr<std::vector<std::byte>> own(
                                                             const_cast<std::vector<std::byte>*>(v));
                                                         pool.give_back(std::move(*own));
                                                       });
}

wire_error validate(const envelope& env, const wire_limits& limits) {
  auto bad = [](std::string m) { return wire_error{wire_errc::bad_envelope, std::move(m)}; };
  switch (env.kind) {
    case envelope_kind::call:
      if (env.target == 0) return bad("a call without a target actor");
      if (env.request_id == 0) return bad("a call without a request id");
      break;
    case envelope_kind::tell:
      if (env.target == 0) return bad("a tell without a target actor");
      break;
    case envelope_kind::reply:
    case envelope_kind::error:
      if (env.request_id == 0)
        return bad(std::string("a ") + std::string(to_string(env.kind)) + " without a request id");
      break;
    case envelope_kind::control:
      if (env.method == 0) return bad("a control envelope without a control code");
      break;
    default:
      return bad("unknown envelope kind " + std::to_string(static_cast<unsigned>(env.kind)));
  }
  if (env.kind == envelope_kind::error) {
    if (env.error_code == 0) return bad("an error envelope without an error code");
  } else if (env.error_code != 0 || !env.error_message.empty()) {
    return bad("an error code or message on a " + std::string(to_string(env.kind)) + " envelope");
  }
  if (env.error_message.size() > limits.max_error_message)
    return bad("an error message of " + std::to_string(env.error_message.size()) +
               " bytes (limit " + std::to_string(limits.max_error_message) + ")");
  return {};
}

frame_decoder::frame_decoder(wire_limits limits) : limits_(limits) {}

bool frame_decoder::fail(wire_errc code, std::string message) {
  error_ = {code, std::move(message)};
  words_ = {};
  pending_ = {};
  return false;
}

bool frame_decoder::feed(std::span<const std::byte> data) {
  if (failed()) return false;
  while (!data.empty()) {
    switch (state_) {
      case state::header: {
        auto n = std::min(data.size(), frame_header::size - have_);
        std::memcpy(header_buf_ + have_, data.data(), n);
        have_ += n;
        data = data.subspan(n);
        // Refuse a foreign stream at its first bytes, before a whole header has arrived.
        if (have_ >= 4 && have_ - n < 4) {
          std::uint32_t magic;
          std::memcpy(&magic, header_buf_, 4);
          if (magic != frame_header::magic_value)
            return fail(wire_errc::bad_magic, "not a troupe frame (magic " + std::to_string(magic) + ")");
        }
        if (have_ == frame_header::size && !on_header()) return false;
        break;
      }
      case state::envelope: {
        auto total = std::size_t{header_.envelope_bytes};
        auto n = std::min(data.size(), total - have_);
        std::memcpy(reinterpret_cast<std::byte*>(words_.data()) + have_, data.data(), n);
        have_ += n;
        data = data.subspan(n);
        if (have_ == total && !on_envelope()) return false;
        break;
      }
      case state::body: {
        auto space = body_space();
        auto n = std::min(data.size(), space.size());
        std::memcpy(space.data(), data.data(), n);
        data = data.subspan(n);
        if (!commit_body(n)) return false;
        break;
      }
    }
  }
  return true;
}

bool frame_decoder::on_header() {
  header_ = frame_header::read(header_buf_);
  const auto& h = header_;
  if (h.magic != frame_header::magic_value) return fail(wire_errc::bad_magic, "not a troupe frame");
  if (h.version != frame_header::current_version)
    return fail(wire_errc::bad_version, "frame version " + std::to_string(h.version) +
                                            " (this node speaks " +
                                            std::to_string(frame_header::current_version) + ")");
  if ((h.flags & ~frame_header::known_flags) != 0)
    return fail(wire_errc::bad_header, "unknown frame flags " + std::to_string(h.flags));
  if (h.reserved != 0) return fail(wire_errc::bad_header, "reserved header field is not zero");
  if (h.envelope_bytes < 8 || h.envelope_bytes % 8 != 0)
    return fail(wire_errc::bad_header, "envelope length " + std::to_string(h.envelope_bytes) +
                                           " is not a positive multiple of 8");
  const bool has_body = (h.flags & frame_header::flag_body) != 0;
  if (has_body != (h.body_bytes != 0))
    return fail(wire_errc::bad_header, has_body ? "body flag set on a frame without body"
                                                : "body bytes on a frame without the body flag");
  if (h.envelope_bytes > limits_.max_envelope_bytes)
    return fail(wire_errc::frame_too_large,
                "envelope of " + std::to_string(h.envelope_bytes) + " bytes (limit " +
                    std::to_string(limits_.max_envelope_bytes) + ")");
  const auto total = std::uint64_t{frame_header::size} + h.envelope_bytes;
  if (h.body_bytes > limits_.max_frame_bytes || total + h.body_bytes > limits_.max_frame_bytes)
    return fail(wire_errc::frame_too_large,
                "frame of " + std::to_string(h.body_bytes) + " body bytes (limit " +
                    std::to_string(limits_.max_frame_bytes) + " bytes per frame)");
  words_.assign(h.envelope_bytes / 8, 0);
  state_ = state::envelope;
  have_ = 0;
  return true;
}

bool frame_decoder::on_envelope() {
  // The segment table, checked by hand so that errors say what is wrong and so that Cap'n Proto
  // only ever sees a table that matches the bytes present.
  const auto* bytes = reinterpret_cast<const std::byte*>(words_.data());
  const std::size_t total = header_.envelope_bytes;
  std::uint32_t count_minus_one;
  std::memcpy(&count_minus_one, bytes, 4);
  if (count_minus_one >= limits_.max_segments)
    return fail(wire_errc::malformed_segments,
                "segment table announces " + std::to_string(std::uint64_t{count_minus_one} + 1) +
                    " segments (limit " + std::to_string(limits_.max_segments) + ")");
  const std::size_t count = count_minus_one + 1;
  const std::size_t table_words = (count / 2) + 1;  // 4 + 4*count bytes, rounded up to 8
  if (table_words * 8 > total)
    return fail(wire_errc::truncated, "segment table of " + std::to_string(count) +
                                          " segments does not fit the envelope");
  std::uint64_t segment_words = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t w;
    std::memcpy(&w, bytes + 4 + 4 * i, 4);
    if (w == 0 && i == 0) return fail(wire_errc::malformed_segments, "the root segment is empty");
    segment_words += w;
  }
  const auto available = total / 8 - table_words;
  if (segment_words > available)
    return fail(wire_errc::truncated, "segments need " + std::to_string(segment_words) +
                                          " words, the envelope holds " + std::to_string(available));
  if (segment_words < available)
    return fail(wire_errc::malformed_segments,
                std::to_string(available - segment_words) + " words after the last segment");

  envelope env;
  std::uint32_t raw_kind = 0;
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = limits_.traversal_limit_words;
    options.nestingLimit = limits_.nesting_limit;
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(reinterpret_cast<const capnp::word*>(words_.data()),
                                        words_.size()),
        options);
    auto root = reader.getRoot<schema::Envelope>();
    raw_kind = static_cast<std::uint32_t>(root.getKind());
    env.kind = static_cast<envelope_kind>(raw_kind);
    env.target = root.getTarget();
    env.method = root.getMethod();
    env.request_id = root.getRequestId();
    env.reply_to = root.getReplyTo();
    env.error_code = root.getErrorCode();
    if (root.hasErrorMessage()) {
      auto text = root.getErrorMessage();
      if (text.size() > limits_.max_error_message)
        return fail(wire_errc::bad_envelope, "error message of " + std::to_string(text.size()) +
                                                 " bytes (limit " +
                                                 std::to_string(limits_.max_error_message) + ")");
      env.error_message.assign(text.cStr(), text.size());
    }
    if (root.hasPayload()) {
      auto data = root.getPayload();
      const auto* p = reinterpret_cast<const std::byte*>(data.begin());
      env.payload.assign(p, p + data.size());
    }
  } catch (const kj::Exception& e) {
    return fail(wire_errc::malformed_segments,
                std::string("Cap'n Proto refused the envelope: ") + e.getDescription().cStr());
  }
  if (raw_kind < 1 || raw_kind > 5)
    return fail(wire_errc::bad_envelope, "unknown envelope kind " + std::to_string(raw_kind));
  if (auto err = validate(env, limits_)) return fail(err.code, std::move(err.message));
  words_.clear();
  have_ = 0;
  if (header_.body_bytes != 0) {
    if (!env.payload.empty())
      return fail(wire_errc::bad_envelope, "a payload both inline and in the body");
    pending_ = std::move(env);
    pending_.payload = body_pool::shared().take(header_.body_bytes);
    state_ = state::body;
    return true;
  }
  ready_.push_back(std::move(env));
  state_ = state::header;
  return true;
}

std::span<std::byte> frame_decoder::body_space() noexcept {
  if (state_ != state::body || failed()) return {};
  return std::span<std::byte>(pending_.payload).subspan(have_);
}

bool frame_decoder::commit_body(std::size_t n) {
  if (failed()) return false;
  if (state_ != state::body || n > pending_.payload.size() - have_)
    return fail(wire_errc::truncated, "body bytes committed beyond the frame");
  have_ += n;
  if (have_ == pending_.payload.size()) deliver();
  return true;
}

void frame_decoder::deliver() {
  ready_.push_back(std::move(pending_));
  pending_ = {};
  state_ = state::header;
  have_ = 0;
}

std::optional<envelope> frame_decoder::pop() {
  if (ready_.empty()) return std::nullopt;
  auto env = std::move(ready_.front());
  ready_.pop_front();
  return env;
}

bool frame_decoder::finish() {
  if (failed()) return false;
  if (!idle()) {
    const char* where = state_ == state::header ? "header" : state_ == state::envelope ? "envelope" : "body";
    return fail(wire_errc::truncated, std::string("the stream ended inside a frame's ") + where);
  }
  return true;
}

}  // namespace troupe::net
