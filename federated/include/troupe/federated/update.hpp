#pragma once
/// @file
/// The hook points of a federated round, where the mechanisms that change what travels plug in:
///
///   client:  trained model - global model = delta
///            -> update_transform chain, in order (clipping + noise, compression with an
///               error-feedback residual, masking...), each on the client's own update
///   server:  aggregator.begin(round) -> aggregator.add(...) once per update, in the round's
///            sample order -> aggregator.finish() = the aggregate the strategy applies
///            -> every transform's end_round (metrics such as epsilon)
///
/// Interfaces only; the engine (simulation.hpp) calls them, and the weighted mean (FedAvg) is
/// the default aggregator.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/federated/rng.hpp"

namespace troupe::federated {

/// What everybody may know about a round.
struct round_info {
  int round = 0;                 ///< 1-based
  std::size_t dim = 0;           ///< floats per update
  std::size_t population = 0;    ///< clients in the simulation
  /// The sampled clients, in the order their updates are added (a client that drops out is
  /// skipped, the others keep this order).
  std::span<const std::uint64_t> participants;
  std::uint64_t seed = 0;        ///< this round's seed, for server-side draws
  /// The global model the round's clients start from (model floats), for rules that compare
  /// updates with it (AlignIns); empty where the engine gives none (FedBuff's steps).
  std::span<const float> global;
};

/// What one client sends back at the end of a round.
struct client_update {
  std::uint64_t client = 0;
  double weight = 0;           ///< aggregation weight (FedAvg: the client's number of examples)
  std::int64_t samples = 0;    ///< examples trained on in this round
  double loss = 0;             ///< mean training loss of the round
  std::vector<float> delta;    ///< trained - global (round_info::dim floats), unless encoded
  /// An encoded form of the update (masked integers under secure aggregation, a compressed
  /// payload...). When not empty, delta is empty and the aggregator's add_encoded receives it.
  /// Transforms receive it empty, possibly with capacity from an earlier round to reuse.
  std::vector<std::uint32_t> words;
  /// Bytes the update takes on the wire when a transform encodes it more tightly than it is held
  /// here (a compressed update the transform decodes again); 0: 4 per float of delta or word of
  /// words.
  std::uint64_t wire_bytes = 0;
  /// Set by the engine on the client's thread: delta holds NaN or an infinity (the client
  /// diverged), and the run ends with its name instead of aggregating it.
  bool diverged = false;
  /// The client's drift detector alarmed on its errors this round (simulation_options::
  /// drift_detect).
  bool drift_alarm = false;
};

/// A client-side step applied to the update before it leaves the client.
///
/// Thread contract: apply() runs on worker threads, for different clients at the same time:
/// it must not change the transform's members (it is const); per-client state lives in the
/// `state` span the engine keeps for each client. end_round() runs on the server's thread.
class update_transform {
public:
  virtual ~update_transform() = default;
  /// "dp-gaussian", "topk"... (for messages).
  virtual std::string name() const = 0;
  /// Floats of persistent state each client keeps for this transform between rounds (an
  /// error-feedback residual: dim); 0 (the default) when none. Allocated, zero-filled, on the
  /// client's first round only when non-zero.
  virtual std::size_t client_state_floats(std::size_t /*dim*/) const { return 0; }
  /// Changes `u` in place. `state` is this client's slice (client_state_floats floats);
  /// `rng` is seeded for (client, round, transform) and drawn from by this call only.
  virtual void apply(client_update& u, std::span<float> state, const round_info& round,
                     splitmix64& rng) const = 0;
  /// Server side, after the round's aggregate: metrics to report with the round, as
  /// (name, value) pairs, e.g. ("epsilon", 1.7) under differential privacy.
  virtual void end_round(const round_info& /*round*/,
                         std::vector<std::pair<std::string, double>>& /*metrics*/) {}
  /// Server-side state carried from round to round (a privacy accountant, an adaptive bound),
  /// for checkpoints; empty (the default) when none. Per-client state lives in `state` above.
  virtual std::vector<double> save_state() const { return {}; }
  /// Restores what save_state returned. Throws std::invalid_argument, changing nothing, for what
  /// check_state refuses.
  virtual void load_state(std::span<const double> state);
  /// Throws std::invalid_argument when `state` is not what save_state could have written (the
  /// wrong shape, a value out of range); changes nothing. The default accepts only no state.
  virtual void check_state(std::span<const double> state) const;
};

/// Combines the updates of a round into one vector.
///
/// Thread contract: called from one thread, in the order begin, add* (in the round's
/// participant order, which makes the result independent of thread timing), finish.
/// A streaming aggregator (the weighted mean) keeps O(dim) memory; robust ones may buffer.
/// Thrown by an aggregator's begin() or finish() when its round cannot be completed (secure
/// aggregation with fewer than two clients, or too few left to unmask the sum): the simulation
/// leaves the model as it was, reports the round as aborted, and goes on with the next one, as
/// a deployment would.
struct round_aborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class aggregator {
public:
  virtual ~aggregator() = default;
  virtual std::string name() const = 0;
  /// Starts a round; forgets the previous one.
  virtual void begin(const round_info& round) = 0;
  /// One client's update (dim floats) and its weight (>= 0).
  virtual void add(std::uint64_t client, double weight, std::span<const float> delta) = 0;
  /// An encoded update (client_update::words). The default throws std::logic_error: only
  /// aggregators that know the encoding accept it.
  virtual void add_encoded(std::uint64_t client, double weight, std::span<const std::uint32_t> words);
  /// The aggregate, dim floats. Throws std::logic_error when nothing was added, round_aborted
  /// when the round cannot be completed.
  virtual std::vector<float> finish() = 0;
  /// The clients of the round (since begin) whose update this aggregator refused and left out
  /// of the aggregate (a zero-knowledge proof that failed); the default refuses none.
  virtual std::vector<std::uint64_t> rejected() const { return {}; }
};

/// sum(weight * delta) / sum(weight), accumulated in double in the order of add(): FedAvg's
/// aggregate. Holds one double per coordinate. A round whose weights sum to zero gives the
/// plain mean. Throws std::invalid_argument for a weight that is negative or not finite, an
/// update holding NaN or an infinity, and weights or weighted sums that overflow a double.
std::unique_ptr<aggregator> make_weighted_mean();

}  // namespace troupe::federated
