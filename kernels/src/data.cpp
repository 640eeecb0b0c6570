#include "troupe/kernels/data.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>

#include "labelled.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// ---- IDX reading ---------------------------------------------------------------------------

// Data sizes are checked against this before anything is allocated: far above any dataset this
// reader serves, far below what a corrupt header can announce (2^32 per dimension).
constexpr std::uint64_t max_idx_data_bytes = std::uint64_t{1} << 34;  // 16 GiB
// Deflate cannot expand data more than 1032:1 (a 258-byte match coded in 2 bits), so a gzip
// file of S bytes holds at most 1032 * S bytes: dimensions announcing more are a corrupt header.
constexpr std::uint64_t max_deflate_ratio = 1032;

const char* const install_hint =
    "install Debian's dataset-fashion-mnist (cmake/install-deps.sh does)";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("read_idx: " + path + ": " + what);
}

bool under_fashion_mnist_dir(const std::string& path) {
  std::error_code ec;
  fs::path full = fs::absolute(fs::path(path), ec);
  if (ec) full = fs::path(path);
  full = full.lexically_normal();
  const fs::path dir(fashion_mnist_dir);
  auto [d, p] = std::mismatch(dir.begin(), dir.end(), full.begin(), full.end());
  return d == dir.end();
}

std::string hex_byte(unsigned v) {
  constexpr const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[(v >> 4) & 0xF] + digits[v & 0xF];
}

struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using file_ptr = std::unique_ptr<std::FILE, file_closer>;

// The bytes of an IDX file, decoded: straight from the file or through inflate.
class byte_source {
public:
  virtual ~byte_source() = default;
  // Up to n bytes; fewer only at the end of the data. Throws on read errors and corruption.
  virtual std::size_t read(std::byte* out, std::size_t n) = 0;
  // An upper bound on the bytes still to come (exact for a plain file).
  virtual std::uint64_t remaining_bound() const = 0;
  // "plain" or "gzip", for messages.
  virtual const char* kind() const = 0;
};

class plain_source final : public byte_source {
public:
  plain_source(std::FILE* f, std::uint64_t size, const std::string& path)
      : file_(f), size_(size), path_(path) {}

  std::size_t read(std::byte* out, std::size_t n) override {
    const std::size_t got = std::fread(out, 1, n, file_);
    if (got < n && std::ferror(file_)) fail(path_, std::string("read error: ") + std::strerror(errno));
    position_ += got;
    return got;
  }
  std::uint64_t remaining_bound() const override {
    return size_ > position_ ? size_ - position_ : 0;
  }
  const char* kind() const override { return "plain"; }

private:
  std::FILE* file_;
  std::uint64_t size_;
  std::uint64_t position_ = 0;
  std::string path_;
};

// Inflates a gzip file chunk by chunk. inflate checks each member's CRC-32 and length, so a
// stream read to its end (the reader always does) has been verified. Members may follow one
// another (`cat a.gz b.gz`); any other byte after a member is trailing garbage.
class gzip_source final : public byte_source {
public:
  gzip_source(std::FILE* f, std::uint64_t size, const std::string& path)
      : file_(f), size_(size), file_left_(size), path_(path) {
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) fail(path_, "zlib failed to initialize");
  }
  ~gzip_source() override { inflateEnd(&z_); }
  gzip_source(const gzip_source&) = delete;
  gzip_source& operator=(const gzip_source&) = delete;

  std::size_t read(std::byte* out, std::size_t n) override {
    std::size_t done = 0;
    while (done < n) {
      const std::size_t want = std::min<std::size_t>(n - done, std::size_t{1} << 30);
      const std::size_t got = read_some(out + done, want);
      done += got;
      if (got < want) break;
    }
    produced_ += done;
    return done;
  }
  std::uint64_t remaining_bound() const override {
    const std::uint64_t limit = size_ > std::numeric_limits<std::uint64_t>::max() / max_deflate_ratio
                                    ? std::numeric_limits<std::uint64_t>::max()
                                    : size_ * max_deflate_ratio;
    return limit > produced_ ? limit - produced_ : 0;
  }
  const char* kind() const override { return "gzip"; }

private:
  std::size_t read_some(std::byte* out, std::size_t n) {
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out > 0) {
      if (member_ended_) {
        if (!more_input()) break;  // the true end of the data
        if (z_.next_in[0] != 0x1f)
          fail(path_, std::to_string(z_.avail_in + file_left_) +
                          " bytes of trailing garbage after the gzip stream");
        if (inflateReset(&z_) != Z_OK) fail(path_, "zlib failed to reset");
        member_ended_ = false;
      }
      if (z_.avail_in == 0 && !more_input())
        fail(path_, "the gzip stream ends early: the file is truncated (download or install it again)");
      const int rc = inflate(&z_, Z_NO_FLUSH);
      switch (rc) {
        case Z_OK: break;
        case Z_STREAM_END: member_ended_ = true; break;
        case Z_BUF_ERROR:
          if (z_.avail_in > 0) fail(path_, "the gzip stream makes no progress (corrupted)");
          break;
        case Z_MEM_ERROR: throw std::bad_alloc();
        case Z_NEED_DICT: fail(path_, "corrupted gzip stream (it asks for a preset dictionary)");
        default:
          fail(path_, std::string("corrupted gzip stream (") + (z_.msg ? z_.msg : "zlib error") +
                          "): download or install the file again");
      }
    }
    return n - z_.avail_out;
  }

  bool more_input() {
    if (z_.avail_in > 0) return true;
    if (file_left_ == 0) return false;
    const std::size_t got = std::fread(input_.data(), 1, input_.size(), file_);
    if (got == 0) {
      if (std::ferror(file_)) fail(path_, std::string("read error: ") + std::strerror(errno));
      file_left_ = 0;  // the file shrank while being read
      return false;
    }
    file_left_ -= std::min<std::uint64_t>(file_left_, got);
    z_.next_in = input_.data();
    z_.avail_in = static_cast<uInt>(got);
    return true;
  }

  std::FILE* file_;
  std::uint64_t size_;
  std::uint64_t file_left_;
  std::uint64_t produced_ = 0;
  std::string path_;
  z_stream z_{};
  bool member_ended_ = false;
  std::array<Bytef, 1 << 16> input_{};
};

struct idx_type {
  dtype type;
  std::size_t size;
};

idx_type idx_type_of(unsigned code, const std::string& path) {
  switch (code) {
    case 0x08: return {dtype::u8, 1};
    case 0x0C: return {dtype::i32, 4};
    case 0x0D: return {dtype::f32, 4};
    case 0x09:
    case 0x0B:
    case 0x0E: {
      const char* name = code == 0x09 ? "i8" : code == 0x0B ? "i16" : "f64";
      fail(path, "IDX type code " + hex_byte(code) + " (" + name +
                     ") is not supported: read_idx reads 0x08 (u8), 0x0C (i32) and 0x0D (f32)");
    }
    default:
      fail(path, "unknown IDX type code " + hex_byte(code) +
                     " (IDX knows 0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E): the file is not IDX or is corrupted");
  }
}

tensor read_idx_from(byte_source& in, const std::string& path) {
  std::array<std::uint8_t, 4> magic{};
  const std::size_t got = in.read(reinterpret_cast<std::byte*>(magic.data()), magic.size());
  if (got < magic.size())
    fail(path, "truncated: " + std::to_string(got) +
                   " bytes are too short for an IDX header (0x00 0x00 <type> <rank>)");
  if (magic[0] != 0 || magic[1] != 0)
    fail(path, "bad magic " + hex_byte(magic[0]) + " " + hex_byte(magic[1]) +
                   ": not an IDX file (IDX files start with 0x00 0x00 <type> <rank>)");
  const idx_type type = idx_type_of(magic[2], path);
  const unsigned rank = magic[3];
  if (rank == 0) fail(path, "rank 0: an IDX file needs at least one dimension");

  std::vector<std::uint8_t> dims_bytes(4 * std::size_t{rank});
  const std::size_t dims_got = in.read(reinterpret_cast<std::byte*>(dims_bytes.data()), dims_bytes.size());
  if (dims_got < dims_bytes.size())
    fail(path, "truncated header: rank " + std::to_string(rank) + " needs " +
                   std::to_string(dims_bytes.size()) + " bytes of dimensions, only " +
                   std::to_string(dims_got) + " are present");

  tensor::shape_type shape(rank);
  for (unsigned i = 0; i < rank; ++i)
    shape[i] = std::int64_t{dims_bytes[4 * i]} << 24 | std::int64_t{dims_bytes[4 * i + 1]} << 16 |
               std::int64_t{dims_bytes[4 * i + 2]} << 8 | std::int64_t{dims_bytes[4 * i + 3]};
  // The size is checked against the limit before it can overflow; a zero dimension empties it.
  std::uint64_t bytes = 0;
  if (std::none_of(shape.begin(), shape.end(), [](std::int64_t d) { return d == 0; })) {
    bytes = type.size;
    for (const std::int64_t d : shape) {
      if (bytes > max_idx_data_bytes / static_cast<std::uint64_t>(d))
        fail(path, "the dimensions " + tensor::str(shape) +
                       " announce more than the 16 GiB of data read_idx accepts: the header is corrupted");
      bytes *= static_cast<std::uint64_t>(d);
    }
  }

  const std::uint64_t bound = in.remaining_bound();
  const bool plain = std::string(in.kind()) == "plain";
  if (bytes > bound)
    fail(path, "truncated: the dimensions " + tensor::str(shape) + " need " + std::to_string(bytes) +
                   " bytes of data, " +
                   (plain ? "the file holds " + std::to_string(bound)
                          : "more than the compressed file can hold"));
  if (plain && bytes < bound)
    fail(path, std::to_string(bound - bytes) + " trailing bytes after the " + std::to_string(bytes) +
                   " bytes of data the dimensions " + tensor::str(shape) + " announce");

  tensor out;
  try {
    out = tensor::empty(shape, type.type);
  } catch (const std::invalid_argument& e) {  // a shape no tensor may have ([2^32 - 1, 0])
    fail(path, "the dimensions " + tensor::str(shape) + " are no tensor's (" + e.what() + "): the header is corrupted");
  }
  const std::size_t data_got = bytes ? in.read(out.bytes(), static_cast<std::size_t>(bytes)) : 0;
  if (data_got < bytes)
    fail(path, "truncated: the dimensions " + tensor::str(shape) + " need " + std::to_string(bytes) +
                   " bytes of data, the " + in.kind() + " stream holds " + std::to_string(data_got));
  // Reading past the data drives a gzip stream to its end, where its CRC and length are checked.
  std::byte extra{};
  if (in.read(&extra, 1) != 0) {
    // A corrupted gzip stream may inflate to more than it held: drain it (within a bound) so
    // that its CRC check, which fails first, names the real problem.
    if (!plain) {
      std::vector<std::byte> sink(std::size_t{1} << 16);
      for (std::uint64_t drained = 0; drained < (std::uint64_t{256} << 20); drained += sink.size())
        if (in.read(sink.data(), sink.size()) < sink.size()) break;
    }
    fail(path, "trailing bytes: the data goes on after the " + std::to_string(bytes) +
                   " bytes the dimensions " + tensor::str(shape) + " announce");
  }

  if (type.size == 4 && std::endian::native == std::endian::little) {
    std::byte* p = out.bytes();
    for (std::uint64_t i = 0; i < bytes; i += 4) {
      std::swap(p[i], p[i + 3]);
      std::swap(p[i + 1], p[i + 2]);
    }
  }
  return out;
}

// ---- random draws --------------------------------------------------------------------------
//
// std::mt19937_64's output is fixed by the standard; the distributions are not, so the draws
// below are written out to give the same results with every standard library.

using generator = std::mt19937_64;

// Uniform in [0, bound), unbiased: rejects the 2^64 mod bound lowest outputs.
std::uint64_t uniform_below(generator& g, std::uint64_t bound) {
  const std::uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const std::uint64_t x = g();
    if (x >= threshold) return x % bound;
  }
}

// Uniform in (0, 1], 53 bits.
double uniform_open_closed(generator& g) {
  return static_cast<double>((g() >> 11) + 1) * 0x1.0p-53;
}

// Standard normal by Box–Muller (one value per pair of uniforms).
double standard_normal(generator& g) {
  const double u1 = uniform_open_closed(g);
  const double u2 = uniform_open_closed(g);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// log of a Gamma(alpha, 1) draw: Marsaglia and Tsang (2000) for alpha >= 1, and
// Gamma(alpha) = Gamma(alpha + 1) * U^(1/alpha) below 1. Logs, because U^(1/alpha) underflows to
// zero for small alpha and a Dirichlet draw then divides zero by zero.
double log_gamma_draw(double alpha, generator& g) {
  if (alpha < 1.0) return log_gamma_draw(alpha + 1.0, g) + std::log(uniform_open_closed(g)) / alpha;
  const double d = alpha - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0.0;
    double v = 0.0;
    do {
      x = standard_normal(g);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = uniform_open_closed(g);
    if (u < 1.0 - 0.0331 * x * x * x * x) return std::log(d * v);
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return std::log(d * v);
  }
}

void fisher_yates(std::span<std::int64_t> values, generator& g) {
  for (std::size_t i = values.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(uniform_below(g, i));
    std::swap(values[i - 1], values[j]);
  }
}

std::vector<std::int64_t> label_values(const tensor& labels) {
  if (!labels.where().is_cpu())
    throw std::invalid_argument("shard_dirichlet: labels are on " + labels.where().str() +
                                ": copy them to the host with .to(device::cpu())");
  if (labels.rank() != 1)
    throw std::invalid_argument("shard_dirichlet: labels must be a 1-D tensor [N], not " + labels.str());
  std::vector<std::int64_t> out;
  switch (labels.type()) {
    case dtype::u8: for (auto v : labels.data<std::uint8_t>()) out.push_back(v); break;
    case dtype::i32: for (auto v : labels.data<std::int32_t>()) out.push_back(v); break;
    case dtype::i64: for (auto v : labels.data<std::int64_t>()) out.push_back(v); break;
    default:
      throw std::invalid_argument("shard_dirichlet: labels must be u8, i32 or i64, not " +
                                  std::string(name_of(labels.type())));
  }
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] < 0)
      throw std::invalid_argument("shard_dirichlet: label " + std::to_string(out[i]) + " at index " +
                                  std::to_string(i) + " is negative: classes are 0, 1, 2, ...");
  return out;
}

std::int64_t row_elements(const tensor& t) {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < t.shape().size(); ++i) n *= t.shape()[i];
  return n;
}

// ---- Fashion-MNIST ---------------------------------------------------------------------------

dataset load_split(const fs::path& dir, const std::string& prefix) {
  const std::string images_path = (dir / (prefix + "-images-idx3-ubyte.gz")).string();
  const std::string labels_path = (dir / (prefix + "-labels-idx1-ubyte.gz")).string();
  dataset out{read_idx(images_path), read_idx(labels_path)};
  const auto bad = [](const std::string& path, const std::string& what) {
    return std::runtime_error("load_fashion_mnist: " + path + ": " + what +
                              " (the file is not Fashion-MNIST's: install it again)");
  };
  const tensor& im = out.images;
  if (im.type() != dtype::u8 || im.rank() != 3 || im.dim(1) != fashion_mnist_side ||
      im.dim(2) != fashion_mnist_side)
    throw bad(images_path, "holds " + im.str() + ", not u8 images [N, 28, 28]");
  const tensor& lb = out.labels;
  if (lb.type() != dtype::u8 || lb.rank() != 1)
    throw bad(labels_path, "holds " + lb.str() + ", not u8 labels [N]");
  if (im.dim(0) != lb.dim(0))
    throw bad(labels_path, "holds " + std::to_string(lb.dim(0)) + " labels for the " +
                               std::to_string(im.dim(0)) + " images of " + images_path);
  const auto labels = lb.data<std::uint8_t>();
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= fashion_mnist_classes)
      throw bad(labels_path, "label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
                                 " is outside 0..9");
  return out;
}

}  // namespace

tensor read_idx(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    if (under_fashion_mnist_dir(path)) fail(path, std::string("the file is missing: ") + install_hint);
    fail(path, "the file is missing");
  }
  if (status.type() == fs::file_type::directory) fail(path, "is a directory, not an IDX file");
  if (status.type() != fs::file_type::regular) fail(path, "is not a regular file (a pipe or a device?), not an IDX file");

  file_ptr file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    const int err = errno;
    if (err == ENOENT) {
      if (under_fashion_mnist_dir(path)) fail(path, std::string("the file is missing: ") + install_hint);
      fail(path, "the file is missing");
    }
    fail(path, std::string("cannot open it: ") + std::strerror(err));
  }
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) fail(path, "cannot determine its size: " + ec.message());

  std::array<unsigned char, 2> head{};
  const std::size_t head_got = std::fread(head.data(), 1, head.size(), file.get());
  if (std::fseek(file.get(), 0, SEEK_SET) != 0)
    fail(path, std::string("cannot seek: ") + std::strerror(errno));
  if (head_got == 2 && head[0] == 0x1f && head[1] == 0x8b) {
    gzip_source in(file.get(), size, path);
    return read_idx_from(in, path);
  }
  plain_source in(file.get(), size, path);
  return read_idx_from(in, path);
}

fashion_mnist load_fashion_mnist(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw std::runtime_error("load_fashion_mnist: " + dir +
                             " is a file, not a directory: pass the directory that holds the four "
                             "Fashion-MNIST files");
  if (!fs::is_directory(dir, ec)) {
    const bool standard = under_fashion_mnist_dir(dir);
    throw std::runtime_error(
        "load_fashion_mnist: the directory " + dir + " does not exist: " +
        (standard ? std::string(install_hint)
                  : std::string("pass the directory that holds train-images-idx3-ubyte.gz, "
                                "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
                                "t10k-labels-idx1-ubyte.gz")));
  }
  fashion_mnist out;
  out.train = load_split(dir, "train");
  out.test = load_split(dir, "t10k");
  return out;
}

pixel_stats pixel_statistics(const tensor& u8_images) {
  if (u8_images.type() != dtype::u8 || !u8_images.where().is_cpu() || u8_images.rank() < 1)
    throw std::invalid_argument("pixel_statistics: expects u8 images [N, ...] on the host, not " +
                                u8_images.str());
  // A histogram keeps the sums exact (below 2^48 pixels, where the sum of squares could wrap).
  std::array<std::uint64_t, 256> counts{};
  for (const std::uint8_t v : u8_images.data<std::uint8_t>()) ++counts[v];
  std::uint64_t n = 0, sum = 0, squares = 0;
  for (std::uint64_t v = 0; v < 256; ++v) {
    n += counts[v];
    sum += counts[v] * v;
    squares += counts[v] * v * v;
  }
  if (n == 0) return {};
  const long double mean = static_cast<long double>(sum) / n;
  const long double variance = std::max(0.0L, static_cast<long double>(squares) / n - mean * mean);
  return {static_cast<float>(mean / 255.0L), static_cast<float>(std::sqrt(variance) / 255.0L)};
}

namespace detail {

void finish_labelled_data(labelled_data& data, const std::string& prefix, const part_names& names) {
  const auto bad = [&](const std::string& part, const std::string& what) {
    return std::runtime_error(prefix + part + ": " + what);
  };
  const tensor& x = data.train.images;
  const tensor& xt = data.test.images;
  if (x.type() != dtype::u8 && x.type() != dtype::f32)
    throw bad(names.x_train, "holds " + x.str() + ": images must be u8 (pixels 0..255) or f32 (features)");
  if (x.rank() < 2 || x.rank() > max_image_rank)
    throw bad(names.x_train, "holds " + x.str() + ": images need a shape (N, ...) of rank 2 to " +
                                 std::to_string(max_image_rank) + " (N examples of one shape each)");
  if (x.dim(0) < 1) throw bad(names.x_train, "holds no examples (" + x.str() + ")");
  if (xt.type() != x.type())
    throw bad(names.x_test, "holds " + std::string(name_of(xt.type())) + " but " + names.x_train + " holds " +
                                name_of(x.type()) + ": give both splits the same dtype");
  const tensor::shape_type row(x.shape().begin() + 1, x.shape().end());
  if (xt.rank() < 1 || tensor::shape_type(xt.shape().begin() + 1, xt.shape().end()) != row)
    throw bad(names.x_test, "holds " + xt.str() + ": its examples must have " + names.x_train + "'s shape " +
                                tensor::str(row));
  for (const auto& [split, name, images] : {std::tuple{&data.train, &names.y_train, &names.x_train},
                                            std::tuple{&data.test, &names.y_test, &names.x_test}}) {
    const tensor& y = split->labels;
    if (y.type() != dtype::u8 || y.rank() != 1)
      throw bad(*name, "holds " + y.str() + ", not u8 labels [N]");
    if (y.dim(0) != split->images.dim(0))
      throw bad(*name, "holds " + std::to_string(y.dim(0)) + " labels for the " +
                           std::to_string(split->images.dim(0)) + " examples of " + *images);
    if (split->images.type() == dtype::f32) {
      const auto values = split->images.data<float>();
      for (std::size_t i = 0; i < values.size(); ++i)
        if (!std::isfinite(values[i]))
          throw bad(*images, "value " + std::to_string(values[i]) + " at flat index " + std::to_string(i) +
                                 " is not finite: features must be finite numbers");
    }
  }
  if (data.client_train.defined()) {
    const tensor& c = data.client_train;
    if (c.type() != dtype::u32 || c.rank() != 1)
      throw bad(names.client_train, "holds " + c.str() + ", not u32 client numbers [N]");
    if (c.dim(0) != x.dim(0))
      throw bad(names.client_train, "holds " + std::to_string(c.dim(0)) + " client numbers for the " +
                                        std::to_string(x.dim(0)) + " examples of " + names.x_train);
  }
  int top = 0;
  for (const dataset* split : {&data.train, &data.test})
    for (const std::uint8_t label : split->labels.data<std::uint8_t>()) top = std::max<int>(top, label);
  if (top < 1)
    throw bad(names.y_train, "every label of both splits is 0: a classifier needs at least 2 classes");
  data.classes = top + 1;
  if (x.type() == dtype::u8) {
    const pixel_stats stats = pixel_statistics(x);
    data.mean = stats.mean;
    // All pixels equal: normalization then only shifts them to 0.
    data.stddev = stats.stddev > 0.0f ? stats.stddev : 1.0f;
  } else {
    data.mean = 0.0f;
    data.stddev = 1.0f;
  }
}

}  // namespace detail

labelled_data load_idx_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error("load_idx_dir: " + dir + (fs::exists(dir, ec) ? " is not a directory" : " does not exist") +
                             ": pass the directory that holds train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                             "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (each plain or .gz)");
  // The plain file when it exists, else the gzip'd one.
  const auto find = [&](const std::string& name) {
    const fs::path plain = fs::path(dir) / name;
    const fs::path gz = fs::path(dir) / (name + ".gz");
    std::error_code e;
    if (fs::exists(plain, e)) return plain.string();
    if (fs::exists(gz, e)) return gz.string();
    throw std::runtime_error("load_idx_dir: " + dir + ": neither " + name + " nor " + name + ".gz exists");
  };
  detail::part_names names{find("train-images-idx3-ubyte"), find("train-labels-idx1-ubyte"),
                           find("t10k-images-idx3-ubyte"), find("t10k-labels-idx1-ubyte"), ""};
  const auto labels = [](const std::string& path) {
    tensor y = read_idx(path);
    if (y.type() != dtype::i32 || y.rank() != 1) return y;  // finish_labelled_data names the problem
    tensor out = tensor::empty({y.dim(0)}, dtype::u8);
    const auto in = y.data<std::int32_t>();
    const auto dst = out.data<std::uint8_t>();
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (in[i] < 0 || in[i] > 255)
        throw std::runtime_error("load_idx_dir: " + path + ": label " + std::to_string(in[i]) + " at index " +
                                 std::to_string(i) + " is outside 0..255");
      dst[i] = static_cast<std::uint8_t>(in[i]);
    }
    return out;
  };
  labelled_data out;
  out.train = {read_idx(names.x_train), labels(names.y_train)};
  out.test = {read_idx(names.x_test), labels(names.y_test)};
  detail::finish_labelled_data(out, "load_idx_dir: ", names);
  return out;
}

tensor normalize(const tensor& u8_images, float mean, float stddev) {
  if (u8_images.type() != dtype::u8 || !u8_images.where().is_cpu() || u8_images.rank() < 1)
    throw std::invalid_argument("normalize: expects u8 images [N, ...] on the host, not " +
                                u8_images.str());
  if (!(stddev > 0.0f) || !std::isfinite(stddev) || !std::isfinite(mean))
    throw std::invalid_argument("normalize: mean must be finite and stddev positive and finite (got mean " +
                                std::to_string(mean) + ", stddev " + std::to_string(stddev) + ")");
  std::array<float, 256> table{};
  for (int v = 0; v < 256; ++v) table[v] = (static_cast<float>(v) / 255.0f - mean) / stddev;
  tensor out = tensor::empty({u8_images.dim(0), row_elements(u8_images)}, dtype::f32);
  const auto in = u8_images.data<std::uint8_t>();
  const auto dst = out.data<float>();
  for (std::size_t i = 0; i < in.size(); ++i) dst[i] = table[in[i]];
  return out;
}

std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed) {
  if (n < 0)
    throw std::invalid_argument("shuffled_indices: n must not be negative (got " + std::to_string(n) + ")");
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
  generator g(seed);
  fisher_yates(out, g);
  return out;
}

std::vector<std::vector<std::int64_t>> shard_iid(std::int64_t n, int clients, std::uint64_t seed) {
  if (n < 0) throw std::invalid_argument("shard_iid: n must not be negative (got " + std::to_string(n) + ")");
  if (clients < 1)
    throw std::invalid_argument("shard_iid: clients must be at least 1 (got " + std::to_string(clients) + ")");
  const std::vector<std::int64_t> order = shuffled_indices(n, seed);
  std::vector<std::vector<std::int64_t>> shards(static_cast<std::size_t>(clients));
  const std::int64_t base = n / clients;
  const std::int64_t extra = n % clients;
  auto next = order.begin();
  for (int c = 0; c < clients; ++c) {
    const std::int64_t size = base + (c < extra ? 1 : 0);
    shards[static_cast<std::size_t>(c)].assign(next, next + size);
    next += size;
  }
  return shards;
}

std::vector<std::vector<std::int64_t>> shard_dirichlet(const tensor& labels, int clients, double alpha,
                                                       std::uint64_t seed, int min_size) {
  if (!(alpha > 0.0) || !std::isfinite(alpha))
    throw std::invalid_argument("shard_dirichlet: alpha must be positive and finite (got " +
                                std::to_string(alpha) + "): 0.1 is very skewed, 100 nearly IID");
  if (clients < 1)
    throw std::invalid_argument("shard_dirichlet: clients must be at least 1 (got " +
                                std::to_string(clients) + ")");
  if (min_size < 0)
    throw std::invalid_argument("shard_dirichlet: min_size must not be negative (got " +
                                std::to_string(min_size) + ")");
  const std::vector<std::int64_t> values = label_values(labels);
  const auto n = static_cast<std::int64_t>(values.size());
  if (std::int64_t{clients} * min_size > n)
    throw std::invalid_argument("shard_dirichlet: cannot give each of " + std::to_string(clients) +
                                " clients at least " + std::to_string(min_size) + " of " +
                                std::to_string(n) + " examples: lower min_size or use fewer clients");

  // The examples of each class, in index order.
  std::vector<std::int64_t> by_class(values.size());
  for (std::int64_t i = 0; i < n; ++i) by_class[static_cast<std::size_t>(i)] = i;
  std::stable_sort(by_class.begin(), by_class.end(), [&](std::int64_t a, std::int64_t b) {
    return values[static_cast<std::size_t>(a)] < values[static_cast<std::size_t>(b)];
  });
  std::vector<std::span<std::int64_t>> classes;
  for (std::size_t begin = 0; begin < by_class.size();) {
    std::size_t end = begin;
    const std::int64_t label = values[static_cast<std::size_t>(by_class[begin])];
    while (end < by_class.size() && values[static_cast<std::size_t>(by_class[end])] == label) ++end;
    classes.emplace_back(by_class.data() + begin, end - begin);
    begin = end;
  }

  generator g(seed);
  const auto k = static_cast<std::size_t>(clients);
  const double share = static_cast<double>(n) / clients;
  std::vector<double> log_p(k);
  std::vector<double> p(k);
  // At most 1000 draws, and at most about 5 x 10^7 proportions in all (a few seconds): with
  // millions of clients one draw is already 10^7 of them, and 1000 would run for an hour.
  const std::int64_t per_draw = static_cast<std::int64_t>(k) * static_cast<std::int64_t>(classes.size());
  const int max_draws = static_cast<int>(std::clamp<std::int64_t>(50'000'000 / std::max<std::int64_t>(per_draw, 1), 1, 1000));
  for (int draw = 0; draw < max_draws; ++draw) {
    std::vector<std::vector<std::int64_t>> shards(k);
    for (const auto& members : classes) {
      fisher_yates(members, g);
      for (auto& lp : log_p) lp = log_gamma_draw(alpha, g);
      // A client that already holds its share (n / clients) gets nothing more, as in
      // NIID-Bench: without it, small alpha hands whole classes to a few clients.
      bool any_open = false;
      for (std::size_t c = 0; c < k; ++c) any_open = any_open || static_cast<double>(shards[c].size()) < share;
      double top = -std::numeric_limits<double>::infinity();
      for (std::size_t c = 0; c < k; ++c) {
        const bool open = !any_open || static_cast<double>(shards[c].size()) < share;
        p[c] = open ? log_p[c] : -std::numeric_limits<double>::infinity();
        top = std::max(top, p[c]);
      }
      // Scaled so that the largest open proportion is exactly 1: the sum is at least 1.
      double sum = 0.0;
      for (std::size_t c = 0; c < k; ++c) {
        p[c] = std::exp(p[c] - top);
        sum += p[c];
      }
      // Cut points floor(cumulative proportion * class size), the last at the class size.
      const auto count = static_cast<double>(members.size());
      std::size_t begin = 0;
      double cumulative = 0.0;
      for (std::size_t c = 0; c < k; ++c) {
        cumulative += p[c];
        std::size_t end = c + 1 == k ? members.size()
                                     : static_cast<std::size_t>(std::floor(cumulative / sum * count));
        end = std::clamp(end, begin, members.size());
        shards[c].insert(shards[c].end(), members.begin() + static_cast<std::ptrdiff_t>(begin),
                         members.begin() + static_cast<std::ptrdiff_t>(end));
        begin = end;
      }
    }
    const auto smallest = std::min_element(shards.begin(), shards.end(), [](const auto& a, const auto& b) {
      return a.size() < b.size();
    });
    if (static_cast<std::int64_t>(smallest->size()) >= min_size) return shards;
  }
  throw std::runtime_error("shard_dirichlet: " + std::to_string(max_draws) +
                           (max_draws == 1 ? " draw" : " draws in a row") + " left a client with fewer than " +
                           std::to_string(min_size) + " examples: lower min_size, raise alpha or use fewer clients");
}

void gather_rows(const tensor& source, std::span<const std::int64_t> rows, tensor& out) {
  if (!source.where().is_cpu() || !out.where().is_cpu())
    throw std::invalid_argument("gather_rows: source (" + source.str() + ") and out (" + out.str() +
                                ") must be on the host: copy them with .to(device::cpu())");
  if (source.rank() < 1 || out.rank() < 1)
    throw std::invalid_argument("gather_rows: source (" + source.str() + ") and out (" + out.str() +
                                ") need a first dimension of rows");
  if (source.type() != out.type())
    throw std::invalid_argument("gather_rows: source is " + std::string(name_of(source.type())) +
                                " but out is " + name_of(out.type()) + ": give out the source's dtype");
  if (out.dim(0) != static_cast<std::int64_t>(rows.size()) || row_elements(out) != row_elements(source))
    throw std::invalid_argument("gather_rows: out is " + out.str() + " but " + std::to_string(rows.size()) +
                                " rows of " + source.str() + " need [" + std::to_string(rows.size()) + ", " +
                                std::to_string(row_elements(source)) + "] elements");
  const std::size_t row_bytes = static_cast<std::size_t>(row_elements(source)) * size_of(source.type());
  if (out.nbytes() > 0 && source.nbytes() > 0 && out.bytes() < source.bytes() + source.nbytes() &&
      source.bytes() < out.bytes() + out.nbytes())
    throw std::invalid_argument("gather_rows: out overlaps source: gather into a tensor of its own");
  const std::int64_t n = source.dim(0);
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= n)
      throw std::out_of_range("gather_rows: row index " + std::to_string(rows[i]) + " (position " +
                              std::to_string(i) + ") is outside [0, " + std::to_string(n) + ") of " +
                              source.str());
  if (row_bytes == 0) return;
  const std::byte* src = source.bytes();
  std::byte* dst = out.bytes();
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dst + i * row_bytes, src + static_cast<std::size_t>(rows[i]) * row_bytes, row_bytes);
}

tensor gather_rows(const tensor& source, std::span<const std::int64_t> rows) {
  if (source.rank() < 1)
    throw std::invalid_argument("gather_rows: source (" + source.str() + ") needs a first dimension of rows");
  tensor::shape_type shape = source.shape();
  shape[0] = static_cast<std::int64_t>(rows.size());
  tensor out = tensor::empty(std::move(shape), source.type());
  gather_rows(source, rows, out);
  return out;
}

batch_iterator::batch_iterator(std::span<const std::int64_t> indices, std::int64_t batch_size, bool drop_last)
    : indices_(indices), batch_size_(batch_size), drop_last_(drop_last) {
  if (batch_size < 1)
    throw std::invalid_argument("batch_iterator: batch_size must be at least 1 (got " +
                                std::to_string(batch_size) + ")");
}

std::optional<std::span<const std::int64_t>> batch_iterator::next() {
  const std::size_t left = indices_.size() - position_;
  if (left == 0) return std::nullopt;
  const auto size = std::min(left, static_cast<std::size_t>(batch_size_));
  if (drop_last_ && size < static_cast<std::size_t>(batch_size_)) {
    position_ = indices_.size();
    return std::nullopt;
  }
  const auto batch = indices_.subspan(position_, size);
  position_ += size;
  return batch;
}

std::int64_t batch_iterator::count() const noexcept {
  const auto n = static_cast<std::int64_t>(indices_.size());
  return n / batch_size_ + (!drop_last_ && n % batch_size_ != 0 ? 1 : 0);  // no n + batch - 1: it can overflow
}

}  // namespace troupe
