#pragma once
// The wire format between troupe nodes: an envelope (Cap'n Proto, see envelope.capnp) inside a
// frame with a fixed header and an optional raw body. The frame layout is described at the top
// of transport.hpp. Nothing here includes Cap'n Proto or Asio: both stay inside wire.cpp and the
// transport.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/encoded_pieces.hpp"

namespace troupe::net {

/// What an envelope carries.
enum class envelope_kind : std::uint16_t {
  call = 1,     ///< a method call that expects a reply
  tell = 2,     ///< a method call without reply
  reply = 3,    ///< the result of a call
  error = 4,    ///< a call failed: `error_code` and `error_message` say why
  control = 5,  ///< between nodes themselves; `method` is the control code
};

std::string_view to_string(envelope_kind k) noexcept;

/// One message between nodes, decoded. `payload` holds the argument codec's bytes (or the
/// result's); on the wire it is inline in the envelope when small and the frame's raw body when
/// large, and the receiver always finds it here, in one buffer. A sender may splice runs of
/// other memory into the payload (`splices`, at offsets of `payload`): they are written from
/// their own memory, never copied into the payload (a received envelope has none).
struct envelope {
  envelope_kind kind = envelope_kind::tell;
  std::uint64_t target = 0;
  std::uint64_t method = 0;
  std::uint64_t request_id = 0;
  std::uint64_t reply_to = 0;
  std::uint32_t error_code = 0;
  std::string error_message;
  std::vector<std::byte> payload;
  std::vector<encoded_pieces::splice> splices;

  /// The payload's length, spliced runs included.
  std::size_t payload_size() const noexcept;
  /// Equal fields and equal payloads (spliced runs compared by their bytes).
  friend bool operator==(const envelope& a, const envelope& b);
};

/// The fixed frame header (little-endian on the wire).
struct frame_header {
  static constexpr std::uint32_t magic_value = 0x31505254;  // "TRP1"
  static constexpr std::uint16_t current_version = 2;  // 2: the status report with failures
  static constexpr std::size_t size = 24;
  static constexpr std::uint16_t flag_body = 1;  ///< the payload is the raw body, not inline
  static constexpr std::uint16_t known_flags = flag_body;

  std::uint32_t magic = magic_value;
  std::uint16_t version = current_version;
  std::uint16_t flags = 0;
  std::uint32_t envelope_bytes = 0;  ///< segment table + segments, a multiple of 8
  std::uint32_t reserved = 0;        ///< must be zero
  std::uint64_t body_bytes = 0;

  void write(std::byte* out) const noexcept;
  static frame_header read(const std::byte* in) noexcept;
};

/// Why a frame was refused.
enum class wire_errc {
  ok = 0,
  bad_magic,           ///< the first bytes are not a troupe frame
  bad_version,         ///< a frame version this node does not speak
  bad_header,          ///< unknown flags, a non-zero reserved field, a misaligned envelope length
  frame_too_large,     ///< the header announces more than the configured limit
  truncated,           ///< the stream ended inside a frame, or segments end before the table says
  malformed_segments,  ///< the segment table or the Cap'n Proto message is malformed
  bad_envelope,        ///< the envelope decodes but its fields break the rules
};

std::string_view to_string(wire_errc e) noexcept;

struct wire_error {
  wire_errc code = wire_errc::ok;
  std::string message;
  explicit operator bool() const noexcept { return code != wire_errc::ok; }
};

/// Bounds on what a peer may make this node read and allocate.
struct wire_limits {
  std::uint64_t max_frame_bytes = std::uint64_t{256} << 20;  ///< header + envelope + body
  std::uint32_t max_envelope_bytes = 1u << 20;               ///< segment table + segments
  std::uint32_t max_segments = 64;
  std::uint64_t traversal_limit_words = 1u << 17;  ///< Cap'n Proto ReaderOptions
  int nesting_limit = 16;                          ///< Cap'n Proto ReaderOptions
  std::uint32_t max_error_message = 64u << 10;
};

/// The target of calls and tells addressed to the receiving node itself (spawn, lookup, names,
/// status). Actors' cluster-wide ids carry a node id of at least 1 above bit 40, so no actor has
/// this id.
inline constexpr std::uint64_t node_target = 1;

/// Payloads at least this large travel as the raw body (written by scatter/gather, read into
/// their final buffer); smaller ones stay inline in the envelope.
inline constexpr std::size_t inline_payload_limit = 16u << 10;

/// A frame ready to write: `head` is the header and the envelope, `body` the raw body (empty or
/// the envelope's payload and its splices, moved, never copied). Write `pieces()` back to back.
struct outbound_frame {
  std::vector<std::byte> head;
  encoded_pieces body;
  std::size_t written = 0;  ///< bytes of it already written (the transport's bookkeeping)
  std::size_t size() const noexcept { return head.size() + body.size(); }
  /// Calls `f(std::span<const std::byte>)` for each non-empty piece of the frame, in order.
  template <class F>
  void for_each_piece(F&& f) const {
    if (!head.empty()) f(std::span<const std::byte>(head));
    body.for_each_piece(f);
  }
};

/// Builds a frame; the payload (with its splices) moves into the body when it is
/// `inline_payload_limit` or larger, and is copied into the envelope (splices included) when not.
outbound_frame encode_frame(envelope env);

/// The whole frame as one contiguous buffer (tests and the fuzzer's seeds).
std::vector<std::byte> encode_frame_bytes(envelope env);

/// Buffers for frames' bodies, used again: reading into a fresh buffer of a few hundred KiB costs
/// a page fault per 4 KiB and a zero fill, every frame. Bounded: it keeps at most `kept_bytes` of
/// buffers, each at most `largest_kept` bytes, and frees the rest. A buffer keeps its length when
/// it comes back, so a frame of the same size takes it again without a zero fill (std::vector
/// fills only what it grows by). @threadsafe
class body_pool {
public:
  static constexpr std::size_t largest_kept = std::size_t{16} << 20;
  /// A ring all-reduce keeps tens of segments of 256 KiB in flight per node.
  explicit body_pool(std::size_t kept_bytes = std::size_t{32} << 20) noexcept : limit_(kept_bytes) {}
  /// A buffer of `n` bytes: the smallest kept one that holds them if its capacity is at most
  /// 2n, else a new one. O(log kept).
  std::vector<std::byte> take(std::size_t n);
  /// Keeps `buffer` for a later take, or frees it (too small, too large, or the pool is full).
  void give_back(std::vector<std::byte> buffer) noexcept;
  /// Buffers kept now.
  std::size_t kept() const;
  /// The pool the frame decoder reads bodies into. Never destroyed, so that payloads released
  /// during or after static destruction can still give their buffers back.
  static body_pool& shared();

private:
  mutable std::mutex mu_;
  std::multimap<std::size_t, std::vector<std::byte>> free_;  // by capacity
  std::size_t bytes_ = 0;  // capacity of the buffers in free_
  std::size_t limit_;
};

/// The payload, owned by a shared pointer that gives its buffer back to `pool` when the last copy
/// is gone: the owner of decoded views into it (byte_reader's owner).
std::shared_ptr<const std::vector<std::byte>> share_payload(std::vector<std::byte> payload,
                                                            body_pool& pool = body_pool::shared());

/// Checks an envelope's fields against the rules every decoder applies; empty when valid.
wire_error validate(const envelope& env, const wire_limits& limits);

/// Decodes a byte stream into envelopes. Bytes may arrive in chunks of any size. The first error
/// is sticky: after it, `feed` returns false and the connection must close. Never allocates more
/// than `max_frame_bytes` for one frame, whatever the input.
class frame_decoder {
public:
  explicit frame_decoder(wire_limits limits = {});

  /// Consumes all of `data`; complete envelopes are queued for `pop`. False on error.
  bool feed(std::span<const std::byte> data);

  /// The next decoded envelope, oldest first.
  std::optional<envelope> pop();
  std::size_t ready() const noexcept { return ready_.size(); }

  /// When the decoder waits for the raw body of a frame, the part of the payload buffer still
  /// to fill: a reader may write into it directly and call `commit_body` (no copy through `feed`).
  std::span<std::byte> body_space() noexcept;
  bool commit_body(std::size_t n);

  /// End of stream: an error if it falls inside a frame.
  bool finish();

  bool failed() const noexcept { return static_cast<bool>(error_); }
  const wire_error& error() const noexcept { return error_; }
  /// True between frames (nothing buffered).
  bool idle() const noexcept { return state_ == state::header && have_ == 0; }
  const wire_limits& limits() const noexcept { return limits_; }
  /// New limits from the next frame on (the transport widens them after the handshake).
  void set_limits(const wire_limits& limits) noexcept { limits_ = limits; }

private:
  enum class state { header, envelope, body };
  bool fail(wire_errc code, std::string message);
  bool on_header();
  bool on_envelope();
  void deliver();

  wire_limits limits_;
  state state_ = state::header;
  std::byte header_buf_[frame_header::size] = {};
  frame_header header_;
  std::vector<std::uint64_t> words_;  // the envelope, word-aligned for Cap'n Proto
  std::size_t have_ = 0;              // bytes of the current part received so far
  envelope pending_;                  // the decoded envelope waiting for its body
  std::deque<envelope> ready_;
  wire_error error_;
};

}  // namespace troupe::net
