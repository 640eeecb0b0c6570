#pragma once
/// @file
/// Federated unlearning: removing some clients' contribution from a model trained with them
/// (`troupe fedsim --unlearn attackers|ID,ID,... --unlearn-at R --unlearn-method ...`).
/// run_simulation trains R rounds with every client, then:
///
///   retrain   starts again from round 1 with the removed clients excluded
///             (simulation_options::excluded: in the population, their seeded draws unchanged,
///             never sampled) and trains to --rounds: bit-identical to a run that excluded them
///             from the start. Its cost: R rounds to come back to round R.
///   pga[:K]   projected gradient ascent (Halimi et al., "Federated Unlearning: How to Efficiently
///             Erase a Client in FL?", 2022). The reference model w_ref is the mean of the other
///             clients' models: one round of the remaining clients from the trained model,
///             aggregated by the run's strategy. The removed clients then ascend their own
///             training loss (one local epoch each, in turn, the run's batch and learning rate)
///             from w_ref, every step projected back onto the L2 ball of radius
///             δ = ‖w_ref − w_0‖ / √3 around w_ref (pga_radius; w_0: the run's initial model, the
///             authors' code measures to random models and bounds the squared distance by a
///             third of theirs). K FedAvg rounds of the remaining clients follow (5 by default).
///             Its cost: K + 2 rounds; the summary adds `pga_ascent_steps`, `pga_radius` and
///             `pga_distance` (‖w − w_ref‖ after the ascent, at most δ).
///   calibrate[:DT]  FedEraser (Liu et al., "FedEraser: Enabling Efficient Client-Level Data
///             Removal from Federated Learning Models", IWQoS 2021). While training, the server
///             stores every participant's update of rounds 1, 1 + DT, 1 + 2 DT, ... (DT 5 by
///             default). Unlearning replays those rounds from the initial model without the
///             removed clients: in each, the stored round's remaining participants train briefly
///             from the unlearned model (half their local work: ⌈|shard| · epochs / 2 / batch⌉
///             steps) and the server keeps each new direction with the stored update's length,
///             U = ‖U_old‖ · U_cal / ‖U_cal‖, and moves the model by their weighted mean (FedAvg's
///             weights). Its cost: one calibration round per stored round (⌈R / DT⌉);
///             `unlearn_storage_bytes` reports the stored updates' bytes (4 per float).
///
/// Training then goes on without them up to --rounds. The summary adds `unlearn_rounds`, the
/// accuracy and backdoor success before unlearning, and the loss-threshold membership inference
/// advantage (Yeom et al., 2018: the largest TPR − FPR over thresholds τ, a row called a member
/// when its loss is at most τ) of the final model on the removed clients' examples
/// (`mia_advantage_removed`), on the remaining clients' (`mia_advantage_retained`) and on
/// never-seen examples (`mia_advantage_unseen`), each against never-seen test examples (the
/// first half of the test set; the unseen ones are the second half).

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/simulation.hpp"

namespace troupe::federated {

struct unlearn_method {
  enum class kind { retrain, pga, calibrate } type = kind::retrain;
  int rounds = 5;    ///< pga: FedAvg rounds of the remaining clients after the ascent
  int interval = 5;  ///< calibrate: DT, the rounds between two stored rounds
};

/// "retrain", "pga[:K]" (K a whole number from 0 to 1000) or "calibrate[:DT]" (DT from 1 to
/// 1000000); throws std::invalid_argument otherwise.
unlearn_method parse_unlearn_method(const std::string& spec);

/// The clients `o.unlearn` names, ascending and distinct: "attackers" (those --attack makes
/// malicious) or "ID,ID,...". Throws std::invalid_argument for a malformed list, a client
/// outside the population, "attackers" without an attack or without any attacker, and a list
/// that removes every client.
std::vector<std::uint64_t> unlearn_clients(const simulation_options& o);

/// Throws std::invalid_argument, saying what to change, for unlearning options that cannot run
/// or cannot combine with the others (and for --unlearn-at or --unlearn-method without --unlearn).
void check_unlearn_options(const simulation_options& o);

/// PGA's projection radius: sqrt(‖reference − initial‖² / 3). Throws std::invalid_argument when
/// the lengths differ.
double pga_radius(std::span<const float> reference, std::span<const float> initial);

/// The loss-threshold attack's advantage: max over τ of (members with loss ≤ τ) / |members| −
/// (non-members with loss ≤ τ) / |non-members|, at least 0. Throws std::invalid_argument for an
/// empty set.
double membership_advantage(std::span<const double> member_losses, std::span<const double> nonmember_losses);

/// run_simulation's path when o.unlearn is set (see the file comment).
summary run_unlearning(const simulation_options& o, const std::function<void(const progress&)>& report);

}  // namespace troupe::federated
