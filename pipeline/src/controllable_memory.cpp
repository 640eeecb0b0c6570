// V-Min and V-Half: the memory-controllable V schedules of Qi et al., "Pipeline Parallelism with
// Controllable Memory" (NeurIPS 2024), built as the authors build them:
//
//  1. A building block: on each rank, the start slots of one microbatch's four passes, F and I of
//     both stages (F0, F1, I1, I0; 0 is the rank's first stage r, 1 its second 2p-1-r). The
//     offsets between neighbouring ranks fix the lifespan of the activations, hence the memory:
//     V-Min's block is as tight as possible (about a third of 1F1B's activations), V-Half's is
//     spaced out (about a half).
//  2. Repetition: microbatch j starts 6j slots after microbatch 0 (one period holds each rank's
//     2 F, 2 I and 2 W).
//  3. Squeezing: the warm-up and the cool-down move each pass to the earliest free slot its
//     dependencies allow, never above the steady state's peak memory; then every pass starts as
//     early as its dependencies and its rank's order allow.
//  4. The W passes fill the free slots after their I, the second stage's first.
//
// Only the per-rank order is kept; the simulator times it with the real costs.

#include <algorithm>
#include <array>
#include <limits>
#include <functional>
#include <map>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/pipeline/schedule.hpp"

namespace troupe::pipeline {
namespace {

// Pass types, in the order the construction numbers them.
constexpr int f0 = 0, f1 = 1, i1 = 2, i0 = 3, w_any = 4, w1 = 4, w0 = 5;

using lists = std::vector<std::vector<int>>;  // per type, the slot of each microbatch
using plan = std::vector<lists>;              // per rank

constexpr int none = std::numeric_limits<int>::max();

int last_slot(const lists& l) {
  int b = 0;
  for (const auto& t : l)
    if (!t.empty()) b = std::max(b, t.back());
  return b;
}

/// Visits every pass in ascending (slot, rank, type, microbatch) order; `visit` may move the
/// visited pass to an earlier slot (never another pass). A heap holds each (rank, type) list's
/// next pass.
template <class F>
void in_slot_order(plan& s, int types, F visit) {
  const int p = static_cast<int>(s.size());
  using entry = std::tuple<int, int, int>;  // slot, rank, type
  std::priority_queue<entry, std::vector<entry>, std::greater<>> heads;
  std::vector<std::vector<std::size_t>> next(p, std::vector<std::size_t>(types, 0));
  for (int r = 0; r < p; ++r)
    for (int t = 0; t < types; ++t)
      if (!s[r][t].empty()) heads.emplace(s[r][t][0], r, t);
  while (!heads.empty()) {
    const auto [slot, r, t] = heads.top();
    heads.pop();
    const std::size_t j = next[r][t]++;
    visit(r, t, static_cast<int>(j));
    if (j + 1 < s[r][t].size()) heads.emplace(s[r][t][j + 1], r, t);
  }
}

/// Places the W passes of one rank in its free slots after their I (one W list, or the second
/// stage's W before the first stage's when split).
void put_w(lists& l, bool split) {
  const int bound = last_slot(l);
  l.resize(split ? 6 : 5);
  int owed[2] = {0, 0};
  std::size_t next[4] = {0, 0, 0, 0};
  int slot = 0;
  for (; slot <= bound; ++slot) {
    int at = -1;
    for (int t = 0; t < 4; ++t)
      if (next[t] < l[t].size() && l[t][next[t]] == slot) at = t;
    if (at >= 0) {
      ++next[at];
      if (at == i1 || at == i0) ++owed[split ? at - i1 : 0];
      continue;
    }
    for (int w = 0; w < 2; ++w)
      if (owed[w]) {
        l[w_any + w].push_back(slot);
        --owed[w];
        break;
      }
  }
  --slot;
  for (int w = 0; w < 2; ++w)
    while (owed[w]-- > 0) l[w_any + w].push_back(++slot);
}

/// One slot of a rank's memory: the pass there (or -1) moves what it holds (+1 per F, -1 per
/// W) and what it owes (+1 per I: a W to come); without W lists (`has_w` false) the W's are
/// assumed to take the free slots after their I.
inline void account(int at, bool has_w, int& held, int& owed) {
  if (at >= 0) {
    if (at == f0 || at == f1) ++held;
    if (at >= w_any) --held;
    if (at == i1 || at == i0) ++owed;
  } else if (!has_w && owed) {
    --held;
    --owed;
  }
}

/// One rank's passes by slot and its memory after each slot 0..last_slot, in stage units.
struct profile {
  std::vector<int> at;           // the pass type in each slot, or -1
  std::vector<int> held, owed;   // after each slot
  bool has_w = false;

  explicit profile(const lists& l) : has_w(l.size() > 4) {
    const std::size_t slots = static_cast<std::size_t>(last_slot(l)) + 1;
    at.assign(slots, -1);
    for (int t = 0; t < static_cast<int>(l.size()); ++t)
      for (const int slot : l[t]) at[static_cast<std::size_t>(slot)] = t;
    held.resize(slots);
    owed.resize(slots);
    int h = 0, o = 0;
    for (std::size_t slot = 0; slot < slots; ++slot) {
      account(at[slot], has_w, h, o);
      held[slot] = h;
      owed[slot] = o;
    }
  }
  int peak() const { return std::max(0, held.empty() ? 0 : *std::max_element(held.begin(), held.end())); }

  /// Whether moving the pass in slot `from` to the free slot `to` < from keeps every slot within
  /// `cap` (which it is now); with `commit`, makes the move. Only slots from `to` on change, and
  /// once past `from` the memory is again what it was, the rest is as it was.
  bool move(int to, int from, int cap, bool commit) {
    const int type = at[static_cast<std::size_t>(from)];
    int h = to > 0 ? held[static_cast<std::size_t>(to) - 1] : 0, o = to > 0 ? owed[static_cast<std::size_t>(to) - 1] : 0;
    for (std::size_t slot = static_cast<std::size_t>(to); slot < at.size(); ++slot) {
      const int pass = slot == static_cast<std::size_t>(to) ? type : slot == static_cast<std::size_t>(from) ? -1 : at[slot];
      account(pass, has_w, h, o);
      if (h > cap) return false;
      if (slot >= static_cast<std::size_t>(from) && h == held[slot] && o == owed[slot]) break;
      if (commit) {
        held[slot] = h;
        owed[slot] = o;
      }
    }
    if (commit) {
      at[static_cast<std::size_t>(to)] = type;
      at[static_cast<std::size_t>(from)] = -1;
    }
    return true;
  }
};

/// The j-th smallest of two ascending lists together.
int nth_of_both(const std::vector<int>& a, const std::vector<int>& b, std::size_t j) {
  std::size_t x = 0, y = 0;
  for (;;) {
    const bool from_a = y >= b.size() || (x < a.size() && a[x] <= b[y]);
    const int v = from_a ? a[x++] : b[y++];
    if (j-- == 0) return v;
  }
}

/// The rank a pass of type t depends on (F0 and I1 travel down the ranks, F1 and I0 up), or -1.
int upstream(int rank, int type, int p) {
  if (type == f0 || type == i1) return rank > 0 ? rank - 1 : -1;
  if (type == f1 || type == i0) return rank + 1 < p ? rank + 1 : -1;
  return -1;
}

/// Starts every pass as early as its dependencies and its rank's order allow, with unit costs;
/// returns the new slots and each rank's order.
plan squeeze(const plan& s, int types, std::vector<std::vector<std::pair<int, int>>>* order = nullptr) {
  const int p = static_cast<int>(s.size());
  plan work = s, out = s;
  std::vector<int> rank_free(p, 0);
  if (order) order->assign(p, {});
  in_slot_order(work, types, [&](int r, int t, int j) {
    int start = rank_free[r];
    if (int u = upstream(r, t, p); u >= 0 && t < 4) start = std::max(start, out[u][t][j] + 1);
    if (t > f0 && t < 4) start = std::max(start, out[r][t - 1][j] + 1);
    if (j > 0) start = std::max(start, out[r][t][j - 1] + 1);
    out[r][t][j] = start;
    rank_free[r] = start + 1;
    if (order) order->at(r).emplace_back(t, j);
  });
  return out;
}

/// Moves the warm-up (when `with_w`) and cool-down passes to the earliest free slot their
/// dependencies allow, without raising the peak memory; then squeezes.
plan reorder(plan s, bool with_w) {
  const int p = static_cast<int>(s.size());
  const int types = with_w ? 5 : 4;
  const int m = static_cast<int>(s[0][f0].size());
  if (with_w)
    for (auto& l : s) put_w(l, false);
  std::vector<profile> memory;
  int cap = 0;
  for (const auto& l : s) {
    memory.emplace_back(l);
    cap = std::max(cap, memory.back().peak());
  }
  std::vector<std::vector<bool>> taken(p);
  for (int r = 0; r < p; ++r) taken[r].assign(static_cast<std::size_t>(last_slot(s[r])) + 1, false);
  int phase = 0;  // 0 warm-up, 1 steady state, 2 cool-down
  in_slot_order(s, types, [&](int r, int t, int j) {
    int& slot = s[r][t][j];
    if (t == i0 && r == 0 && phase == 0) phase = 1;
    const bool keep = phase == 1 || (phase == 0 && !with_w);
    if (phase == 1 && t == f0 && j == m - 1) phase = 2;
    if (!keep) {
      int earliest = -1;
      if (int u = upstream(r, t, p); u >= 0) earliest = std::max(earliest, s[u][t][j]);
      if (t > f0 && t < 4) earliest = std::max(earliest, s[r][t - 1][j]);
      if (t == w_any) earliest = std::max(earliest, nth_of_both(s[r][i1], s[r][i0], static_cast<std::size_t>(j)));
      if (j > 0) earliest = std::max(earliest, s[r][t][j - 1]);
      // The earliest free slot that keeps the rank's peak within cap.
      profile& mem = memory[static_cast<std::size_t>(r)];
      const int current = slot;
      int lowest = earliest + 1;
      if (with_w && (t == f0 || t == f1)) {
        // With the W passes in their lists, an F moved from `current` to c holds one more in
        // [c, current) and nothing else changes: slots past the last one that already holds
        // cap are the ones that keep the peak (and a W or an I moved earlier never raises it).
        for (int c = current - 1; c > earliest; --c)
          if (mem.held[static_cast<std::size_t>(c)] + 1 > cap) {
            lowest = c + 1;
            break;
          }
      }
      for (int candidate = lowest; candidate < current; ++candidate) {
        if (taken[r][candidate] || !mem.move(candidate, current, cap, false)) continue;
        mem.move(candidate, current, cap, true);
        slot = candidate;
        break;
      }
    }
    taken[r][slot] = true;
  });
  if (!with_w)
    for (auto& l : s) put_w(l, false);
  return squeeze(s, 5);
}

plan building_block(int p, bool half) {
  plan s(p, lists(4));
  for (int r = 0; r < p; ++r) {
    std::array<int, 4> start;
    if (half) {
      const int gap = p % 2 == 0 ? 3 : 0;
      start = {2 * r, 3 * p - r - 2, 3 * p + gap + 2 * r - 1, 6 * p + gap - r - 2};
    } else {
      const int gap = p % 3 == 0 ? 2 : 0;
      start = {r, 2 * p - r - 1, 2 * p + gap + r, 4 * p + gap - r - 1};
    }
    for (int t = 0; t < 4; ++t) s[r][t].push_back(start[t]);
  }
  return s;
}

}  // namespace

schedule controllable_memory_v(const std::string& name, int p, int m, int v, bool half) {
  if (v != 2) throw std::invalid_argument("schedule " + name + ": places exactly two stages on each rank; use 2 stages per rank");
  plan s = building_block(p, half);
  for (auto& l : s)
    for (auto& t : l)
      for (int j = 1; j < m; ++j) t.push_back(t[0] + 6 * j);
  auto strip_w = [](plan x) {
    for (auto& l : x) l.resize(4);
    return x;
  };
  s = strip_w(reorder(s, true));
  s = strip_w(reorder(s, false));
  for (auto& l : s) put_w(l, true);
  std::vector<std::vector<std::pair<int, int>>> order;
  squeeze(s, 6, &order);

  schedule out;
  out.name = name;
  out.place = placement{p, 2, placement_kind::v_shape};
  out.microbatches = m;
  out.ranks.resize(p);
  for (int r = 0; r < p; ++r) {
    const int first = r, second = 2 * p - 1 - r;
    for (auto [t, j] : order[r]) {
      static constexpr op kinds[] = {op::F, op::F, op::I, op::I, op::W, op::W};
      const bool on_first = t == f0 || t == i0 || t == w0;
      out.ranks[r].push_back(action{on_first ? first : second, kinds[t], j});
    }
  }
  return out;
}

}  // namespace troupe::pipeline
