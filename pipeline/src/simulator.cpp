// The validator and the simulator share one execution engine: every action is a node with the
// actions it needs; each rank runs its list in order; an action starts when its rank is free and
// everything it needs has ended (plus the send latency when that came from another rank). A pass
// over the ranks that starts nothing while work remains is a deadlock.

#include "troupe/pipeline/simulator.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <numeric>
#include <sstream>

namespace troupe::pipeline {

// ---- rational ---------------------------------------------------------------------------

rational::rational(std::int64_t num, std::int64_t den) { *this = reduce(num, den); }

rational rational::reduce(wide num, wide den) {
  if (den == 0) throw std::invalid_argument("rational with a zero denominator");
  if (den < 0) {
    num = -num;
    den = -den;
  }
  constexpr wide most = INT64_MAX;
  const wide magnitude = num < 0 ? -num : num;
  if (magnitude <= most && den <= most) {  // the common case: 64-bit terms, the fast gcd
    const auto g = static_cast<wide>(std::gcd(static_cast<std::uint64_t>(magnitude), static_cast<std::uint64_t>(den)));
    if (g > 1) {
      num /= g;
      den /= g;
    }
  } else {
    wide a = magnitude, b = den;
    while (b != 0) {
      const wide t = a % b;
      a = b;
      b = t;
    }
    if (a > 1) {
      num /= a;
      den /= a;
    }
  }
  if (num > most || num < -most || den > most)
    throw std::overflow_error("exact time overflows 64-bit fractions (costs too large or too finely divided)");
  rational r;
  r.num_ = static_cast<std::int64_t>(num);
  r.den_ = static_cast<std::int64_t>(den);
  return r;
}

rational rational::parse(std::string_view text) {
  auto bad = [&] {
    return std::invalid_argument("'" + std::string(text) +
                                 "' is not an exact number (write e.g. 2, 1.25, .5 or 3/4; no exponents)");
  };
  auto read = [&](std::string_view s, std::int64_t& v) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && p == s.data() + s.size();
  };
  if (auto slash = text.find('/'); slash != std::string_view::npos) {
    std::int64_t n = 0, d = 0;
    if (!read(text.substr(0, slash), n) || !read(text.substr(slash + 1), d) || d == 0) throw bad();
    return rational(n, d);
  }
  auto dot = text.find('.');
  std::int64_t whole = 0;
  if (!(dot == 0 && text.size() > 1) && !read(text.substr(0, dot), whole)) throw bad();  // ".5" has no whole part
  if (dot == std::string_view::npos) return rational(whole);
  auto frac = text.substr(dot + 1);
  std::int64_t f = 0;
  if (frac.size() > 12 || !read(frac, f) || frac.front() == '-' || frac.front() == '+') throw bad();
  std::int64_t scale = 1;
  for (std::size_t i = 0; i < frac.size(); ++i) scale *= 10;
  const bool negative = !text.empty() && text.front() == '-';
  std::int64_t num = 0;
  if (__builtin_mul_overflow(whole, scale, &num) || __builtin_add_overflow(num, negative ? -f : f, &num))
    throw std::invalid_argument("'" + std::string(text) + "' is too large");
  return rational(num, scale);
}

std::string rational::str() const {
  return den_ == 1 ? std::to_string(num_) : std::to_string(num_) + "/" + std::to_string(den_);
}

cost_model cost_model::parse(std::string_view text) {
  cost_model m;
  bool b_given = false, i_given = false, w_given = false;
  std::vector<std::string> seen;
  std::string_view rest = text;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    auto item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    auto eq = item.find('=');
    if (eq == std::string_view::npos)
      throw std::invalid_argument("cost '" + std::string(item) + "' is not NAME=VALUE (e.g. F=1)");
    std::string key(item.substr(0, eq));
    for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      throw std::invalid_argument("cost " + std::string(item.substr(0, eq)) + " is given twice");
    seen.push_back(key);
    rational v = rational::parse(item.substr(eq + 1));
    if (v < rational(0)) throw std::invalid_argument("cost " + key + " must not be negative");
    if (key == "f") m.uniform.f = v;
    else if (key == "b") m.uniform.b = v, b_given = true;
    else if (key == "i") m.uniform.i = v, i_given = true;
    else if (key == "w") m.uniform.w = v, w_given = true;
    else if (key == "comm") m.uniform.comm = v;
    else if (key == "fb") m.uniform.fb = v;
    else
      throw std::invalid_argument("unknown cost '" + key + "' (use F, B, I, W, comm and FB)");
  }
  // One backward, split or not: B = I + W always, so that schedules with the split and those
  // without compare on the same model. What is not given follows from what is.
  auto& c = m.uniform;
  if (!b_given) {
    c.b = c.i + c.w;  // (I and W default to 1)
  } else if (!i_given && !w_given) {
    c.i = c.w = c.b / rational(2);
  } else if (!w_given || !i_given) {
    (i_given ? c.w : c.i) = c.b - (i_given ? c.i : c.w);
    if (c.w < rational(0) || c.i < rational(0))
      throw std::invalid_argument("cost " + std::string(i_given ? "I" : "W") + " is more than B (" + c.b.str() +
                                  "): a backward is B = I + W");
  } else if (c.b != c.i + c.w) {
    throw std::invalid_argument("costs B=" + c.b.str() + ", I=" + c.i.str() + ", W=" + c.w.str() +
                                ": a backward is B = I + W, split or not");
  }
  return m;
}

// ---- the engine -------------------------------------------------------------------------

namespace {

constexpr int kinds = 9;

struct node {
  int rank;
  int step;  // position in the rank's list, idle steps included (for messages)
  action a;
  bool second_of_pair = false;  // runs in the same step as the node before it
  std::vector<std::pair<int, bool>> deps;  // (node, from another rank)
  rational start, end;
  bool done = false;
};

/// A cost model built in code rather than parsed: the same rule as parse (no negative cost).
void check_costs(const action_costs& c, const std::string& where) {
  const std::pair<const char*, const rational*> all[] = {{"F", &c.f}, {"B", &c.b}, {"I", &c.i}, {"W", &c.w},
                                                          {"comm", &c.comm}, {"FB", c.fb ? &*c.fb : nullptr}};
  for (const auto& [name, v] : all)
    if (v != nullptr && *v < rational(0))
      throw std::invalid_argument("cost " + std::string(name) + where + " is " + v->str() + "; costs must not be negative");
  if (c.b != c.i + c.w)
    throw std::invalid_argument("cost B" + where + " is " + c.b.str() + " but I + W is " + (c.i + c.w).str() +
                                ": a backward is B = I + W, split or not");
}

class engine {
public:
  engine(const schedule& s, const cost_model& costs) : s_(s), costs_(costs) {
    check_costs(costs.uniform, "");
    for (std::size_t i = 0; i < costs.per_stage.size(); ++i)
      check_costs(costs.per_stage[i], " of stage " + std::to_string(i));
    const int p = s.place.ranks;
    if (p < 1) throw schedule_error("a schedule needs at least one rank");
    if (static_cast<int>(s.ranks.size()) != p)
      throw schedule_error("the schedule has " + std::to_string(s.ranks.size()) +
                           " rows of actions for " + std::to_string(p) + " ranks");
    if (s.microbatches < 1) throw schedule_error("a schedule needs at least one microbatch");
    if (s.place.stages_per_rank < 1) throw schedule_error("a schedule needs at least one stage per rank");
    // The index below has a cell per (kind, stage, microbatch): refuse sizes that cannot be
    // real schedules (generate's limit) before allocating them.
    constexpr std::int64_t most_cells = max_schedule_cells;
    const std::int64_t stages = std::int64_t{p} * s.place.stages_per_rank;
    if (stages * s.microbatches > most_cells)
      throw schedule_error(std::to_string(stages) + " stages x " + std::to_string(s.microbatches) +
                           " microbatches is more than " + std::to_string(most_cells) + " cells");
    stages_ = s.stages();
    if (!s.activation_kept.empty() && static_cast<int>(s.activation_kept.size()) != stages_)
      throw schedule_error("the schedule keeps activation shares for " +
                           std::to_string(s.activation_kept.size()) + " stages; it has " +
                           std::to_string(stages_));
    index_.assign(static_cast<std::size_t>(kinds) * stages_ * s.microbatches, -1);
    per_rank_.resize(p);
    for (int r = 0; r < p; ++r) {
      for (int step = 0; step < static_cast<int>(s.ranks[r].size()); ++step) {
        const auto& a = s.ranks[r][step];
        if (!a) continue;
        if (a->stage < 0 || a->stage >= stages_)
          fail(r, step, *a, "stage " + std::to_string(a->stage) + " does not exist (the schedule has " +
                                std::to_string(stages_) + " stages)");
        if (a->microbatch < 0 || a->microbatch >= s.microbatches)
          fail(r, step, *a, "microbatch " + std::to_string(a->microbatch) +
                                " does not exist (the schedule has " +
                                std::to_string(s.microbatches) + ")");
        if (s.place.rank_of(a->stage) != r)
          fail(r, step, *a, "stage " + std::to_string(a->stage) + " lives on rank " +
                                std::to_string(s.place.rank_of(a->stage)));
        int& slot = index_[key(*a)];
        if (slot >= 0)
          fail(r, step, *a, "appears a second time (first at " + where(nodes_[slot]) + ")");
        slot = static_cast<int>(nodes_.size());
        nodes_.push_back(node{r, step, *a, {}, {}, {}, false});
        per_rank_[r].push_back(slot);
      }
    }
    check_pairs();
    check_complete();
    link();
  }

  simulation run() {
    // A worklist of ranks: a rank runs its actions in order until one waits for another rank's
    // action; when an action ends, the ranks of the actions that depend on it go back on the
    // list. Every node and dependency is looked at a bounded number of times (sweeping all ranks
    // until nothing moves took p sweeps for the backward wave alone: quadratic in p). The times
    // do not depend on the order: each action starts when its rank is free and its inputs are in.
    const int p = s_.place.ranks;
    // Per node, the ranks of the nodes that depend on it (compressed rows).
    std::vector<std::size_t> first(nodes_.size() + 1, 0);
    for (const node& n : nodes_)
      for (auto [d, remote] : n.deps) ++first[static_cast<std::size_t>(d) + 1];
    for (std::size_t k = 0; k < nodes_.size(); ++k) first[k + 1] += first[k];
    std::vector<int> waiting(first.back());
    {
      std::vector<std::size_t> at(first.begin(), first.end() - 1);
      for (const node& n : nodes_)
        for (auto [d, remote] : n.deps) waiting[at[static_cast<std::size_t>(d)]++] = n.rank;
    }
    std::vector<std::size_t> next(p, 0);
    std::vector<rational> free(p);
    std::vector<int> work;
    std::vector<char> queued(p, 1);
    for (int r = p - 1; r >= 0; --r) work.push_back(r);
    auto wake = [&](const node& done) {
      const auto id = static_cast<std::size_t>(&done - nodes_.data());
      for (std::size_t k = first[id]; k < first[id + 1]; ++k)
        if (!queued[waiting[k]]) {
          queued[waiting[k]] = 1;
          work.push_back(waiting[k]);
        }
    };
    std::size_t remaining = nodes_.size();
    while (!work.empty()) {
      const int r = work.back();
      work.pop_back();
      queued[r] = 0;
      while (next[r] < per_rank_[r].size()) {
        node& n = nodes_[per_rank_[r][next[r]]];
        node* partner = n.a.overlapped ? &nodes_[per_rank_[r][next[r] + 1]] : nullptr;
        rational ready = free[r];
        if (!ready_after(n, partner, ready) || (partner && !ready_after(*partner, &n, ready))) break;
        n.start = ready;
        n.end = ready + (partner ? pair_duration(n.a, partner->a) : duration(n.a));
        n.done = true;
        free[r] = n.end;
        ++next[r];
        --remaining;
        wake(n);
        if (partner) {
          partner->start = n.start;
          partner->end = n.end;
          partner->done = true;
          ++next[r];
          --remaining;
          wake(*partner);
        }
      }
    }
    if (remaining > 0) deadlock(next);
    return summarize();
  }

private:
  /// Raises `ready` to when everything `n` needs is there; false when something is missing.
  /// A pair's partner does not count (the two run together).
  bool ready_after(const node& n, const node* partner, rational& ready) const {
    for (auto [d, remote] : n.deps) {
      const node& dep = nodes_[d];
      if (&dep == partner)
        fail(n, "overlaps with " + to_string(dep.a) + ", which it depends on");
      if (!dep.done) return false;
      rational t = dep.end + (remote ? comm_of(dep.a.stage) : rational(0));
      if (t > ready) ready = t;
    }
    return true;
  }

  rational pair_duration(const action& a, const action& b) const {
    const bool f_and_b = (a.kind == op::F && b.kind == op::B) || (a.kind == op::B && b.kind == op::F);
    const action_costs& c =
        costs_.per_stage.empty() ? costs_.uniform : stage_costs(a.kind == op::F ? a.stage : b.stage);
    if (!f_and_b || !c.fb) return duration(a) + duration(b);
    return costs_.per_stage.empty() ? *c.fb / rational(s_.place.stages_per_rank) : *c.fb;
  }

  std::size_t key(const action& a) const {
    return (static_cast<std::size_t>(a.kind) * stages_ + a.stage) * s_.microbatches + a.microbatch;
  }
  int find(int stage, op k, int mb) const {
    if (stage < 0 || stage >= stages_) return -1;
    return index_[key(action{stage, k, mb})];
  }

  std::string where(const node& n) const {
    return "rank " + std::to_string(n.rank) + ", step " + std::to_string(n.step) + " (" +
           to_string(n.a) + ")";
  }
  [[noreturn]] void fail(int rank, int step, const action& a, const std::string& why) const {
    throw schedule_error("rank " + std::to_string(rank) + ", step " + std::to_string(step) + " (" +
                         to_string(a) + "): " + why);
  }
  [[noreturn]] void fail(const node& n, const std::string& why) const {
    fail(n.rank, n.step, n.a, why);
  }

  /// An overlapped action needs a compute action right after it on its rank, and the two
  /// must not depend on each other.
  void check_pairs() {
    for (const auto& ids : per_rank_) {
      for (std::size_t k = 0; k < ids.size(); ++k) {
        node& n = nodes_[ids[k]];
        if (!n.a.overlapped) continue;
        if (!is_compute(n.a.kind) || k + 1 == ids.size() || !is_compute(nodes_[ids[k + 1]].a.kind) ||
            nodes_[ids[k + 1]].a.overlapped || nodes_[ids[k + 1]].step != n.step + 1)
          fail(n, "is marked to overlap with the next action, which must be a single compute action "
                  "right after it");
        nodes_[ids[k + 1]].second_of_pair = true;
      }
    }
  }

  void check_complete() const {
    for (int st = 0; st < stages_; ++st) {
      for (int j = 0; j < s_.microbatches; ++j) {
        const std::string what = "stage " + std::to_string(st) + ", microbatch " + std::to_string(j);
        if (find(st, op::F, j) < 0) throw schedule_error(what + " has no forward (" + std::to_string(st) + "F" + std::to_string(j) + ")");
        const bool b = find(st, op::B, j) >= 0, i = find(st, op::I, j) >= 0, w = find(st, op::W, j) >= 0;
        if (b && (i || w))
          throw schedule_error(what + " has a full backward B and a split one (I/W): use one of them");
        if (!b && !(i && w))
          throw schedule_error(what + " has no complete backward: it needs " + std::to_string(st) + "B" +
                               std::to_string(j) + ", or both " + std::to_string(st) + "I" +
                               std::to_string(j) + " and " + std::to_string(st) + "W" +
                               std::to_string(j));
      }
    }
  }

  /// The backward that produces stage `st`'s input gradient (B or I), or -1.
  int backward_of(int st, int mb) const {
    int b = find(st, op::B, mb);
    return b >= 0 ? b : find(st, op::I, mb);
  }

  void need_local(node& n, int dep, const std::string& what) {
    if (dep < 0) fail(n, "needs " + what + ", which the schedule does not have");
    const node& d = nodes_[dep];
    if (d.rank != n.rank || d.step >= n.step)
      fail(n, "needs " + to_string(d.a) + " earlier on the same rank, but it comes at " + where(d));
    n.deps.emplace_back(dep, false);
  }

  /// A dependency on data from stage `from`'s action `dep`, which may live on another rank.
  void need_data(node& n, int dep, op recv_kind, int dep_stage) {
    const node& d = nodes_[dep];
    if (d.rank == n.rank) {
      need_local(n, dep, to_string(d.a));
      return;
    }
    if (!lowered_) {
      n.deps.emplace_back(dep, true);
      return;
    }
    const action recv{n.a.stage, recv_kind, n.a.microbatch};
    need_local(n, find(recv.stage, recv.kind, recv.microbatch),
               to_string(recv) + " (the data comes from " + where(d) + ")");
    (void)dep_stage;
  }

  void link() {
    lowered_ = s_.lowered();
    const int last = stages_ - 1;
    for (auto& n : nodes_) {
      const int st = n.a.stage, mb = n.a.microbatch;
      switch (n.a.kind) {
        case op::F:
          if (st > 0) need_data(n, find(st - 1, op::F, mb), op::recv_f, st - 1);
          break;
        case op::B:
        case op::I:
          need_local(n, find(st, op::F, mb), to_string(action{st, op::F, mb}));
          if (int rc = find(st, op::recompute, mb); rc >= 0) need_local(n, rc, to_string(nodes_[rc].a));
          if (st < last) need_data(n, backward_of(st + 1, mb), op::recv_b, st + 1);
          break;
        case op::W:
          need_local(n, find(st, op::I, mb), to_string(action{st, op::I, mb}));
          break;
        case op::recompute:
          // Recomputation runs inside the backward, once the gradient has come (as autograd's
          // checkpointing does): a checkpointed backward costs T_B + T_F.
          need_local(n, find(st, op::F, mb), to_string(action{st, op::F, mb}));
          if (st < last) need_data(n, backward_of(st + 1, mb), op::recv_b, st + 1);
          break;
        case op::send_f:
          need_local(n, find(st, op::F, mb), to_string(action{st, op::F, mb}));
          if (st == last) fail(n, "sends a forward from the last stage, which has no next stage");
          if (find(st + 1, op::recv_f, mb) < 0) fail(n, "has no matching " + to_string(action{st + 1, op::recv_f, mb}));
          break;
        case op::send_b:
          need_local(n, backward_of(st, mb), "the backward of stage " + std::to_string(st));
          if (st == 0) fail(n, "sends a gradient from stage 0, which has no previous stage");
          if (find(st - 1, op::recv_b, mb) < 0) fail(n, "has no matching " + to_string(action{st - 1, op::recv_b, mb}));
          break;
        case op::recv_f: {
          if (st == 0) fail(n, "receives a forward on stage 0, which has no previous stage");
          int snd = find(st - 1, op::send_f, mb);
          if (snd < 0) fail(n, "has no matching " + to_string(action{st - 1, op::send_f, mb}));
          n.deps.emplace_back(snd, true);
          break;
        }
        case op::recv_b: {
          if (st == last) fail(n, "receives a gradient on the last stage, which has no next stage");
          int snd = find(st + 1, op::send_b, mb);
          if (snd < 0) fail(n, "has no matching " + to_string(action{st + 1, op::send_b, mb}));
          n.deps.emplace_back(snd, true);
          break;
        }
      }
    }
  }

  rational per_action(const action_costs& c, op k) const {
    switch (k) {
      case op::F:
      case op::recompute: return c.f;
      case op::B: return c.b;
      case op::I: return c.i;
      case op::W: return c.w;
      default: return rational(0);
    }
  }
  rational duration(const action& a) const {
    if (!is_compute(a.kind)) return rational(0);
    if (!costs_.per_stage.empty()) return per_action(stage_costs(a.stage), a.kind);
    return per_action(costs_.uniform, a.kind) / rational(s_.place.stages_per_rank);
  }
  const action_costs& stage_costs(int stage) const {
    if (static_cast<int>(costs_.per_stage.size()) != stages_)
      throw std::invalid_argument("the cost model has costs for " +
                                  std::to_string(costs_.per_stage.size()) + " stages; the schedule has " +
                                  std::to_string(stages_));
    return costs_.per_stage[stage];
  }
  rational comm_of(int stage) const {
    return costs_.per_stage.empty() ? costs_.uniform.comm : stage_costs(stage).comm;
  }

  [[noreturn]] void deadlock(const std::vector<std::size_t>& next) const {
    std::string msg = "deadlock: no rank can go on.";
    for (int r = 0; r < s_.place.ranks; ++r) {
      if (next[r] >= per_rank_[r].size()) continue;
      const node& n = nodes_[per_rank_[r][next[r]]];
      msg += " " + where(n) + " waits for";
      for (auto [d, remote] : n.deps)
        if (!nodes_[d].done) msg += " " + where(nodes_[d]) + ";";
    }
    throw schedule_error(msg);
  }

  simulation summarize() const {
    const int p = s_.place.ranks;
    simulation out;
    out.busy.assign(p, rational(0));
    out.peak_activations.assign(p, 0.0);
    out.timeline.resize(p);
    std::vector<rational> first(p), last(p);
    std::vector<bool> any(p, false);
    for (int r = 0; r < p; ++r) {
      rational held(0), peak(0);
      for (int id : per_rank_[r]) {
        const node& n = nodes_[id];
        out.timeline[r].push_back({n.a, n.start, n.end});
        if (n.end > out.makespan) out.makespan = n.end;
        if (!is_compute(n.a.kind)) continue;
        if (!n.second_of_pair) out.busy[r] += n.end - n.start;
        if (!any[r] || n.start < first[r]) first[r] = n.start;
        if (!any[r] || n.end > last[r]) last[r] = n.end;
        any[r] = true;
        // A stage's activations for one microbatch count 1/v. Checkpointing keeps a share
        // from F to the recompute, which restores the rest; B, or W under the split backward
        // (which needs them for the weight gradients), frees them all.
        const rational unit(1, s_.place.stages_per_rank);
        const rational kept = s_.activation_kept.empty() ? rational(1) : s_.activation_kept[n.a.stage];
        if (n.a.kind == op::F) held += unit * kept;
        if (n.a.kind == op::recompute) held += unit * (rational(1) - kept);
        if (n.a.kind == op::W || n.a.kind == op::B) held = held - unit;
        if (held > peak) peak = held;
      }
      out.peak_activations[r] = peak.to_double();
    }
    rational total_busy(0);
    for (auto& b : out.busy) total_busy += b;
    if (out.makespan > rational(0)) {
      const rational capacity = rational(p) * out.makespan;
      out.bubble = ((capacity - total_busy) / capacity).to_double();
    }
    int widest = 0;
    for (int r = 1; r < p; ++r)
      if (last[r] - first[r] > last[widest] - first[widest]) widest = r;
    const rational span = last[widest] - first[widest];
    if (span > rational(0)) out.bubble_span = ((span - out.busy[widest]) / span).to_double();
    return out;
  }

  const schedule& s_;
  const cost_model& costs_;
  int stages_ = 0;
  bool lowered_ = false;
  std::vector<int> index_;
  std::vector<node> nodes_;
  std::vector<std::vector<int>> per_rank_;
};

}  // namespace

void validate(const schedule& s) { engine(s, cost_model{}).run(); }

simulation simulate(const schedule& s, const cost_model& costs) { return engine(s, costs).run(); }

}  // namespace troupe::pipeline
