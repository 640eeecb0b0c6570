#pragma once
/// @file
/// `troupe::shared_span<T>`: numbers that travel between actors without being copied.
///
///   auto data = std::make_shared<std::vector<float>>(n);
///   troupe::shared_span<float> part({data->data() + from, len}, data);   // a view, `data` kept alive
///   peer.tell(&peer_type::take, part);
///
/// A shared_span is a view of `T`s and the owner that keeps their memory alive; copying one copies
/// the reference. In process, the receiving actor reads the sender's memory. Across nodes, the
/// sender's transport writes the values straight from that memory (a gathered write, no encoding
/// copy), and the receiver's span points into the frame it read (no decoding copy): on plain TCP
/// the values are copied only by the kernel; with TLS, the encryption reads them from there
/// into its own records, which is a copy. The sender promises not to change the values until
/// the owner is released: the owner is released when the last copy of the span is gone
/// (receivers, mailboxes and connection queues hold copies), on whatever thread drops it, which
/// is what tells the sender that nobody reads the values any more.
///
/// On the wire: the count (varint), zero bytes up to alignof(T) from the start of the encoding,
/// and the values' bytes. A decoded span whose bytes are not aligned for T (or whose reader has no
/// owner) is a copy in a buffer of its own.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>

#include "troupe/core/codec.hpp"

namespace troupe {

/// A view of numbers and the owner that keeps them alive; see the file comment.
template <class T>
  requires raw_element<T>
class shared_span {
public:
  shared_span() noexcept = default;
  /// A view of `values`, whose memory `owner` keeps alive. Copies nothing.
  shared_span(std::span<const T> values, std::shared_ptr<const void> owner) noexcept
      : owner_(std::move(owner)), data_(values.data()), size_(values.size()) {}

  /// A copy of `values` in a buffer of its own.
  static shared_span copy_of(std::span<const T> values) {
    return copy_of(std::as_bytes(values), values.size());
  }

  std::span<const T> span() const noexcept { return {data_, size_}; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  /// What keeps the values alive.
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }

private:
  template <class U, class E>
  friend struct codec;
  static shared_span copy_of(std::span<const std::byte> bytes, std::size_t n) {
    std::shared_ptr<T[]> buf(new T[n]);  // no zero fill: overwritten at once
    if (n != 0) std::memcpy(buf.get(), bytes.data(), n * sizeof(T));
    const T* p = buf.get();
    return shared_span(std::span<const T>(p, n), std::shared_ptr<const void>(std::move(buf), p));
  }

  std::shared_ptr<const void> owner_;
  const T* data_ = nullptr;
  std::size_t size_ = 0;
};

template <class T>
struct codec<shared_span<T>> {
  static void encode(byte_writer& w, const shared_span<T>& s) {
    w.write_varint(s.size());
    w.align(alignof(T));
    w.write_shared(std::as_bytes(s.span()), s.owner());
  }
  static shared_span<T> decode(byte_reader& r) {
    const auto n = r.read_length(sizeof(T));
    r.align(alignof(T));
    const auto bytes = r.take(n * sizeof(T));
    if (r.owner() && reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(T) == 0)
      return shared_span<T>(std::span<const T>(reinterpret_cast<const T*>(bytes.data()), n), r.owner());
    return shared_span<T>::copy_of(bytes, n);  // unaligned, or nothing keeps the bytes alive
  }
};

}  // namespace troupe
