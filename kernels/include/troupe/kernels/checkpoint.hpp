#pragma once
/// @file
/// Shards of a training checkpoint: each holder of part of a model (a pipeline rank, or the whole
/// model in one thread) writes its own file with its stages and the state of its optimizer; a
/// manifest (written by the training loop, lm.hpp) names every shard with its size and CRC-32.
///
/// A shard (little-endian, version 1): the magic "TRPS", a u32 version, a varint count of stages,
/// per stage its index in the model, its description (layer::describe), its parameters (name and
/// tensor in the wire codec) and its random state (layer::save_random_state), then the
/// optimizer's state (optimizer::save_state: the step count, each tensor's steps and moments in
/// their storage, fp32, bf16 or 8-bit codes with their scales), and finally the CRC-32 of
/// everything before it. Written atomically (troupe::write_file_atomically): a crash leaves the
/// old file or the new one.

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::kernels {

/// One shard as a manifest names it.
struct shard_info {
  std::string file;         ///< its name inside the checkpoint's directory
  std::uint32_t crc = 0;    ///< zlib's CRC-32 of the whole file
  std::uint64_t bytes = 0;  ///< its size
  bool operator==(const shard_info&) const = default;
};

/// One stage of a shard: its place in the model and its layers.
struct shard_stage {
  int index = 0;
  sequential* layers = nullptr;
};

/// How a training engine holds a model: which holder (rank) has each stage, and how many
/// parameter tensors each stage has (the cut). A checkpoint resumes only into the same layout.
struct shard_layout {
  std::vector<int> rank_of_stage;
  std::vector<std::size_t> stage_tensors;
};

/// The name of rank `rank`'s shard in the checkpoint slot `slot` ("a" or "b": a checkpoint is
/// written beside the last one, never over it): "rank0-a.shard".
std::string shard_name(int rank, const std::string& slot);

/// Writes `stages` and the state of `opt` (the optimizer over their parameters) to `path`.
/// Throws std::runtime_error naming the file when it cannot be written.
shard_info write_shard(const std::string& path, const std::vector<shard_stage>& stages, const optimizer& opt);

/// Reads the shard at `path` into `stages` and `opt`. The file must have the size and CRC-32 that
/// `expected` (the manifest) says, and hold exactly these stages with parameters of these names
/// and shapes, and state for `opt`'s tensors; otherwise std::runtime_error names the file and
/// what is wrong (missing, truncated, corrupted, another model or cut), and the values are not
/// touched (the optimizer is loaded last, after every other check, and checks all it reads
/// before it changes).
void read_shard(const std::string& path, const shard_info& expected, const std::vector<shard_stage>& stages,
                optimizer& opt);

}  // namespace troupe::kernels
