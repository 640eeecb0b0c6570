#pragma once
/// @file
/// Training data: a reader for the IDX format (plain or gzip-compressed), the Fashion-MNIST
/// files that Debian's package `dataset-fashion-mnist` installs, normalization, seeded
/// shuffling, shards (index lists) for many clients, and batching by index lists.
///
/// Sharing: a dataset is loaded once; clients hold only index lists (shards) and build their
/// batches with gather_rows() from the one shared, read-only copy of the data.
///
/// Determinism: every random choice takes a seed and uses std::mt19937_64 (whose output the C++
/// standard fixes) with draws written here (bounded integers by rejection, Fisher–Yates,
/// Marsaglia–Tsang gamma), so the same seed gives the same result with any standard library.
///
/// Thread contract: the functions are free of shared state; calls on distinct arguments may run
/// concurrently, and many threads may read one dataset at the same time.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "troupe/core/tensor.hpp"

namespace troupe {

// ---- IDX files -------------------------------------------------------------------------------

/// Reads an IDX file (the MNIST format: magic 0x00 0x00 <type> <rank>, <rank> big-endian u32
/// dimensions, then the big-endian data), plain or gzip-compressed (recognized by the
/// gzip magic bytes 0x1f 0x8b). Type 0x08 gives a u8 tensor, 0x0C an i32 tensor and 0x0D an f32
/// tensor (converted to host byte order); the shape is the file's dimensions.
///
/// Throws std::runtime_error naming the file and what is wrong: a missing file (with the
/// package to install when the path is under /usr/share/datasets/fashion-mnist), a bad magic,
/// an unsupported type code (0x09 i8, 0x0B i16, 0x0E f64) or an unknown one, a truncated
/// header or data, data that does not match the dimensions, trailing bytes, or a corrupted
/// gzip stream (its CRC and length are checked). No allocation exceeds what the file can hold.
tensor read_idx(const std::string& path);

// ---- Fashion-MNIST -----------------------------------------------------------------------------

/// Where Debian's `dataset-fashion-mnist` installs the gzip'd IDX files.
inline constexpr const char* fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";
/// Mean and standard deviation of Fashion-MNIST's training pixels scaled to [0, 1].
inline constexpr float fashion_mnist_mean = 0.2860f;
inline constexpr float fashion_mnist_std = 0.3530f;
/// Fashion-MNIST's number of classes (labels 0..9) and image side (28 x 28).
inline constexpr int fashion_mnist_classes = 10;
inline constexpr int fashion_mnist_side = 28;

/// Images and their labels.
struct dataset {
  tensor images;  ///< u8 [N, 28, 28], pixels 0..255
  tensor labels;  ///< u8 [N], classes 0..9

  /// Number of examples (N).
  std::int64_t size() const { return labels.defined() ? labels.dim(0) : 0; }
};

/// Fashion-MNIST's two splits.
struct fashion_mnist {
  dataset train;  ///< 60000 examples
  dataset test;   ///< 10000 examples
};

/// Loads train-{images-idx3,labels-idx1}-ubyte.gz and t10k-{...}-ubyte.gz from `dir` and checks
/// them: images u8 [N, 28, 28], labels u8 [N] with the same N, labels in 0..9. Throws
/// std::runtime_error naming the file and what is wrong (see read_idx for the file errors; the
/// default directory's messages say to install Debian's `dataset-fashion-mnist`).
fashion_mnist load_fashion_mnist(const std::string& dir = fashion_mnist_dir);

// ---- normalization -----------------------------------------------------------------------------

/// (x / 255 - mean) / stddev for every pixel of u8 images [N, ...] as an f32 tensor [N, D], D the
/// product of the other dimensions (784 for 28 x 28). Throws std::invalid_argument for a tensor
/// that is not u8 on the host or has no dimensions, and for a stddev that is not positive and
/// finite or a mean that is not finite.
tensor normalize(const tensor& u8_images, float mean = fashion_mnist_mean,
                 float stddev = fashion_mnist_std);

// ---- shuffling and shards ----------------------------------------------------------------------

/// A permutation of 0..n-1 that depends only on (n, seed): Fisher–Yates from the last position
/// down, swapping position i with j uniform in [0, i], drawn from std::mt19937_64(seed) by
/// rejection (unbiased). Throws std::invalid_argument for n < 0.
std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed);

/// IID shards: shuffled_indices(n, seed) cut into `clients` consecutive pieces whose sizes
/// differ by at most one (the first n % clients pieces hold one more; pieces are empty when
/// clients > n). Every index appears exactly once. Throws std::invalid_argument for n < 0 or
/// clients < 1.
std::vector<std::vector<std::int64_t>> shard_iid(std::int64_t n, int clients, std::uint64_t seed);

/// Label-skewed (non-IID) shards, as in NIID-Bench (Li et al., 2021): for each class in
/// ascending order, its examples are shuffled and split among the clients in proportions drawn
/// from a symmetric Dirichlet(alpha); a client already holding at least n / clients examples
/// gets no more. The whole draw is repeated until every client holds at least `min_size`
/// examples. Small alpha (0.1) gives clients few classes each; large alpha (100) approaches IID.
/// Every index appears exactly once; each shard lists its indices class by class.
///
/// `labels` is a 1-D u8, i32 or i64 host tensor of non-negative classes. Throws
/// std::invalid_argument for alpha <= 0 (or not finite), clients < 1, min_size < 0,
/// clients * min_size > n or bad labels, and std::runtime_error when 1000 draws in a row leave
/// a client below min_size (lower min_size, raise alpha or use fewer clients).
std::vector<std::vector<std::int64_t>> shard_dirichlet(const tensor& labels, int clients,
                                                       double alpha, std::uint64_t seed,
                                                       int min_size = 1);

// ---- batching ------------------------------------------------------------------------------

/// Copies rows `rows` of `source` [N, ...] (any dtype, on the host) into `out`, which must have
/// the same dtype, first dimension rows.size() and the same number of elements per row (for
/// example source u8 [N, 28, 28] into out u8 [B, 784]). Throws std::invalid_argument for
/// mismatched shapes or dtypes, a tensor off the host, or `out` overlapping `source`, and
/// std::out_of_range for an index outside [0, N).
void gather_rows(const tensor& source, std::span<const std::int64_t> rows, tensor& out);

/// gather_rows into a new tensor [rows.size(), source's other dimensions...].
tensor gather_rows(const tensor& source, std::span<const std::int64_t> rows);

/// Walks an index list in batches of `batch_size` consecutive entries; the last batch is
/// smaller, or dropped when `drop_last`. Views the list without copying it: the list must
/// outlive the iterator.
///
///   batch_iterator batches(shard, 32);
///   while (auto batch = batches.next()) gather_rows(images, *batch, x);
class batch_iterator {
public:
  /// Throws std::invalid_argument for batch_size < 1.
  batch_iterator(std::span<const std::int64_t> indices, std::int64_t batch_size,
                 bool drop_last = false);

  /// The next batch, or nothing after the last one.
  std::optional<std::span<const std::int64_t>> next();
  /// Number of batches in one pass.
  std::int64_t count() const noexcept;
  /// Starts the pass again from the first batch.
  void reset() noexcept { position_ = 0; }

private:
  std::span<const std::int64_t> indices_;
  std::int64_t batch_size_;
  bool drop_last_;
  std::size_t position_ = 0;
};

}  // namespace troupe
