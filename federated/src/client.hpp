#pragma once
// The client actor: a range of the shared index array, a generator and, only once its
// algorithm needs it, persistent state (SCAFFOLD's c_i, the transforms' residuals). Nothing
// else while idle: the model it trains is the worker thread's copy (engine_state::worker).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "troupe/federated/drift.hpp"

namespace troupe::federated::detail {

/// Trains one round's job for the simulation; called only through its actor_ref.
class client {
public:
  client(std::uint32_t offset, std::uint32_t length, std::uint64_t seed) : offset_(offset), length_(length), rng_{seed} {}

  /// Trains from ctx's global model and returns the update (after the transforms).
  client_update train(const std::shared_ptr<const round_context>& ctx, std::uint64_t id);

  /// The round this client trained in is over: kept (`applied`), or given up by the server, and
  /// then the client is as it was before (generator and persistent state: a SCAFFOLD control
  /// variate or a top-k residual must not move on without the server's).
  void settle(const std::shared_ptr<const round_context>& ctx, bool applied);

  /// What a checkpoint keeps of a client.
  struct saved {
    std::uint64_t rng = 0;
    std::vector<float> state;           ///< empty when not allocated yet
    std::vector<std::byte> optimizer;   ///< empty when it has none yet
  };
  saved save(std::size_t floats) const;
  /// Replaces the client's generator and state; returns the change in held state bytes and in
  /// clients holding state (engine_state::state_bytes, state_holders).
  std::pair<std::ptrdiff_t, std::ptrdiff_t> restore(saved s, std::size_t floats);

private:
  bool holds_state() const noexcept { return state_ || !optimizer_.empty() || detector_; }
  /// Feeds the errors of the model it was sent on its shard to its detector; true on an alarm.
  bool detect(engine_state& e, worker_slot& w, const local_job& job);
  /// --drift-response reset: the detector, the optimizer's state and the algorithm's start afresh.
  void reset_state(engine_state& e);

  std::uint32_t offset_, length_;
  splitmix64 rng_;
  std::unique_ptr<float[]> state_;   // the algorithm's (SCAFFOLD's c_i, the transforms')
  std::vector<std::byte> optimizer_; // its optimizer's, when the options give it one
  std::unique_ptr<error_detector> detector_;  // under --drift-detect, made on its first round
  std::size_t detector_bytes_ = 0;   // counted in engine_state::state_bytes
  struct undo {
    std::uint64_t rng;
    std::unique_ptr<float[]> state;  // null: there was none
    std::vector<std::byte> optimizer;
  };
  std::unique_ptr<undo> undo_;  // while a round's outcome is pending (round_context::provisional)
};

}  // namespace troupe::federated::detail
