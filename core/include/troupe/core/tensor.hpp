#pragma once
/// @file
/// tensor: a dense, contiguous, row-major array of one dtype on one device, whose bytes live in
/// a reference-counted buffer. Copying a tensor shares the buffer (cheap); views along the first
/// dimension (microbatch slicing) share it too; clone() and to() copy.
///
/// Host buffers are 64-byte aligned. Device buffers (CUDA) come from a caching allocator, so
/// that the steady state of a training loop allocates nothing from the driver.
///
/// Thread contract: a tensor object is a value (not synchronized); two tensors sharing a buffer
/// may be read concurrently, and written concurrently only where they do not overlap.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "troupe/core/codec.hpp"

namespace troupe {

/// Element types. Numbering is stable: it travels on the wire.
enum class dtype : std::uint8_t { f32 = 0, bf16 = 1, f16 = 2, i32 = 3, i64 = 4, u8 = 5, u32 = 6 };
template <>
struct enum_bounds<dtype> {
  static constexpr dtype last = dtype::u32;
};

/// Bytes per element.
std::size_t size_of(dtype t) noexcept;
/// "f32", "bf16", ...
const char* name_of(dtype t) noexcept;

/// The storage type of an element of `t` (bf16 and f16 as their 16-bit patterns).
template <class T>
constexpr bool is_element_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return std::is_same_v<T, float>;
    case dtype::bf16:
    case dtype::f16: return std::is_same_v<T, std::uint16_t>;
    case dtype::i32: return std::is_same_v<T, std::int32_t>;
    case dtype::i64: return std::is_same_v<T, std::int64_t>;
    case dtype::u8: return std::is_same_v<T, std::uint8_t>;
    case dtype::u32: return std::is_same_v<T, std::uint32_t>;
  }
  return false;
}

/// Where a tensor's bytes live.
struct device {
  enum class kind : std::uint8_t { cpu, cuda };
  kind type = kind::cpu;
  int index = 0;  ///< the CUDA device number

  static device cpu() noexcept { return {}; }
  static device cuda(int n = 0) noexcept { return {kind::cuda, n}; }
  bool is_cpu() const noexcept { return type == kind::cpu; }
  friend bool operator==(const device&, const device&) = default;
  std::string str() const;
};

/// A reference-counted block of bytes on one device. Not copyable; share it through
/// std::shared_ptr.
class buffer {
public:
  /// Allocates `bytes` on `where` (64-byte aligned on the host). Throws std::bad_alloc, or
  /// troupe::error / std::runtime_error for a device that is not available.
  buffer(std::size_t bytes, device where);
  ~buffer();
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }
  device where() const noexcept { return device_; }

private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  device device_;
};

class tensor {
public:
  using shape_type = std::vector<std::int64_t>;

  /// An empty tensor: no elements, no buffer.
  tensor() = default;

  /// Uninitialized contents. Throws std::invalid_argument for a negative dimension.
  static tensor empty(shape_type shape, dtype t = dtype::f32, device where = device::cpu());
  /// All bytes zero.
  static tensor zeros(shape_type shape, dtype t = dtype::f32, device where = device::cpu());
  /// A host tensor holding a copy of `values`; the shape must have values.size() elements.
  template <class T>
  static tensor from(std::span<const T> values, shape_type shape);
  template <class T>
  static tensor from(std::initializer_list<T> values, shape_type shape) {
    return from(std::span<const T>(values.begin(), values.size()), std::move(shape));
  }

  dtype type() const noexcept { return dtype_; }
  const shape_type& shape() const noexcept { return shape_; }
  int rank() const noexcept { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int i) const;
  std::int64_t numel() const noexcept { return numel_; }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel_) * size_of(dtype_); }
  device where() const noexcept { return buffer_ ? buffer_->where() : device::cpu(); }
  bool defined() const noexcept { return buffer_ != nullptr; }
  /// Tensors sharing this buffer (this one included).
  long use_count() const noexcept { return buffer_.use_count(); }

  /// Raw bytes (on the tensor's device).
  std::byte* bytes() noexcept { return buffer_ ? buffer_->data() + offset_ : nullptr; }
  const std::byte* bytes() const noexcept { return buffer_ ? buffer_->data() + offset_ : nullptr; }

  /// Typed host access; throws std::invalid_argument when T is not the dtype's element type
  /// or the tensor is not on the host.
  template <class T>
  std::span<T> data() {
    check_access<T>();
    return {reinterpret_cast<T*>(bytes()), static_cast<std::size_t>(numel_)};
  }
  template <class T>
  std::span<const T> data() const {
    check_access<T>();
    return {reinterpret_cast<const T*>(bytes()), static_cast<std::size_t>(numel_)};
  }

  /// Rows [begin, end) of the first dimension, sharing the buffer.
  tensor slice(std::int64_t begin, std::int64_t end) const;
  /// `parts` equal views along the first dimension; throws std::invalid_argument saying so when
  /// the first dimension does not divide.
  std::vector<tensor> split(std::int64_t parts) const;
  /// The same elements under another shape, sharing the buffer; one dimension may be -1.
  tensor reshape(shape_type shape) const;
  /// A copy in a new buffer on the same device.
  tensor clone() const;
  /// A copy on `where` (this tensor itself when it is there already).
  tensor to(device where) const;

  /// "f32[64, 784] on cpu".
  std::string str() const;
  /// "[64, 784]".
  static std::string str(const shape_type& shape);

private:
  template <class T>
  void check_access() const {
    if (!is_element_of<T>(dtype_))
      throw std::invalid_argument("tensor of dtype " + std::string(name_of(dtype_)) +
                                  " accessed with the wrong element type");
    if (!where().is_cpu())
      throw std::invalid_argument("tensor on " + where().str() +
                                  " accessed from the host: copy it with .to(device::cpu())");
  }

  std::shared_ptr<buffer> buffer_;
  std::size_t offset_ = 0;
  shape_type shape_;
  std::int64_t numel_ = 0;
  dtype dtype_ = dtype::f32;
};

/// Copies `src` into `dst` (same dtype and element count, any devices).
void copy(const tensor& src, tensor& dst);

/// Releases the device memory the caching allocator keeps for reuse. @threadsafe
void release_cached_device_memory();

/// Wire form: dtype (1 byte), rank (varint), dims (varints), then the raw little-endian
/// elements. Device tensors travel through the host. Decoding checks every field and that the
/// announced bytes are present, and rebuilds a host tensor.
template <>
struct codec<tensor> {
  static void encode(byte_writer& w, const tensor& t);
  static tensor decode(byte_reader& r);
};

template <class T>
tensor tensor::from(std::span<const T> values, shape_type shape) {
  dtype t;
  if constexpr (std::is_same_v<T, float>) t = dtype::f32;
  else if constexpr (std::is_same_v<T, std::int32_t>) t = dtype::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) t = dtype::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) t = dtype::u8;
  else if constexpr (std::is_same_v<T, std::uint32_t>) t = dtype::u32;
  else static_assert(sizeof(T) == 0, "tensor::from: use float, int32_t, int64_t, uint8_t or uint32_t");
  tensor out = empty(std::move(shape), t);
  if (static_cast<std::size_t>(out.numel()) != values.size())
    throw std::invalid_argument("tensor::from: " + std::to_string(values.size()) +
                                " values for a shape of " + std::to_string(out.numel()) + " elements");
  std::copy(values.begin(), values.end(), out.data<T>().begin());
  return out;
}

/// Whether every value is finite (no NaN, no infinity): how loaders refuse crafted files and
/// training loops notice divergence.
bool all_finite(std::span<const float> values) noexcept;
bool all_finite(std::span<const double> values) noexcept;

}  // namespace troupe
