// Continual learning's rules: the task specs, the permutations and class splits, ACC and BWT,
// EWC's penalty, and GPM's summaries, merge and projection (continual.hpp).

#include "troupe/federated/continual.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "spec.hpp"
#include "troupe/federated/rng.hpp"
#include "troupe/kernels/svd.hpp"

namespace troupe::federated {

using detail::spec_number;
using detail::split_spec;

continual_tasks parse_continual(const std::string& spec) {
  const auto parts = split_spec(spec);
  const std::string usage = "--continual '" + spec + "': use permuted:T or split:T (T tasks, at least 2)";
  if (parts.size() != 2 || (parts[0] != "permuted" && parts[0] != "split")) throw std::invalid_argument(usage);
  const double t = spec_number(parts[1], "--continual '" + spec + "'");
  continual_tasks c;
  c.type = parts[0] == "permuted" ? continual_tasks::kind::permuted : continual_tasks::kind::split;
  const double most = c.type == continual_tasks::kind::permuted ? 1000 : 256;
  if (t != std::floor(t) || t < 2 || t > most)
    throw std::invalid_argument("--continual '" + spec + "': T must be a whole number from 2 to " +
                                std::to_string(static_cast<int>(most)));
  c.tasks = static_cast<int>(t);
  return c;
}

continual_method parse_cl(const std::string& spec) {
  continual_method m;
  if (spec.empty() || spec == "none") return m;
  const auto parts = split_spec(spec);
  const std::string usage = "--cl '" + spec + "': use none, ewc:LAMBDA or gpm:THRESHOLD";
  if (parts.size() != 2) throw std::invalid_argument(usage);
  const double v = spec_number(parts[1], "--cl '" + spec + "'");
  if (parts[0] == "ewc") {
    if (!(v > 0)) throw std::invalid_argument("--cl '" + spec + "': EWC's lambda must be above 0");
    m.type = continual_method::kind::ewc;
    m.lambda = v;
  } else if (parts[0] == "gpm") {
    if (!(v > 0 && v < 1)) throw std::invalid_argument("--cl '" + spec + "': GPM's energy threshold must be in (0, 1)");
    m.type = continual_method::kind::gpm;
    m.threshold = v;
  } else {
    throw std::invalid_argument(usage);
  }
  return m;
}

std::vector<std::uint32_t> task_permutation(std::uint64_t seed, int task, std::size_t pixels) {
  std::vector<std::uint32_t> p(pixels);
  std::iota(p.begin(), p.end(), 0u);
  if (task == 0) return p;
  splitmix64 g{derive_seed(seed, static_cast<std::uint64_t>(task))};
  for (std::size_t i = pixels; i > 1; --i) std::swap(p[i - 1], p[g.below(i)]);
  return p;
}

std::pair<int, int> split_classes(int task, int tasks, int classes) {
  if (tasks < 1 || task < 0 || task >= tasks || classes < tasks)
    throw std::invalid_argument("split_classes: task " + std::to_string(task) + " of " + std::to_string(tasks) +
                                " over " + std::to_string(classes) + " classes");
  return {task * classes / tasks, (task + 1) * classes / tasks};
}

continual_scores score_tasks(std::span<const double> after, std::span<const double> final) {
  if (after.empty() || after.size() != final.size())
    throw std::invalid_argument("score_tasks: " + std::to_string(after.size()) + " and " + std::to_string(final.size()) +
                                " accuracies; one per task in each");
  continual_scores s;
  const std::size_t t = final.size();
  for (double a : final) s.acc += a;
  s.acc /= static_cast<double>(t);
  for (std::size_t j = 0; j + 1 < t; ++j) s.bwt += final[j] - after[j];
  if (t > 1) s.bwt /= static_cast<double>(t - 1);
  return s;
}

// ---- EWC ----------------------------------------------------------------------------------------

void ewc_penalty::add_task(std::vector<float> fisher, std::vector<float> optimum) {
  if (fisher.size() != optimum.size() || (tasks_ > 0 && fisher.size() != fisher_.size()))
    throw std::invalid_argument("ewc_penalty: a Fisher diagonal of " + std::to_string(fisher.size()) +
                                " numbers and an optimum of " + std::to_string(optimum.size()) + " for a model of " +
                                std::to_string(tasks_ > 0 ? fisher_.size() : fisher.size()));
  if (tasks_ == 0) fisher_.assign(fisher.size(), 0.0f);
  for (std::size_t i = 0; i < fisher.size(); ++i) fisher_[i] += fisher[i];
  optimum_ = std::move(optimum);
  ++tasks_;
}

double ewc_penalty::value(std::span<const float> theta, double lambda) const {
  if (tasks_ == 0) return 0;
  if (theta.size() != fisher_.size()) throw std::invalid_argument("ewc_penalty::value: a model of another size");
  double sum = 0;
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const double d = static_cast<double>(theta[i]) - optimum_[i];
    sum += fisher_[i] * d * d;
  }
  return 0.5 * lambda * sum;
}

double ewc_penalty::largest_diagonal() const {
  double most = 0;
  for (float f : fisher_) most = std::max(most, static_cast<double>(f));
  return most;
}

void ewc_penalty::gradient(std::span<const float> theta, float lambda, std::span<float> out) const {
  if (out.size() != theta.size()) throw std::invalid_argument("ewc_penalty::gradient: out and theta differ in size");
  std::fill(out.begin(), out.end(), 0.0f);
  if (tasks_ == 0) return;
  if (theta.size() != fisher_.size()) throw std::invalid_argument("ewc_penalty::gradient: a model of another size");
  // (theta - theta*) first: exactly 0 at the optimum, whatever the contraction of the products.
  for (std::size_t i = 0; i < theta.size(); ++i) out[i] = lambda * (fisher_[i] * (theta[i] - optimum_[i]));
}

void ewc_penalty::proximal(std::span<float> theta, double lr, double lambda) const {
  if (tasks_ == 0) return;
  if (theta.size() != fisher_.size()) throw std::invalid_argument("ewc_penalty::proximal: a model of another size");
  const double a = lr * lambda;
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const double af = a * fisher_[i];
    theta[i] = static_cast<float>(theta[i] - af * (static_cast<double>(theta[i]) - optimum_[i]) / (1 + af));
  }
}

// ---- GPM ----------------------------------------------------------------------------------------

std::size_t energy_rank(std::span<const double> sigma, double total, double projected, double threshold) {
  const double goal = threshold * total;
  double have = projected;
  std::size_t k = 0;
  while (have < goal && k < sigma.size()) {
    have += sigma[k] * sigma[k];
    ++k;
  }
  return k;
}

gpm_summary gpm_summarize(std::span<const double> a, std::size_t n, const gpm_basis& basis) {
  const std::size_t d = basis.rows;
  if (d == 0 || a.size() != n * d)
    throw std::invalid_argument("gpm_summarize: " + std::to_string(a.size()) + " numbers for " + std::to_string(n) +
                                " inputs of " + std::to_string(d));
  gpm_summary s;
  s.rows = d;
  if (n == 0) return s;
  // The residual R = A - (A M) M^T, and the energies of A and of A M.
  std::vector<double> r(a.begin(), a.end()), am(basis.k);
  for (std::size_t e = 0; e < n; ++e) {
    double* row = r.data() + e * d;
    for (std::size_t i = 0; i < d; ++i) s.total += row[i] * row[i];
    for (std::size_t j = 0; j < basis.k; ++j) {
      const double* col = basis.m.data() + j * d;
      double dot = 0;
      for (std::size_t i = 0; i < d; ++i) dot += a[e * d + i] * col[i];
      am[j] = dot;
      s.projected += dot * dot;
    }
    for (std::size_t j = 0; j < basis.k; ++j) {
      const double* col = basis.m.data() + j * d;
      for (std::size_t i = 0; i < d; ++i) row[i] -= am[j] * col[i];
    }
  }
  const auto f = kernels::svd(r, static_cast<std::int64_t>(n), static_cast<std::int64_t>(d));
  // Every direction the residual has (those above rounding): nothing the server needs is dropped.
  const double floor = f.s.empty() ? 0.0 : f.s.front() * 1e-10;
  for (std::size_t j = 0; j < f.s.size() && f.s[j] > floor; ++j) {
    for (std::size_t i = 0; i < d; ++i) s.directions.push_back(f.s[j] * f.vt[j * d + i]);
    ++s.count;
  }
  return s;
}

std::size_t gpm_merge(gpm_basis& basis, std::span<const gpm_summary> summaries, double threshold) {
  const std::size_t d = basis.rows;
  double total = 0, projected = 0;
  std::size_t count = 0;
  for (const auto& s : summaries) {
    if (s.rows != d || s.directions.size() != s.count * d)
      throw std::invalid_argument("gpm_merge: a summary of " + std::to_string(s.rows) + "-number inputs for a basis of " +
                                  std::to_string(d));
    total += s.total;
    projected += s.projected;
    count += s.count;
  }
  if (count == 0) return 0;
  std::vector<double> z;
  z.reserve(count * d);
  for (const auto& s : summaries) z.insert(z.end(), s.directions.begin(), s.directions.end());
  const auto f = kernels::svd(z, static_cast<std::int64_t>(count), static_cast<std::int64_t>(d));
  const std::size_t keep = std::min(energy_rank(f.s, total, projected, threshold), d - basis.k);
  // The new directions are off M up to rounding: one Gram-Schmidt pass against M (and each other)
  // keeps the columns orthonormal as the basis grows.
  for (std::size_t j = 0; j < keep; ++j) {
    std::vector<double> v(f.vt.begin() + static_cast<std::ptrdiff_t>(j * d),
                          f.vt.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
    for (std::size_t c = 0; c < basis.k; ++c) {
      const double* col = basis.m.data() + c * d;
      double dot = 0;
      for (std::size_t i = 0; i < d; ++i) dot += v[i] * col[i];
      for (std::size_t i = 0; i < d; ++i) v[i] -= dot * col[i];
    }
    double norm = 0;
    for (double x : v) norm += x * x;
    norm = std::sqrt(norm);
    if (!(norm > 1e-8)) continue;  // numerically inside the basis already
    for (double& x : v) x /= norm;
    basis.m.insert(basis.m.end(), v.begin(), v.end());
    ++basis.k;
  }
  return keep;
}

void gpm_project_reference(std::span<float> dw, std::span<float> db, std::size_t out, const gpm_basis& basis) {
  const std::size_t d = basis.rows;
  if (d < 1 || dw.size() != out * (d - 1) || db.size() != out)
    throw std::invalid_argument("gpm_project_reference: a layer update of " + std::to_string(dw.size()) + " + " +
                                std::to_string(db.size()) + " numbers for " + std::to_string(out) + " rows of " +
                                std::to_string(d) + " inputs (bias included)");
  std::vector<double> row(d), c(basis.k);
  for (std::size_t o = 0; o < out; ++o) {
    for (std::size_t i = 0; i + 1 < d; ++i) row[i] = dw[o * (d - 1) + i];
    row[d - 1] = db[o];
    for (std::size_t j = 0; j < basis.k; ++j) {
      double dot = 0;
      for (std::size_t i = 0; i < d; ++i) dot += row[i] * basis.m[j * d + i];
      c[j] = dot;
    }
    for (std::size_t j = 0; j < basis.k; ++j)
      for (std::size_t i = 0; i < d; ++i) row[i] -= c[j] * basis.m[j * d + i];
    for (std::size_t i = 0; i + 1 < d; ++i) dw[o * (d - 1) + i] = static_cast<float>(row[i]);
    db[o] = static_cast<float>(row[d - 1]);
  }
}

}  // namespace troupe::federated
