#pragma once
/// @file
/// Pipeline schedules as data. A schedule is, per rank, an ordered list of actions on
/// (stage, microbatch): F (forward), B (full backward), I (backward for inputs), W (backward for
/// weights), the point-to-point SEND_F/RECV_F/SEND_B/RECV_B that lowering inserts, and RECOMPUTE
/// for activation checkpointing. A missing action (std::nullopt) is a deliberate idle step.
///
/// Text form as in PyTorch's torch.distributed.pipelining: `2F0` is stage 2, forward,
/// microbatch 0; `1SEND_F2` sends stage 1's output for microbatch 2. The CSV form is PyTorch's
/// too: one row per rank, one action per cell, an empty cell for an idle step.
///
/// Stages are numbered globally 0..S-1 in model order; a placement maps them to ranks.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/pipeline/rational.hpp"

namespace troupe::pipeline {

/// What an action does.
enum class op : std::uint8_t { F, B, I, W, send_f, recv_f, send_b, recv_b, recompute };

/// One step of one rank.
struct action {
  int stage = 0;
  op kind = op::F;
  int microbatch = 0;
  /// Runs together with the rank's next action, as one overlapped step (PyTorch's
  /// OVERLAP_F_B: a forward of one stage and a backward of another, written `(0F7;7B3)OVERLAP_F_B`).
  bool overlapped = false;
  friend bool operator==(const action&, const action&) = default;
};

/// `2F0`, `1SEND_B3`, `0RECOMPUTE1` (the overlap mark is not part of an action's text).
std::string to_string(const action& a);
std::string to_string(op k);
/// Parses the text form; throws std::invalid_argument naming the text on error.
action parse_action(std::string_view text);

/// True for F, B, I, W, RECOMPUTE (work that takes compute time on the rank).
constexpr bool is_compute(op k) noexcept {
  return k == op::F || k == op::B || k == op::I || k == op::W || k == op::recompute;
}

/// How stages map to ranks.
enum class placement_kind : std::uint8_t {
  looped,  ///< rank r holds stages r, r+p, r+2p, ... (one stage per rank when v = 1)
  v_shape  ///< v = 2: rank r holds stages r and 2p-1-r (ZB-V)
};

struct placement {
  int ranks = 1;            ///< p
  int stages_per_rank = 1;  ///< v
  placement_kind kind = placement_kind::looped;

  int stages() const noexcept { return ranks * stages_per_rank; }
  /// The rank that holds `stage`.
  int rank_of(int stage) const noexcept;
  /// The stages a rank holds, in model order.
  std::vector<int> stages_of(int rank) const;
  /// Which of its rank's stages (0..v-1, in model order) `stage` is.
  int chunk_of(int stage) const noexcept;
};

/// A schedule: the data every other part (validator, simulator, pictures, runtime) reads.
/// The most (stage, microbatch) cells a schedule may have (stages x microbatches, with v stages
/// per rank counted v times): larger ones are refused by the generators and the simulator instead
/// of taking gigabytes (a cell costs about 600 bytes through simulation).
constexpr std::int64_t max_schedule_cells = 1'000'000;

struct schedule {
  std::string name;
  placement place;
  int microbatches = 1;
  /// Per rank, the actions in order; nullopt is a deliberate idle step.
  std::vector<std::vector<std::optional<action>>> ranks;
  /// Per stage, the share of a microbatch's activations kept from F to the backward under
  /// activation checkpointing (1 for all, the default when empty); RECOMPUTE restores the rest.
  std::vector<rational> activation_kept;

  int stages() const noexcept { return place.stages(); }
  /// True when backward passes are split into I and W.
  bool split_backward() const noexcept;
  /// True when the send/receive actions are present (see lower()).
  bool lowered() const noexcept;
};

/// The rows of PyTorch's CSV format (one per rank, comma-separated, empty cell = idle).
std::string to_csv(const schedule& s);
/// Reads PyTorch's CSV format. The placement (looped or V) and the microbatch count are
/// inferred from the actions; a schedule whose stages cannot be placed is an error.
schedule from_csv(std::string_view text, std::string name = "csv");

/// One line per rank: `rank 0: 0F0 0F1 - 0B0 ...` (`-` for an idle step).
std::string to_text(const schedule& s);

/// Activation checkpointing of a stage's layers.
struct checkpoint_policy {
  enum class kind : std::uint8_t { none, every_n, sqrt } mode = kind::none;
  int every = 1;  ///< for every_n: keep the input of every n-th layer
  /// Parses "none", "every:N" or "sqrt"; throws std::invalid_argument otherwise.
  static checkpoint_policy parse(std::string_view text);
  /// The share of a stage's activations kept between F and its backward, for a stage of
  /// `layers` layers: every_n keeps ceil(L/n) layer inputs of L, sqrt keeps ceil(sqrt(L)).
  rational kept(int layers) const;
};

/// Applies `policy` to every stage (each of `layers_per_stage` layers): records the kept share
/// and inserts RECOMPUTE(s, j) right before each backward (B or I) of a checkpointed stage.
/// A stage that keeps everything is left alone. Throws on a lowered schedule (apply it first).
schedule with_checkpointing(const schedule& s, const checkpoint_policy& policy, int layers_per_stage);

/// Inserts SEND_F/RECV_F after/before forwards whose neighbour stage lives on another rank,
/// and SEND_B/RECV_B for backward (B or I) likewise. Receives go right before the action that
/// needs them; sends right after the action that produced the data. Idempotent on a lowered
/// schedule.
schedule lower(const schedule& s);

}  // namespace troupe::pipeline
