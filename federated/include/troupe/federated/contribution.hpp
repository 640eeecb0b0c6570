#pragma once
/// @file
/// Client contributions: Shapley values of the clients whose updates a round aggregates, and a
/// budget paid out from them every round (what `troupe fedsim --contribution` and
/// `--reward-budget` install).
///
/// A round is a cooperative game. Its players are the round's K participants, in aggregation
/// order; the utility of a coalition S is the validation accuracy of global + (the weighted mean
/// of S's deltas, with FedAvg's weights) minus the validation accuracy of global, so U(∅) = 0 and
/// U(all) is the accuracy FedAvg's step gained. Client i's Shapley value is
///
///   φ_i = Σ_{S ⊆ N∖{i}} |S|! (K − |S| − 1)! / K! · (U(S ∪ {i}) − U(S))
///
/// the mean of its marginal contribution U(pre(i) ∪ {i}) − U(pre(i)) over the K! orders.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace troupe::federated {

/// A coalition of a round's participants: bit i % 64 of word i / 64 is set when participant i
/// (in aggregation order) belongs to it. Always ceil(K / 64) words (one for K = 0).
using coalition = std::vector<std::uint64_t>;
/// The utility of a coalition; the estimators never ask for the empty one (its utility is 0).
using coalition_utility = std::function<double(const coalition&)>;

/// How a round's values are found (`--contribution`).
struct contribution_method {
  enum class kind { exact, monte_carlo, gtg };
  kind type = kind::exact;
  std::size_t permutations = 0;  ///< mc:P
  double epsilon = 0;            ///< gtg:EPS
};

/// "exact", "mc:P" (P from 1 to 100000) or "gtg:EPS" (EPS in [0, 1)). Throws
/// std::invalid_argument, naming the spec, for anything else.
contribution_method parse_contribution(const std::string& spec);
/// The spelling parse_contribution reads ("exact", "mc:20", "gtg:0.01").
std::string describe(const contribution_method& method);

/// The most players `exact` enumerates (2^12 coalitions).
inline constexpr std::size_t max_exact_players = 12;

struct shapley_estimate {
  std::vector<double> values;    ///< one per player
  std::size_t evaluations = 0;   ///< distinct coalitions whose utility was computed (cached)
  std::size_t permutations = 0;  ///< orders walked (mc, gtg)
  bool skipped = false;          ///< gtg: the round's gain was below EPS; every value is 0
  double total = 0;              ///< U(all players)
};

/// Every coalition's utility, then φ by its definition. Throws std::invalid_argument for more
/// than max_exact_players players.
shapley_estimate exact_shapley(std::size_t players, const coalition_utility& u);

/// One order's marginal contributions, untruncated: out[order[j]] = U(order[0..j]) −
/// U(order[0..j-1]). They sum to U(all) − U(∅) for every order.
std::vector<double> permutation_marginals(std::span<const std::size_t> order, const coalition_utility& u);

/// Monte Carlo over `permutations` uniform orders drawn from `seed`: the mean of their marginal
/// contributions (Castro et al., 2009). Efficient for any number of orders.
shapley_estimate monte_carlo_shapley(std::size_t players, std::size_t permutations, std::uint64_t seed,
                                     const coalition_utility& u);

/// GTG-Shapley (Liu et al., 2022); see contribution.cpp for exactly what is implemented.
shapley_estimate gtg_shapley(std::size_t players, double epsilon, std::uint64_t seed, const coalition_utility& u);

/// The estimator `method` names.
shapley_estimate estimate_shapley(const contribution_method& method, std::size_t players, std::uint64_t seed,
                                  const coalition_utility& u);

// ---- rewards -------------------------------------------------------------------------------------

/// Rewards are paid in integer micro-units (1e-6 of a unit of the budget).
inline constexpr std::int64_t micro_units = 1'000'000;
/// The largest budget per round (1e12 units: 1e18 micro-units fit an int64).
inline constexpr double max_reward_budget = 1e12;

struct reward_budget {
  double budget = 0;          ///< B per round, > 0
  double floor_fraction = 0;  ///< every participant gets at least min(floor_fraction * B, B / n)
};

/// "B" or "B:FLOOR_FRACTION" (B in (0, 1e12], FLOOR_FRACTION in [0, 1]; default 0). Throws
/// std::invalid_argument naming the spec.
reward_budget parse_reward_budget(const std::string& spec);

/// One round's payout for n participants with Shapley values `values`, in micro-units: each gets
/// the floor min(floor_fraction B, B / n) (rounded down to a micro-unit), and the rest R of B is
/// shared in proportion to max(0, φ_i) by largest remainders (exact integer arithmetic; ties in
/// the remainder go to the larger value, then to the earlier participant). When no value is
/// positive the rest is shared equally. The rewards sum to exactly llround(B · 1e6), are >= 0,
/// and a larger value never gets less. Throws std::invalid_argument for no participants or a
/// value that is NaN.
std::vector<std::int64_t> budget_rewards(std::span<const double> values, const reward_budget& budget);

// ---- the server-side observer --------------------------------------------------------------------

/// What one client collected over the run.
struct client_contribution {
  std::uint64_t client = 0;
  std::size_t rounds = 0;      ///< rounds it took part in (valued or skipped)
  double value = 0;            ///< the sum of its per-round Shapley values
  std::int64_t reward = 0;     ///< the sum of its rewards, micro-units
};

/// Values every round's participants (`--contribution`): it keeps a copy of each update the
/// round aggregates (observe), and at the end of the round (finish) estimates the Shapley values
/// with `method`, caching each coalition's utility within the round, adds them to the clients'
/// totals and, with a budget, pays the round's rewards. Not thread-safe: the server's thread.
class contribution_tracker {
public:
  /// `accuracy` is the validation accuracy of a model of `dim` floats. A coalition's model is
  /// the starting model plus the weighted mean of its members' updates (FedAvg on the coalition
  /// alone), or with `share` plus its members' share of the round's FedAvg sum, sum over S of
  /// w_i delta_i / (sum of the round's weights): a client that sends no change then adds nothing
  /// to any coalition (a null player, value 0). Either way all participants together make
  /// FedAvg's next model.
  contribution_tracker(contribution_method method, std::size_t dim, std::function<double(std::span<const float>)> accuracy,
                       std::uint64_t seed, const reward_budget* budget = nullptr, bool share = false);

  /// Starts round `round` (1-based); forgets the previous round's updates.
  void begin(int round);
  /// One participant's update (its first dim floats are the model's delta) and FedAvg weight.
  void observe(std::uint64_t client, double weight, std::span<const float> delta);
  /// Values the round's participants; `global` is the model the round started from. A round
  /// without updates values nobody and pays nothing.
  void finish(std::span<const float> global);

  /// Every client that took part, in ascending id.
  std::vector<client_contribution> totals() const;
  /// The last round's participants and values (aggregation order).
  const std::vector<std::uint64_t>& last_participants() const noexcept { return clients_; }
  const shapley_estimate& last_estimate() const noexcept { return last_; }
  /// The last round's utility of all participants together (the accuracy FedAvg's step gained).
  double last_gain() const noexcept { return last_gain_; }

  const contribution_method& method() const noexcept { return method_; }
  bool pays() const noexcept { return pays_; }
  std::size_t rounds_valued() const noexcept { return rounds_valued_; }   ///< rounds with participants
  std::size_t rounds_skipped() const noexcept { return rounds_skipped_; } ///< gtg's between-round skips
  std::size_t evaluations() const noexcept { return evaluations_; }       ///< model evaluations, base included
  double seconds() const noexcept { return seconds_; }                    ///< wall time in finish()
  std::int64_t rewards_paid() const noexcept { return paid_; }            ///< micro-units

  /// Writes totals() as CSV: "client,rounds,shapley,reward,malicious" (reward in units, six
  /// decimals; malicious 1 where `malicious` says so). Throws std::runtime_error naming the file
  /// when it cannot be written.
  void write_csv(const std::string& file, const std::function<bool(std::uint64_t)>& malicious) const;

private:
  contribution_method method_;
  std::size_t dim_;
  std::function<double(std::span<const float>)> accuracy_;
  std::uint64_t seed_;
  bool pays_ = false;
  bool share_ = false;
  reward_budget budget_;
  int round_ = 0;
  std::vector<std::uint64_t> clients_;
  std::vector<double> weights_;
  std::vector<float> deltas_;  // K x dim
  std::vector<float> model_;
  std::vector<double> sum_;
  shapley_estimate last_;
  double last_gain_ = 0;
  std::map<std::uint64_t, client_contribution> totals_;
  std::size_t rounds_valued_ = 0, rounds_skipped_ = 0, evaluations_ = 0;
  double seconds_ = 0;
  std::int64_t paid_ = 0;
};

}  // namespace troupe::federated
