#pragma once
/// @file
/// Concept-drift detectors, each a plain class fed one observation at a time, and the label swap
/// that `troupe fedsim --drift` injects (src/drift.cpp, src/drift_swap.cpp).
///
/// - ddm: the Drift Detection Method of Gama, Medas, Castillo and Rodrigues (SBIA 2004) on a
///   stream of 0/1 errors. After observation i, p_i is the error rate since the last reset and
///   s_i = sqrt(p_i (1 - p_i) / i); from `min_observations` on, (p_min, s_min) is the (p_i, s_i)
///   at which p_i + s_i was lowest. After more than `min_observations`, p_i + s_i > p_min + 2 s_min
///   is the warning level and p_i + s_i > p_min + 3 s_min the drift level, at which the detector
///   alarms and resets (as MOA's DDM.java: strict inequalities, no test at the observation that
///   first sets the minimum).
/// - adwin: ADWIN2 of Bifet and Gavaldà (SDM 2007) on a stream of values in [0, 1]: a window
///   kept as an exponential histogram (at most `buckets_per_level` buckets of 2^k observations
///   per level k), cut while some split into an older part W0 and a newer part W1 (at a bucket
///   boundary) has |mean(W0) - mean(W1)| >= eps_cut, where
///   eps_cut = sqrt(ln(4 / delta') / (2 m)), m = 1 / (1 / n0 + 1 / n1) (the harmonic mean of
///   the parts' lengths, halved) and delta' = delta / n (n: the window's length). Dropping
///   the oldest bucket while a cut holds. Its guarantee (Theorem 3.1): on a stationary stream
///   the window shrinks at a given step with probability at most delta.
///   adwin_reference is the same test on every raw observation (every split, not only bucket
///   boundaries; O(W) memory and time per step), the plain definition that tests hold the
///   bucketed form to.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace troupe::federated {

/// What a detector says about one observation.
enum class drift_signal { none, warning, drift };

/// DDM (Gama et al., 2004). Not thread-safe; 40 bytes.
class ddm {
public:
  struct options {
    std::int64_t min_observations = 30;  ///< p_min from this many on, signals only after
    double warning_level = 2;            ///< in s_min above p_min
    double drift_level = 3;
  };
  ddm() = default;
  /// Throws std::invalid_argument for min_observations < 1 or levels not 0 < warning <= drift.
  explicit ddm(options o);
  /// One observation: true for an error. At the drift level the detector resets itself.
  drift_signal observe(bool error);
  void reset();
  std::int64_t observations() const noexcept { return n_; }
  double error_rate() const noexcept { return n_ ? static_cast<double>(errors_) / static_cast<double>(n_) : 0.0; }

private:
  options o_;
  std::int64_t n_ = 0, errors_ = 0;
  double p_min_ = 0, s_min_ = 0;
  bool have_min_ = false;
};

/// Which way the mean went at ADWIN's cut (the newer part against the older).
enum class adwin_change { none, rise, fall };

/// ADWIN2 (Bifet and Gavaldà, 2007) with exponential-histogram buckets. Not thread-safe;
/// memory O(buckets_per_level * log(W)).
class adwin {
public:
  /// Throws std::invalid_argument for delta outside (0, 1) or buckets_per_level < 2.
  explicit adwin(double delta = 0.002, int buckets_per_level = 5);
  /// Adds x (in [0, 1]; std::invalid_argument otherwise) and cuts the window while the test
  /// holds. Returns the change at the first cut (none: the window did not shrink).
  adwin_change observe(double x);
  void reset();
  std::int64_t width() const noexcept { return width_; }
  double sum() const noexcept { return sum_; }
  double mean() const noexcept { return width_ ? sum_ / static_cast<double>(width_) : 0.0; }
  double delta() const noexcept { return delta_; }
  /// Buckets held (for memory accounting and the tests).
  std::size_t buckets() const noexcept;
  /// The bucket lengths from the oldest to the newest (each a power of two).
  std::vector<std::int64_t> bucket_lengths() const;

  /// eps_cut for parts of n0 and n1 observations in a window of n0 + n1 under `delta`.
  static double cut_threshold(double n0, double n1, double delta);

private:
  struct bucket {
    double sum;
  };
  void compress();
  /// The first split (oldest first) whose means differ by eps_cut or more; returns the change.
  adwin_change find_cut() const;
  void drop_oldest();

  double delta_;
  int per_level_;
  // levels_[k]: buckets of 2^k observations, oldest first; higher levels are older.
  std::vector<std::deque<bucket>> levels_;
  std::int64_t width_ = 0;
  double sum_ = 0;
};

/// ADWIN's test on every split of a window of raw observations: the plain reference for adwin.
class adwin_reference {
public:
  explicit adwin_reference(double delta = 0.002);
  /// Adds x, then drops the oldest observation while some split's means differ by eps_cut.
  adwin_change observe(double x);
  /// Adds x without testing (to follow another window).
  void push(double x) { window_.push_back(x); }
  /// Drops the `n` oldest observations (to follow another window's cuts).
  void drop(std::int64_t n);
  /// Whether ADWIN's test holds for the split after the `n0` oldest observations.
  bool cut_holds(std::int64_t n0) const;
  std::int64_t width() const noexcept { return static_cast<std::int64_t>(window_.size()); }
  double sum() const;

private:
  double delta_;
  std::deque<double> window_;
};

/// A detector of either kind behind one face, as the simulation's clients hold one: "ddm" or
/// "adwin" (delta 0.002). An alarm is DDM's drift level or an ADWIN cut at which the error rate
/// rose (a falling error rate, as the global model learns, is no alarm).
class error_detector {
public:
  /// Throws std::invalid_argument for another name.
  explicit error_detector(const std::string& kind);
  /// One 0/1 error; true on an alarm.
  bool observe(bool error);
  void reset();
  /// Bytes the detector holds (for the simulation's client-state figures).
  std::size_t bytes() const noexcept;

private:
  bool is_ddm_;
  ddm ddm_;
  adwin adwin_;
};

// ---- the injected drift ---------------------------------------------------------------------

/// `--drift swap:ROUND:FRACTION:A-B`: from round ROUND (1-based) on, the clients of a seeded
/// FRACTION of the population train and are evaluated on their data with labels A and B swapped.
struct drift_swap {
  int round = 0;
  double fraction = 0;
  int a = 0, b = 0;
};

/// Parses the spec. Throws std::invalid_argument naming what is wrong.
drift_swap parse_drift(const std::string& spec);

/// The drifted clients: exactly round(fraction * clients) of them, chosen uniformly by `seed`
/// (one flag per client).
std::vector<char> drifted_clients(const drift_swap& d, std::size_t clients, std::uint64_t seed);

}  // namespace troupe::federated
