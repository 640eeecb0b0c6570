#pragma once
// The simulation's state behind its public object: the engine's shared state, the global
// model, the clients' actors and FedBuff's clients in flight. The synchronous rounds are in
// simulation.cpp, FedBuff's asynchronous steps in async.cpp, checkpoints in checkpoint.cpp.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "client.hpp"
#include "drift_cluster.hpp"
#include "engine.hpp"
#include "troupe/actors/actor_system.hpp"

namespace troupe::federated {

struct simulation::impl {
  detail::engine_state engine;
  std::unique_ptr<local_trainer> server_trainer;  // evaluations
  std::unique_ptr<aggregator> agg = make_weighted_mean();
  std::shared_ptr<const std::vector<float>> global;
  std::size_t sample_size = 0;  // sampled per round
  std::size_t keep = 0;         // of those, kept at most (per-round)
  std::size_t window = 0;
  int rounds = 0;
  double clock = 0;             // simulated seconds so far
  std::unique_ptr<contribution_tracker> contributions;  // --contribution
  std::vector<char> excluded;   // per client: never sampled (empty: none is)
  // Concept drift: the drifted clients (--drift; empty without), the round they drift at, and
  // the second model of --drift-response cluster.
  std::vector<char> drifted;
  int drift_round = 0;
  detail::drift_cluster cluster;
  // --continual: the state the trainers share (the tasks, the consolidated Fisher or bases).
  std::shared_ptr<detail::continual_state> continual;

  // FedBuff: the clients in flight, each with the simulated time its update arrives.
  struct in_flight {
    double arrival = 0;         // of its update, or when its failure frees the slot
    std::uint64_t dispatch = 0, client = 0;
    std::int64_t version = 0;   // of the model it trains from
    bool failed = false;        // the fault model dropped it: it trains nothing, no update comes
    future<client_update> reply;
    std::optional<client_update> done;  // the reply, once taken before its arrival (checkpoints)

    client_update take() {
      if (!done) return reply.get();
      client_update u = std::move(*done);
      done.reset();
      return u;
    }
  };
  std::size_t buffer = 0;       // K; 0: synchronous rounds
  std::int64_t version = 0;     // server updates so far
  std::uint64_t dispatched = 0;
  std::vector<in_flight> flight;
  std::vector<char> busy;       // per client: in flight (or, when holding, in the buffer)
  bool started = false;         // the first clients have left
  /// Differential privacy: a client whose update waits in the buffer is not sent out again
  /// before the server step, so that a step holds at most one update per client.
  bool hold = false;
  /// set_aggregator was called: FedBuff's steps go through that aggregator (robust rules, DP).
  bool custom_aggregator = false;

  /// Sends an idle client (a seeded uniform choice) to train from the current model. Under the
  /// fault model it may fail instead: it trains nothing and holds its slot until its update
  /// would have arrived (the server cannot tell it from a slow client before then).
  void dispatch();

  /// One FedBuff server update: the next K arrivals, in simulated time. With the default
  /// aggregator the step is FedBuff's sum(staleness_weight(s) * delta) / K, accumulated in
  /// double; an aggregator set by set_aggregator (a robust rule, DP's noised sum) receives the K
  /// updates, each scaled by its staleness weight, at the K-th arrival.
  round_report async_round(int round);

  /// Takes the replies of every client in flight, so that a checkpoint can hold them.
  void settle_flight();

  // Declared last: stopped (its workers joined) before the state the clients read goes.
  std::unique_ptr<actor_system> system;
  std::vector<actor_ref<detail::client>> clients;
};

}  // namespace troupe::federated
