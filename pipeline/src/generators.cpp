// The schedule generators. Each writes, per rank, the order of its compute actions; the
// validator and the simulator then check and time them, so a generator only has to get the
// order right. Orders follow the published constructions (cited at each generator).

#include "troupe/pipeline/generators.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>

namespace troupe::pipeline {

// controllable_memory.cpp
schedule controllable_memory_v(const std::string& name, int p, int m, int v, bool half);

namespace {

using row = std::vector<std::optional<action>>;

[[noreturn]] void refuse(const std::string& name, const std::string& why) {
  throw std::invalid_argument("schedule " + name + ": " + why);
}

schedule empty_schedule(const std::string& name, int p, int m, int v, placement_kind kind) {
  schedule s;
  s.name = name;
  s.place = placement{p, v, kind};
  s.microbatches = m;
  s.ranks.resize(p);
  return s;
}

// GPipe (Huang et al., 2019): all forwards, then all backwards.
schedule gpipe(int p, int m, int v) {
  if (v != 1) refuse("gpipe", "has one stage per rank; use 1 stage per rank, or looped-bfs");
  auto s = empty_schedule("gpipe", p, m, 1, placement_kind::looped);
  for (int r = 0; r < p; ++r) {
    for (int j = 0; j < m; ++j) s.ranks[r].push_back(action{r, op::F, j});
    for (int j = 0; j < m; ++j) s.ranks[r].push_back(action{r, op::B, j});
  }
  return s;
}

// 1F1B (PipeDream-Flush, Narayanan et al., 2021): rank r runs p-1-r warm-up forwards, then
// alternates one forward and one backward, then drains the remaining backwards.
schedule one_f_one_b(int p, int m, int v) {
  if (v != 1) refuse("1f1b", "has one stage per rank; use interleaved-1f1b for more stages per rank");
  auto s = empty_schedule("1f1b", p, m, 1, placement_kind::looped);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - 1 - r, m);
    auto& out = s.ranks[r];
    for (int j = 0; j < warmup; ++j) out.push_back(action{r, op::F, j});
    for (int k = 0; k < m - warmup; ++k) {
      out.push_back(action{r, op::F, warmup + k});
      out.push_back(action{r, op::B, k});
    }
    for (int j = m - warmup; j < m; ++j) out.push_back(action{r, op::B, j});
  }
  return s;
}

// Interleaved schedules on the looped placement (rank r holds stages r, r+p, ...), in rounds
// of k = m / max(1, m / p) microbatches (k = p when p divides m): forwards go through the
// rank's stages one round at a time, backwards likewise from its last stage, each stage taking
// its microbatches in order. Warm-up: (v-1)*k + f*(p-1-r) forwards, then one forward and one
// backward alternately, then the remaining backwards.
//  - interleaved-1f1b (Narayanan et al., 2021; Megatron-LM, f = 2): full backwards.
//  - interleaved-zb (PyTorch's ScheduleInterleavedZeroBubble, f = 1): backwards split into
//    I and W; rank r starts its W's r steady steps late and ends with those it still owes.
schedule interleaved(const std::string& name, int p, int m, int v, bool split) {
  if (v < 2) refuse(name, "needs at least 2 stages per rank (use " +
                              std::string(split ? "zb-h1" : "1f1b") + " for one)");
  auto splits = [p](int n) { return n % std::max(1, n / p) == 0; };
  const int rounds = std::max(1, m / p);
  if (!splits(m)) {
    int below = m - 1, above = m + 1;  // the nearest that do (m = p-1 always does: one round)
    while (!splits(below)) --below;
    while (!splits(above)) ++above;
    refuse(name, "needs the microbatches to split into rounds of equal size, floor(m/p) rounds (p=" + std::to_string(p) +
                     ", m=" + std::to_string(m) + "): use m=" + std::to_string(below) + " or m=" + std::to_string(above));
  }
  const int k = m / rounds;  // microbatches per round
  auto s = empty_schedule(name, p, m, v, placement_kind::looped);
  const int total = v * m;
  for (int r = 0; r < p; ++r) {
    auto& out = s.ranks[r];
    std::vector<int> next_f(v, 0), next_b(v, 0);
    std::vector<action> owed_w;
    std::size_t w_done = 0;
    auto forward = [&](int step) {
      const int c = (step / k) % v;
      out.push_back(action{c * p + r, op::F, next_f[c]++});
    };
    auto backward = [&](int step, int warmup) {
      const int c = v - 1 - ((step - warmup) / k) % v;
      const action a{c * p + r, split ? op::I : op::B, next_b[c]++};
      out.push_back(a);
      if (split) owed_w.push_back(action{a.stage, op::W, a.microbatch});
    };
    const int warmup = std::min((v - 1) * k + (split ? 1 : 2) * (p - 1 - r), total);
    for (int step = 0; step < warmup; ++step) forward(step);
    for (int i = 0; i < total - warmup; ++i) {
      forward(warmup + i);
      backward(warmup + i, warmup);
      if (split && i >= r && w_done < owed_w.size()) out.push_back(owed_w[w_done++]);
    }
    for (int step = total; step < total + warmup; ++step) {
      backward(step, warmup);
      if (split && step - warmup >= r && w_done < owed_w.size()) out.push_back(owed_w[w_done++]);
    }
    while (w_done < owed_w.size()) out.push_back(owed_w[w_done++]);
  }
  return s;
}
schedule interleaved_1f1b(int p, int m, int v) { return interleaved("interleaved-1f1b", p, m, v, false); }
schedule interleaved_zb(int p, int m, int v) { return interleaved("interleaved-zb", p, m, v, true); }

// Looped BFS (Lamy-Poirier, 2023, "Breadth-First Pipeline Parallelism"): rank r holds stages
// r, r+p, ...; it runs every microbatch through one stage before the next (all forwards stage by
// stage, then all backwards from its last stage).
schedule looped_bfs(int p, int m, int v) {
  const std::string name = "looped-bfs";
  if (v < 2) refuse(name, "needs at least 2 stages per rank (use gpipe for one)");
  auto s = empty_schedule(name, p, m, v, placement_kind::looped);
  for (int r = 0; r < p; ++r) {
    for (int c = 0; c < v; ++c)
      for (int j = 0; j < m; ++j) s.ranks[r].push_back(action{c * p + r, op::F, j});
    for (int c = v - 1; c >= 0; --c)
      for (int j = 0; j < m; ++j) s.ranks[r].push_back(action{c * p + r, op::B, j});
  }
  return s;
}

// ZB-H1 and ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 3 and its
// reference simulator): rank r runs min(c*(p-1-r), m) warm-up forwards (c = 1 for H1, 2 for H2),
// then per microbatch one F (while any are left), its I, and, from the (c*r)-th such iteration on,
// the oldest owed W; the W's still owed end the rank. The delayed W's fill 1F1B's cool-down (H1)
// and, with twice the warm-up, the warm-up bubble too (H2). The W delay counts from the rank's own
// first I, not from where the warm-up would have ended: with m < p-1-r the warm-up is cut short,
// and holding the W's back further only idles the rank (PyTorch's zero-bubble order for one stage
// per rank, which H1 equals). H2's doubled warm-up pays only once there are microbatches to fill
// it: with m <= 2p-3 it makes the makespan longer than H1's at unit costs (checked for p <= 16,
// m <= 48 in the tests), so zb-h2 is H1's order there.
schedule zero_bubble_h(const std::string& name, int p, int m, int v, int c) {
  if (v != 1) refuse(name, "has one stage per rank; use zb-v for two");
  if (c == 2 && m <= 2 * p - 3) c = 1;
  auto s = empty_schedule(name, p, m, 1, placement_kind::looped);
  for (int r = 0; r < p; ++r) {
    auto& out = s.ranks[r];
    const int warmup = std::min(c * (p - 1 - r), m);
    int w = 0;
    for (int j = 0; j < warmup; ++j) out.push_back(action{r, op::F, j});
    for (int i = 0; i < m; ++i) {
      if (warmup + i < m) out.push_back(action{r, op::F, warmup + i});
      out.push_back(action{r, op::I, i});
      if (i >= c * r) out.push_back(action{r, op::W, w++});
    }
    while (w < m) out.push_back(action{r, op::W, w++});
  }
  return s;
}
schedule zb_h1(int p, int m, int v) { return zero_bubble_h("zb-h1", p, m, v, 1); }
schedule zb_h2(int p, int m, int v) { return zero_bubble_h("zb-h2", p, m, v, 2); }

// ZB-V (Qi et al., section 6; the authors' handcrafted schedule, also PyTorch's
// ScheduleZBVZeroBubble): rank r holds stages r and 2p-1-r. Warm-up: 2(p-r)-1 forwards of the
// first chunk, r pairs (second, first), p-r groups F-I-W of the second chunk; steady state:
// F-I-W of the first chunk, then of the second; cool-down: r pairs of I, p-r of I-W of the
// first chunk, then the W's left. Counters run over max(m, 2p-1) microbatches; those beyond m
// are left out.
schedule zb_v(int p, int m, int v) {
  const std::string name = "zb-v";
  if (v != 2) refuse(name, "places exactly two stages on each rank; use 2 stages per rank");
  auto s = empty_schedule(name, p, m, 2, placement_kind::v_shape);
  const int n = std::max(m, 2 * p - 1);
  for (int r = 0; r < p; ++r) {
    auto& out = s.ranks[r];
    const int stage[2] = {r, 2 * p - 1 - r};
    int next[2][3] = {};  // per chunk: the next F, I and W microbatch
    auto emit = [&](int chunk, op k) {
      int& j = next[chunk][k == op::F ? 0 : k == op::I ? 1 : 2];
      if (j < m) out.push_back(action{stage[chunk], k, j});
      ++j;
    };
    for (int i = 0; i < 2 * (p - r) - 1; ++i) emit(0, op::F);
    for (int i = 0; i < r; ++i) emit(1, op::F), emit(0, op::F);
    for (int i = 0; i < p - r; ++i) emit(1, op::F), emit(1, op::I), emit(1, op::W);
    while (next[1][0] < next[0][0] || next[0][0] < n) {
      if (next[0][0] < n) emit(0, op::F);
      emit(0, op::I), emit(0, op::W), emit(1, op::F), emit(1, op::I), emit(1, op::W);
    }
    for (int i = 0; i < r; ++i) emit(0, op::I), emit(1, op::I);
    for (int i = 0; i < p - r; ++i) emit(0, op::I), emit(0, op::W);
    while (next[1][2] < n) emit(1, op::W);
    while (next[0][2] < n) emit(0, op::W);
  }
  return s;
}

// DualPipe-V (DeepSeek's DualPipeV, the "cut-in-half" DualPipe; also PyTorch's
// ScheduleDualPipeV) on the V placement: eight phases per rank in which a forward of one stage
// overlaps a full backward of the other (OVERLAP_F_B) in the steady state, and the weight
// gradients of the first and last backwards are deferred (zero bubble) into the gaps.
schedule dualpipe_v(int p, int m, int v) {
  const std::string name = "dualpipe-v";
  if (v != 2) refuse(name, "places exactly two stages on each rank; use 2 stages per rank");
  if (m < 2 * p)
    refuse(name, "needs at least 2p microbatches (p=" + std::to_string(p) + "): use m >= " +
                     std::to_string(2 * p));
  auto s = empty_schedule(name, p, m, 2, placement_kind::v_shape);
  for (int r = 0; r < p; ++r) {
    auto& out = s.ranks[r];
    const int s0 = r, s1 = 2 * p - 1 - r;
    std::map<int, int> next_f, next_b;
    std::vector<action> owed_w;  // FIFO of weight gradients deferred by I
    std::size_t w_head = 0;
    auto f = [&](int st, bool overlap = false) {
      action a{st, op::F, next_f[st]++};
      a.overlapped = overlap;
      out.push_back(a);
    };
    auto b = [&](int st, bool split) {
      const int j = next_b[st]++;
      out.push_back(action{st, split ? op::I : op::B, j});
      if (split) owed_w.push_back(action{st, op::W, j});
    };
    auto w = [&] { out.push_back(owed_w.at(w_head++)); };
    for (int i = 0; i < 2 * (p - r - 1); ++i) f(s0);                  // 1: forwards of stage 0
    for (int i = 0; i < r + 1; ++i) f(s0), f(s1);                      // 2: both stages
    for (int i = 0; i < p - r - 1; ++i) b(s1, true), w(), f(s1);       // 3: I W F of stage 1
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {                      // 4: overlapped steady state
      if (i == 0 && r == p - 1) f(s0), b(s1, false);  // the turn of the V: no overlap here
      else f(s0, true), b(s1, false);
      f(s1, true), b(s0, false);
    }
    for (int i = 0; i < p - r - 1; ++i) b(s1, false), f(s1, true), b(s0, false);  // 5
    const int k = (r + 1) / 2;                                         // 6: backwards, W deferred
    bool zb = false;
    for (int i = 0; i <= r; ++i) {
      if (i == k && r % 2 == 1) zb = true;
      b(s1, zb);
      if (i == k && r % 2 == 0) zb = true;
      b(s0, zb);
    }
    for (int i = 0; i < p - r - 1; ++i) w(), b(s0, true);              // 7
    while (w_head < owed_w.size()) w();                                 // 8: the W's still owed
  }
  return s;
}

schedule v_half(int p, int m, int v) { return controllable_memory_v("v-half", p, m, v, true); }
schedule v_min(int p, int m, int v) { return controllable_memory_v("v-min", p, m, v, false); }

struct generator {
  const char* name;
  int default_v;
  schedule (*make)(int, int, int);
  /// Built over at least 2p - 1 microbatches (or a timeline as long), those beyond m left out:
  /// its work, and the cells it is held to, grow as p x max(m, 2p - 1).
  bool padded = false;
};

const generator generators[] = {
    {"gpipe", 1, gpipe},
    {"1f1b", 1, one_f_one_b},
    {"interleaved-1f1b", 2, interleaved_1f1b},
    {"interleaved-zb", 2, interleaved_zb},
    {"looped-bfs", 2, looped_bfs},
    {"zb-h1", 1, zb_h1},
    {"zb-h2", 1, zb_h2},
    {"zb-v", 2, zb_v, true},
    {"dualpipe-v", 2, dualpipe_v},
    {"v-half", 2, v_half, true},
    {"v-min", 2, v_min, true},
};

const generator& find_generator(const std::string& name) {
  for (const auto& g : generators)
    if (name == g.name) return g;
  std::string known;
  for (const auto& g : generators) known += std::string(known.empty() ? "" : ", ") + g.name;
  throw std::invalid_argument("unknown schedule '" + name + "' (known: " + known + ")");
}

}  // namespace

std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (const auto& g : generators) out.emplace_back(g.name);
  return out;
}

int default_virtual_stages(const std::string& name) { return find_generator(name).default_v; }

schedule generate(const std::string& name, int ranks, int microbatches, int virtual_stages) {
  const auto& g = find_generator(name);
  if (ranks < 1) refuse(name, "needs at least one rank");
  if (microbatches < 1) refuse(name, "needs at least one microbatch (--microbatches >= 1)");
  if (virtual_stages < 0) refuse(name, "the number of stages per rank must be positive");
  const int v = virtual_stages == 0 ? g.default_v : virtual_stages;
  // Every (rank, microbatch, virtual stage) holds a few operations: refuse what would not fit
  // in memory instead of failing to allocate it.
  // A padded generator is held to its padded count (p = 20000, m = 1 took 23 GB and was killed).
  constexpr std::int64_t most = max_schedule_cells;
  const std::int64_t built = g.padded ? std::max<std::int64_t>(microbatches, 2 * std::int64_t{ranks} - 1) : microbatches;
  const std::int64_t cells = std::int64_t{ranks} * built * v;
  if (cells > most || cells / ranks / built != v)
    refuse(name, std::to_string(ranks) + " stages x " + std::to_string(built) + " microbatches" +
                     (built != microbatches ? " (it is built over at least 2p - 1)" : "") + " x " + std::to_string(v) +
                     " virtual stages is more than " + std::to_string(most) + " cells (make the schedule smaller)");
  return g.make(ranks, microbatches, v);
}

}  // namespace troupe::pipeline
