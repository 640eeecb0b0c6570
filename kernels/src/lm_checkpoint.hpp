#pragma once
// The manifest of a language model's sharded checkpoint (lm.hpp, train_lm): what train_lm
// writes beside the ranks' shards, and the checks a resumed run passes before it loads them.

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/kernels/checkpoint.hpp"
#include "troupe/kernels/lm.hpp"

namespace troupe::kernels::detail {

/// Everything a checkpoint holds besides its shards.
struct lm_manifest {
  std::string options;  ///< "name=value" lines a resumed run must match (lm_fingerprint)
  int ranks = 0;
  shard_layout layout;
  std::int64_t step = 0;
  std::int64_t skipped_steps = 0;
  double loss_sum = 0;     ///< the training losses since the last evaluation
  std::int64_t losses = 0;
  std::string data_rng;    ///< the training batches' generator (std::mt19937_64's text form)
  std::string slot;        ///< "a" or "b": the shards' names
  std::vector<shard_info> shards;  ///< per rank
};

/// The options and corpus a checkpoint must be resumed with, one "name=value" a line.
std::string lm_fingerprint(const lm_options& o, const text_corpus& corpus);

/// The manifest's file in checkpoint directory `dir`.
std::string manifest_path(const std::string& dir);

/// Replaces `dir`/manifest atomically. Throws std::runtime_error naming the file.
void write_manifest(const std::string& dir, const lm_manifest& m);

/// Reads `dir`/manifest; throws std::runtime_error naming the file and what is wrong (missing,
/// corrupted, truncated, of another format).
lm_manifest read_manifest(const std::string& dir);

/// Throws std::invalid_argument saying what differs (the first option, the rank count, the
/// placement of stages, the cut) when a run of `options` laid out as `layout` cannot go on from
/// `m` (read from `dir`).
void check_resumable(const lm_manifest& m, const std::string& options, const shard_layout& layout, const std::string& dir);

}  // namespace troupe::kernels::detail
