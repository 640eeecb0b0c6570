#pragma once
/// @file
/// Codecs: how a value becomes bytes and back, for arguments and results of actor methods
/// that cross processes. In-process calls never use them.
///
/// A type is `troupe::serializable` when `troupe::codec<T>` has
///   `static void encode(byte_writer&, const T&)` and `static T decode(byte_reader&)`.
/// troupe provides codecs for arithmetic types, enums, `std::string`, `std::vector`,
/// `std::array`, `std::optional`, `std::pair` and `std::tuple` of serializable types; other
/// types (the Tensor type among them) specialize `troupe::codec`.
///
/// Format: little-endian fixed-width scalars, LEB128 varint lengths. Decoding is bounds-checked
/// and never trusts a length: a truncated or hostile buffer throws `troupe::error(errc::decode_error)`.
///
/// Without copying: a writer may splice a run of someone else's memory into its output instead of
/// copying it (`write_shared`, used by `troupe::shared_span`); `encode_pieces` then gives the own
/// bytes and the spliced runs as pieces that a transport writes with one gathered write. A reader
/// may know the owner of the buffer it reads (`byte_reader(bytes, owner)`), so that a decoded
/// `shared_span` is a view into that buffer instead of a copy.

#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/core/encoded_pieces.hpp"
#include "troupe/core/error.hpp"

namespace troupe {

static_assert(std::endian::native == std::endian::little,
              "troupe's wire format is little-endian; big-endian hosts need byte swaps here");

/// Appends encoded values to a growable byte buffer.
class byte_writer {
public:
  /// Runs at least this long are spliced by write_shared; shorter ones are copied.
  static constexpr std::size_t splice_threshold = 4096;

  void write_bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::byte*>(data);
    buf_.insert(buf_.end(), p, p + n);
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void write_raw(const T& v) { write_bytes(&v, sizeof(T)); }
  void write_varint(std::uint64_t v) {
    while (v >= 0x80) {
      buf_.push_back(static_cast<std::byte>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    buf_.push_back(static_cast<std::byte>(v));
  }
  /// Appends `run` without copying it (when it is splice_threshold bytes or more): the writer
  /// keeps `owner`, and the run's own memory is read when the pieces are written out, so its
  /// owner must leave the bytes unchanged until then. With a null owner the run is copied.
  void write_shared(std::span<const std::byte> run, std::shared_ptr<const void> owner) {
    if (run.size() < splice_threshold || !owner) return write_bytes(run.data(), run.size());
    spliced_ += run.size();
    splices_.push_back({buf_.size(), std::move(owner), run});
  }
  /// Zero bytes up to a multiple of `alignment` from the start of the encoding.
  void align(std::size_t alignment) {
    while (size() % alignment != 0) buf_.push_back(std::byte{0});
  }
  /// Bytes written so far, spliced runs included.
  std::size_t size() const noexcept { return buf_.size() + spliced_; }
  /// The encoding as one buffer (spliced runs are copied in first).
  std::vector<std::byte>& buffer() {
    flatten();
    return buf_;
  }
  /// The encoding as one buffer (spliced runs copied in).
  std::vector<std::byte> take() {
    flatten();
    return std::move(buf_);
  }
  /// The encoding as pieces: nothing spliced is copied.
  encoded_pieces take_pieces() noexcept {
    encoded_pieces out{std::move(buf_), std::move(splices_)};
    buf_.clear();
    splices_.clear();
    spliced_ = 0;
    return out;
  }

private:
  void flatten() {
    if (splices_.empty()) return;
    buf_ = encoded_pieces{std::move(buf_), std::move(splices_)}.flatten();
    splices_.clear();
    spliced_ = 0;
  }

  std::vector<std::byte> buf_;
  std::vector<encoded_pieces::splice> splices_;
  std::size_t spliced_ = 0;
};

/// Reads encoded values from a byte span; every read is bounds-checked.
class byte_reader {
public:
  explicit byte_reader(std::span<const std::byte> data) noexcept : data_(data) {}
  /// A reader of bytes that `owner` keeps alive: decoded views (shared_span) may point into them.
  byte_reader(std::span<const std::byte> data, std::shared_ptr<const void> owner) noexcept
      : data_(data), owner_(std::move(owner)) {}

  std::size_t remaining() const noexcept { return data_.size() - pos_; }
  /// Bytes read so far.
  std::size_t position() const noexcept { return pos_; }
  /// What keeps the bytes alive (null: a view must copy them).
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }

  /// The next `n` bytes, without copying.
  std::span<const std::byte> take(std::size_t n) {
    if (n > remaining()) fail("truncated input: need " + std::to_string(n) + " bytes, have " +
                              std::to_string(remaining()));
    auto s = data_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  void read_bytes(void* out, std::size_t n) {
    auto s = take(n);
    if (n != 0) std::memcpy(out, s.data(), n);
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  T read_raw() {
    T v;
    read_bytes(&v, sizeof(T));
    return v;
  }
  std::uint64_t read_varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      auto b = static_cast<std::uint8_t>(take(1)[0]);
      // The tenth byte holds bit 63 only; higher bits would be shifted out silently.
      if (shift == 63 && b > 1) fail("varint does not fit in 64 bits");
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("varint longer than 10 bytes");
  }
  /// Reads a length that announces `n` elements of at least `min_bytes` each and
  /// refuses lengths the remaining input cannot hold (so hostile lengths never allocate).
  std::size_t read_length(std::size_t min_bytes) {
    auto n = read_varint();
    if (min_bytes != 0 && n > remaining() / min_bytes)
      fail("length " + std::to_string(n) + " exceeds the remaining input");
    return static_cast<std::size_t>(n);
  }
  /// Skips the zero bytes byte_writer::align wrote; any other byte there is an error.
  void align(std::size_t alignment) {
    while (pos_ % alignment != 0)
      if (take(1)[0] != std::byte{0}) fail("a non-zero padding byte");
  }
  [[noreturn]] static void fail(const std::string& why) { throw error(errc::decode_error, why); }

private:
  std::span<const std::byte> data_;
  std::size_t pos_ = 0;
  std::shared_ptr<const void> owner_;
};

/// Specialize to make a type serializable.
template <class T, class Enable = void>
struct codec;

/// A type with a codec: it can be an argument or result of a method called across processes.
template <class T>
concept serializable = requires(byte_writer& w, byte_reader& r, const T& v) {
  codec<T>::encode(w, v);
  { codec<T>::decode(r) } -> std::same_as<T>;
};

/// An enum that travels names its last enumerator by specializing this with
/// `static constexpr T last = ...;` (its values running from 0 to it): decoding then refuses
/// any other value. Enums without it travel as their raw value.
template <class T>
struct enum_bounds {};

template <class T>
struct codec<T, std::enable_if_t<std::is_arithmetic_v<T> || std::is_enum_v<T>>> {
  static void encode(byte_writer& w, const T& v) { w.write_raw(v); }
  static T decode(byte_reader& r) {
    if constexpr (std::is_same_v<T, bool>) {
      auto b = r.read_raw<std::uint8_t>();
      if (b > 1) byte_reader::fail("bool byte is neither 0 nor 1");
      return b == 1;
    } else if constexpr (requires { enum_bounds<T>::last; }) {
      using raw = std::underlying_type_t<T>;
      const auto v = r.read_raw<raw>();
      if (std::cmp_less(v, 0) || std::cmp_greater(v, static_cast<raw>(enum_bounds<T>::last)))
        byte_reader::fail("enum value " + std::to_string(v) + " is out of range (0 to " +
                          std::to_string(static_cast<raw>(enum_bounds<T>::last)) + ")");
      return static_cast<T>(v);
    } else {
      return r.read_raw<T>();
    }
  }
};

template <>
struct codec<std::string> {
  static void encode(byte_writer& w, const std::string& s) {
    w.write_varint(s.size());
    w.write_bytes(s.data(), s.size());
  }
  static std::string decode(byte_reader& r) {
    auto n = r.read_length(1);
    auto bytes = r.take(n);
    return std::string(reinterpret_cast<const char*>(bytes.data()), n);
  }
};

/// Element types a vector copies as raw bytes.
template <class T>
inline constexpr bool raw_element = (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) ||
                                    std::is_same_v<T, std::byte>;

template <class T>
struct codec<std::vector<T>, std::enable_if_t<serializable<T>>> {
  static void encode(byte_writer& w, const std::vector<T>& v) {
    w.write_varint(v.size());
    if constexpr (raw_element<T>) {
      w.write_bytes(v.data(), v.size() * sizeof(T));
    } else {
      for (const auto& x : v) codec<T>::encode(w, x);
    }
  }
  static std::vector<T> decode(byte_reader& r) {
    if constexpr (std::is_same_v<T, std::byte>) {
      auto bytes = r.take(r.read_length(1));
      return std::vector<std::byte>(bytes.begin(), bytes.end());  // one copy, no zero fill first
    } else if constexpr (raw_element<T>) {
      auto n = r.read_length(sizeof(T));
      std::vector<T> v(n);
      r.read_bytes(v.data(), n * sizeof(T));
      return v;
    } else {
      auto n = r.read_length(1);
      std::vector<T> v;
      v.reserve(n);
      for (std::size_t i = 0; i < n; ++i) v.push_back(codec<T>::decode(r));
      return v;
    }
  }
};

template <class T, std::size_t N>
struct codec<std::array<T, N>, std::enable_if_t<serializable<T>>> {
  static void encode(byte_writer& w, const std::array<T, N>& a) {
    for (const auto& x : a) codec<T>::encode(w, x);
  }
  static std::array<T, N> decode(byte_reader& r) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      // Braced initialization evaluates left to right.
      return std::array<T, N>{((void)I, codec<T>::decode(r))...};
    }(std::make_index_sequence<N>{});
  }
};

template <class T>
struct codec<std::optional<T>, std::enable_if_t<serializable<T>>> {
  static void encode(byte_writer& w, const std::optional<T>& v) {
    codec<bool>::encode(w, v.has_value());
    if (v) codec<T>::encode(w, *v);
  }
  static std::optional<T> decode(byte_reader& r) {
    if (!codec<bool>::decode(r)) return std::nullopt;
    return codec<T>::decode(r);
  }
};

template <class... Ts>
struct codec<std::tuple<Ts...>, std::enable_if_t<(serializable<Ts> && ...)>> {
  static void encode(byte_writer& w, const std::tuple<Ts...>& t) {
    std::apply([&](const auto&... x) { (codec<std::decay_t<decltype(x)>>::encode(w, x), ...); }, t);
  }
  static std::tuple<Ts...> decode(byte_reader& r) {
    // Braced initialization evaluates left to right.
    return std::tuple<Ts...>{codec<Ts>::decode(r)...};
  }
};

template <class A, class B>
struct codec<std::pair<A, B>, std::enable_if_t<serializable<A> && serializable<B>>> {
  static void encode(byte_writer& w, const std::pair<A, B>& p) {
    codec<A>::encode(w, p.first);
    codec<B>::encode(w, p.second);
  }
  static std::pair<A, B> decode(byte_reader& r) {
    A a = codec<A>::decode(r);
    B b = codec<B>::decode(r);
    return {std::move(a), std::move(b)};
  }
};

/// Encodes one value into a fresh buffer.
template <serializable T>
std::vector<std::byte> encode(const T& v) {
  byte_writer w;
  codec<T>::encode(w, v);
  return w.take();
}

/// Encodes one value as pieces: runs written with write_shared stay in their own memory.
template <serializable T>
encoded_pieces encode_pieces(const T& v) {
  byte_writer w;
  codec<T>::encode(w, v);
  return w.take_pieces();
}

/// Decodes one value that must span the whole buffer; trailing bytes are a decode error. With an
/// owner of the bytes, decoded views (shared_span) point into them instead of copying.
template <serializable T>
T decode(std::span<const std::byte> bytes, std::shared_ptr<const void> owner = nullptr) {
  byte_reader r(bytes, std::move(owner));
  T v = codec<T>::decode(r);
  if (r.remaining() != 0)
    byte_reader::fail(std::to_string(r.remaining()) + " trailing bytes after the value");
  return v;
}

}  // namespace troupe
