#pragma once
/// @file
/// Training data: a reader for the IDX format (plain or gzip-compressed), the Fashion-MNIST
/// files that Debian's package `dataset-fashion-mnist` installs, users' own labelled data (a
/// NumPy .npz archive or a directory of MNIST-style IDX files), normalization, seeded
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

/// Examples and their labels.
struct dataset {
  tensor images;  ///< u8 [N, ...] (pixels 0..255, normalized before use) or f32 [N, ...] (features used as they are)
  tensor labels;  ///< u8 [N], classes 0..classes-1

  /// Number of examples (N).
  std::int64_t size() const { return labels.defined() ? labels.dim(0) : 0; }
};

/// A labelled data set: two splits with images of one dtype and one shape per example, the
/// number of classes, the statistics u8 pixels are normalized with, and optionally the client
/// each training example belongs to (for data that comes already partitioned).
struct labelled_data {
  dataset train;
  dataset test;
  int classes = fashion_mnist_classes;  ///< labels lie in 0..classes-1
  /// What u8 pixels scaled to [0, 1] are normalized with: Fashion-MNIST's constants for
  /// Fashion-MNIST, the training pixels' own statistics for other u8 data (pixel_statistics).
  /// f32 features are used as they are: the loaders then set 0 and 1, which nothing reads.
  float mean = fashion_mnist_mean;
  float stddev = fashion_mnist_std;
  /// Undefined, or u32 [train.size()]: the client (0..C-1) each training example belongs to.
  /// A client number between 0 and the largest one may hold no example.
  tensor client_train;
};

/// Fashion-MNIST is a labelled_data (60000 and 10000 examples, 10 classes); callers of
/// load_fashion_mnist name it so.
using fashion_mnist = labelled_data;

/// Loads train-{images-idx3,labels-idx1}-ubyte.gz and t10k-{...}-ubyte.gz from `dir` and checks
/// them: images u8 [N, 28, 28], labels u8 [N] with the same N, labels in 0..9; classes is 10 and
/// mean and stddev are fashion_mnist_mean and fashion_mnist_std. Throws std::runtime_error
/// naming the file and what is wrong (see read_idx for the file errors; the default
/// directory's messages say to install Debian's `dataset-fashion-mnist`).
fashion_mnist load_fashion_mnist(const std::string& dir = fashion_mnist_dir);

// ---- users' own data ---------------------------------------------------------------------------

/// Mean and standard deviation of u8 pixels scaled to [0, 1] (population statistics, computed
/// exactly from a histogram of the 256 values).
struct pixel_stats {
  float mean = 0.0f;
  float stddev = 0.0f;
};

/// pixel_statistics of u8 images [N, ...] on the host. Throws std::invalid_argument for another
/// dtype, a tensor off the host or no dimensions. An empty tensor gives {0, 0}.
pixel_stats pixel_statistics(const tensor& u8_images);

/// Loads a NumPy .npz archive (np.savez or np.savez_compressed: .npy entries stored or
/// deflated) holding x_train, y_train, x_test, y_test and optionally client_train:
///
///   np.savez("mine.npz", x_train=x, y_train=y, x_test=xt, y_test=yt)   # client_train=c too
///
/// - x_train, x_test: uint8 ('|u1', pixels 0..255) or float32 ('<f4' or '>f4', finite
///   features), shape (N, ...) of rank 2 to 8, the same dtype and the same shape per example in
///   both, at least one training example (the test split may be empty); they become
///   dataset.images with that shape (f32 in host byte order).
/// - y_train, y_test: 1-D integers ('|u1', '|i1', '<i2', '<u2', '<i4', '<u4', '<i8', '<u8' or
///   their big-endian '>' forms; one-byte types also as '<u1', '>i1', ... as some writers spell
///   them), one per row of x, in 0..255; they become u8 labels.
/// - client_train: optional, 1-D integers (the same dtypes), one per training example, in
///   0..2^32-1; it becomes u32 client_train.
///
/// classes is the largest label of both splits plus one (at least 2); mean and stddev are the
/// training pixels' pixel_statistics for u8 (a stddev of 0, all pixels equal, becomes 1), 0 and
/// 1 for f32. Other entries of the archive are ignored.
///
/// Throws std::runtime_error "load_npz: <path>: <entry>: <problem>" for a missing file or
/// array, a file that is no zip archive, an encrypted entry or one compressed other than
/// stored or deflated, a .npy header that is malformed or lies about its size, fortran_order
/// True, a dtype other than those above (object and structured arrays included), shapes that
/// disagree, a label or client index out of range, all labels 0, non-finite features, truncated
/// data, trailing bytes after the data, or corrupted entry data (libzip checks each entry's
/// CRC-32). No allocation exceeds what the archive can hold.
labelled_data load_npz(const std::string& path);

/// Loads MNIST-style IDX files from `dir`: train-images-idx3-ubyte, train-labels-idx1-ubyte,
/// t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each plain or gzip'd (the name with .gz;
/// the plain file is taken when both exist). Images are u8 or f32 [N, ...] of rank 2 to 8 (f32
/// finite), the same dtype and shape per example in both splits, at least one training
/// example; labels are u8 or i32 [N], in 0..255 (i32 labels become u8). classes is the largest label plus one (at least 2); mean and stddev
/// as for load_npz. Throws std::runtime_error naming the file and what is wrong (see read_idx
/// for the file errors).
labelled_data load_idx_dir(const std::string& dir);

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
