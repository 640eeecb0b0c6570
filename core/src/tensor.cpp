#include "troupe/core/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>

#include "device_memory.hpp"

namespace troupe {

namespace {
constexpr std::size_t host_alignment = 64;
}

std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::bf16:
    case dtype::f16: return 2;
    case dtype::i32: return 4;
    case dtype::i64: return 8;
    case dtype::u8: return 1;
    case dtype::u32: return 4;
  }
  return 0;
}

const char* name_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
    case dtype::u32: return "u32";
  }
  return "?";
}

std::string device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

buffer::buffer(std::size_t bytes, device where) : bytes_(bytes), device_(where) {
  if (bytes == 0) return;
  if (where.is_cpu()) {
    data_ = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{host_alignment}));
  } else {
    data_ = static_cast<std::byte*>(detail::device_allocate(bytes, where.index));
  }
}

buffer::~buffer() {
  if (!data_) return;
  if (device_.is_cpu()) ::operator delete(data_, bytes_, std::align_val_t{host_alignment});
  else detail::device_free(data_, bytes_, device_.index);
}

namespace {

std::int64_t count_elements(const tensor::shape_type& shape, dtype t) {
  std::int64_t n = 1;
  const std::int64_t limit = std::numeric_limits<std::int64_t>::max() / 8;
  for (auto d : shape) {
    if (d < 0) throw std::invalid_argument("tensor dimensions must not be negative");
    if (d != 0 && n > limit / d) throw std::invalid_argument("tensor has too many elements");
    n *= d;
  }
  if (static_cast<std::uint8_t>(t) > static_cast<std::uint8_t>(enum_bounds<dtype>::last))
    throw std::invalid_argument("unknown tensor dtype " + std::to_string(static_cast<int>(t)));
  return n;
}

}  // namespace

std::string tensor::str(const shape_type& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

tensor tensor::empty(shape_type shape, dtype t, device where) {
  tensor out;
  out.numel_ = count_elements(shape, t);
  out.shape_ = std::move(shape);
  out.dtype_ = t;
  out.buffer_ = std::make_shared<buffer>(out.nbytes(), where);
  return out;
}

tensor tensor::zeros(shape_type shape, dtype t, device where) {
  tensor out = empty(std::move(shape), t, where);
  if (out.nbytes() == 0) return out;
  if (where.is_cpu()) std::memset(out.bytes(), 0, out.nbytes());
  else detail::device_zero(out.bytes(), out.nbytes(), where.index);
  return out;
}

std::int64_t tensor::dim(int i) const {
  if (i < 0 || i >= rank())
    throw std::out_of_range("tensor::dim(" + std::to_string(i) + ") of a rank-" +
                            std::to_string(rank()) + " tensor");
  return shape_[i];
}

tensor tensor::slice(std::int64_t begin, std::int64_t end) const {
  if (rank() < 1) throw std::invalid_argument("slice of a tensor without dimensions");
  const std::int64_t rows = shape_[0];
  if (begin < 0 || end < begin || end > rows)
    throw std::invalid_argument("slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") is outside the " + std::to_string(rows) + " rows of " + str());
  tensor out = *this;
  const std::int64_t per_row = rows == 0 ? 0 : numel_ / rows;
  out.offset_ += static_cast<std::size_t>(begin * per_row) * size_of(dtype_);
  out.shape_[0] = end - begin;
  out.numel_ = (end - begin) * per_row;
  return out;
}

std::vector<tensor> tensor::split(std::int64_t parts) const {
  if (rank() < 1) throw std::invalid_argument("split of a tensor without dimensions");
  if (parts < 1) throw std::invalid_argument("split into " + std::to_string(parts) + " parts: use at least 1");
  const std::int64_t rows = shape_[0];
  if (rows % parts != 0) {
    std::string divisors;
    for (std::int64_t d = 1; d <= rows && divisors.size() < 60; ++d)
      if (rows % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    throw std::invalid_argument("a batch of " + std::to_string(rows) + " rows does not split into " +
                                std::to_string(parts) + " equal parts; use a divisor of " +
                                std::to_string(rows) + " (" + divisors + ")");
  }
  std::vector<tensor> out;
  const std::int64_t step = rows / parts;
  for (std::int64_t i = 0; i < parts; ++i) out.push_back(slice(i * step, (i + 1) * step));
  return out;
}

tensor tensor::reshape(shape_type shape) const {
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw std::invalid_argument("reshape: at most one dimension may be -1");
      infer = static_cast<int>(i);
    } else if (shape[i] < 0) {
      throw std::invalid_argument("reshape: dimensions must be >= 0 or -1");
    } else {
      if (shape[i] != 0 && known > std::numeric_limits<std::int64_t>::max() / 8 / shape[i])
        throw std::invalid_argument("reshape of " + str() + " to " + str(shape) + ": too many elements");
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel_ % known != 0)
      throw std::invalid_argument("reshape of " + str() + " to " + str(shape) + ": -1 cannot be inferred");
    shape[infer] = numel_ / known;
    known = numel_;
  }
  if (known != numel_)
    throw std::invalid_argument("reshape of " + str() + " to " + str(shape) +
                                ": the element counts differ");
  tensor out = *this;
  out.shape_ = std::move(shape);
  return out;
}

tensor tensor::clone() const {
  tensor out = empty(shape_, dtype_, where());
  copy(*this, out);
  return out;
}

tensor tensor::to(device target) const {
  if (target == where()) return *this;
  tensor out = empty(shape_, dtype_, target);
  copy(*this, out);
  return out;
}

std::string tensor::str() const {
  return std::string(name_of(dtype_)) + str(shape_) + " on " + where().str();
}

void copy(const tensor& src, tensor& dst) {
  if (src.type() != dst.type() || src.numel() != dst.numel())
    throw std::invalid_argument("copy from " + src.str() + " to " + dst.str() +
                                ": dtypes and element counts must match");
  if (src.nbytes() == 0) return;
  if (src.where().is_cpu() && dst.where().is_cpu()) {
    std::memmove(dst.bytes(), src.bytes(), src.nbytes());
    return;
  }
  detail::device_copy(dst.bytes(), dst.where(), src.bytes(), src.where(), src.nbytes());
}

void release_cached_device_memory() { detail::device_release_cache(); }

void codec<tensor>::encode(byte_writer& w, const tensor& t) {
  const tensor host = t.to(device::cpu());
  w.write_raw(static_cast<std::uint8_t>(host.type()));
  w.write_varint(static_cast<std::uint64_t>(host.rank()));
  for (auto d : host.shape()) w.write_varint(static_cast<std::uint64_t>(d));
  w.write_bytes(host.bytes(), host.nbytes());
}

tensor codec<tensor>::decode(byte_reader& r) {
  const auto type = r.read_raw<std::uint8_t>();
  if (type > static_cast<std::uint8_t>(enum_bounds<dtype>::last))
    byte_reader::fail("tensor dtype " + std::to_string(type) + " is unknown");
  const auto rank = r.read_varint();
  if (rank > 8) byte_reader::fail("tensor rank " + std::to_string(rank) + " is above 8");
  tensor::shape_type shape;
  std::uint64_t elements = 1;
  const auto element = size_of(static_cast<dtype>(type));
  for (std::uint64_t i = 0; i < rank; ++i) {
    const auto d = r.read_varint();
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        (d != 0 && elements > (std::uint64_t{1} << 62) / d))
      byte_reader::fail("tensor shape overflows");
    elements *= d;
    shape.push_back(static_cast<std::int64_t>(d));
  }
  if (elements > r.remaining() / element)
    byte_reader::fail("tensor announces " + std::to_string(elements) + " elements of " + std::to_string(element) +
                      " bytes, " + std::to_string(r.remaining()) + " bytes remain");
  tensor t;
  try {
    t = tensor::empty(std::move(shape), static_cast<dtype>(type));
  } catch (const std::invalid_argument& e) {  // a shape no tensor may have ([2^62, 0])
    byte_reader::fail(std::string("tensor shape: ") + e.what());
  }
  r.read_bytes(t.bytes(), t.nbytes());  // straight into the tensor's own buffer
  return t;
}

namespace {
/// NaN and the infinities have every exponent bit set. Blocks of a fixed length check as one
/// vectorized OR of compares (a scan with an early exit per element stays scalar), and a block
/// with a bad value ends the scan.
template <class T, class U>
bool finite_all(std::span<const T> values) noexcept {
  static_assert(sizeof(T) == sizeof(U));
  constexpr U exponent = sizeof(T) == 4 ? U{0x7f800000u} : static_cast<U>(0x7ff0000000000000ull);
  constexpr std::size_t block = 64;
  const T* p = values.data();
  const std::size_t n = values.size();
  std::size_t i = 0;
  for (; i + block <= n; i += block) {
    U bad = 0;
    for (std::size_t j = 0; j < block; ++j) {
      U bits;
      std::memcpy(&bits, p + i + j, sizeof bits);
      bad |= static_cast<U>((bits & exponent) == exponent);
    }
    if (bad) return false;
  }
  for (; i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}
}  // namespace

bool all_finite(std::span<const float> values) noexcept { return finite_all<float, std::uint32_t>(values); }
bool all_finite(std::span<const double> values) noexcept { return finite_all<double, std::uint64_t>(values); }

}  // namespace troupe
