#include "troupe/pipeline/schedule.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace troupe::pipeline {
namespace {

struct op_name {
  op kind;
  std::string_view text;
};
// Longest names first so that parsing never takes a prefix.
constexpr op_name op_names[] = {
    {op::recompute, "RECOMPUTE"}, {op::send_f, "SEND_F"}, {op::recv_f, "RECV_F"},
    {op::send_b, "SEND_B"},       {op::recv_b, "RECV_B"}, {op::F, "F"},
    {op::B, "B"},                 {op::I, "I"},           {op::W, "W"},
};

bool read_int(std::string_view s, int& out) {
  if (s.empty()) return false;  // from_chars reports a value beyond int
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// PyTorch's actions for sharded parameters (UNSHARD, RESHARD: FSDP gathers a stage's weights
// before use and frees them after) and for data-parallel gradients (REDUCE_GRAD). A troupe stage
// holds its whole weights, and reducing gradients across replicas of a stage is not a step of its
// plan, so reading a schedule skips these: `2UNSHARD`, `0RESHARD`, `1REDUCE_GRAD`, with or without a
// microbatch number after the name.
bool is_skipped_action(std::string_view cell) {
  std::size_t i = 0;
  while (i < cell.size() && cell[i] >= '0' && cell[i] <= '9') ++i;
  if (i == 0) return false;
  for (std::string_view name : {"UNSHARD", "RESHARD", "REDUCE_GRAD"}) {
    if (cell.substr(i, name.size()) != name) continue;
    std::size_t j = i + name.size();
    if (j == cell.size()) return true;
    int mb = 0;
    return read_int(cell.substr(j), mb);
  }
  return false;
}

}  // namespace

std::string to_string(op k) {
  for (const auto& n : op_names)
    if (n.kind == k) return std::string(n.text);
  return "?";
}

std::string to_string(const action& a) {
  return std::to_string(a.stage) + to_string(a.kind) + std::to_string(a.microbatch);
}

action parse_action(std::string_view text) {
  const std::string_view t = trim(text);
  std::size_t i = 0;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
  action a;
  if (!read_int(t.substr(0, i), a.stage))
    throw std::invalid_argument("action '" + std::string(text) +
                                "' does not start with a stage number (expected e.g. 2F0)");
  for (const auto& n : op_names) {
    if (t.substr(i, n.text.size()) == n.text) {
      a.kind = n.kind;
      if (!read_int(t.substr(i + n.text.size()), a.microbatch))
        throw std::invalid_argument("action '" + std::string(text) +
                                    "' does not end with a microbatch number (expected e.g. 2F0)");
      return a;
    }
  }
  throw std::invalid_argument("action '" + std::string(text) +
                              "' has no known type (F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, "
                              "RECOMPUTE; a schedule file may also hold UNSHARD, RESHARD and "
                              "REDUCE_GRAD, which reading skips)");
}

int placement::rank_of(int stage) const noexcept {
  if (kind == placement_kind::v_shape) {
    return stage < ranks ? stage : 2 * ranks - 1 - stage;
  }
  return stage % ranks;
}

int placement::chunk_of(int stage) const noexcept {
  if (kind == placement_kind::v_shape) return stage < ranks ? 0 : 1;
  return stage / ranks;
}

std::vector<int> placement::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < stages(); ++s)
    if (rank_of(s) == rank) out.push_back(s);
  return out;
}

bool schedule::split_backward() const noexcept {
  for (const auto& r : ranks)
    for (const auto& a : r)
      if (a && (a->kind == op::I || a->kind == op::W)) return true;
  return false;
}

bool schedule::lowered() const noexcept {
  for (const auto& r : ranks)
    for (const auto& a : r)
      if (a && !is_compute(a->kind)) return true;
  return false;
}

std::string to_csv(const schedule& s) {
  std::string out;
  for (const auto& r : s.ranks) {
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (i) out += ',';
      if (!r[i]) continue;
      if (r[i]->overlapped && i + 1 < r.size() && r[i + 1]) {
        out += "(" + to_string(*r[i]) + ";" + to_string(*r[i + 1]) + ")OVERLAP_F_B";
        ++i;
      } else {
        out += to_string(*r[i]);
      }
    }
    out += '\n';
  }
  return out;
}

std::string to_text(const schedule& s) {
  std::string out;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (const auto& a : s.ranks[r]) out += " " + (a ? to_string(*a) : std::string("-"));
    out += '\n';
  }
  return out;
}

schedule from_csv(std::string_view text, std::string name) {
  schedule s;
  s.name = std::move(name);
  std::istringstream in{std::string(text)};
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (trim(line).empty()) continue;
    std::vector<std::optional<action>> row;
    std::string_view rest = line;
    for (;;) {
      auto comma = rest.find(',');
      auto cell = trim(rest.substr(0, comma));
      if (cell.empty()) {
        row.emplace_back(std::nullopt);
      } else if (is_skipped_action(cell)) {
        // Not a step of troupe's plan (see is_skipped_action): it takes no slot.
      } else if (cell.front() == '(') {
        // (a;b)OVERLAP_F_B: the commas of a CSV cell never occur inside it.
        constexpr std::string_view suffix = ")OVERLAP_F_B";
        const auto semi = cell.find(';');
        if (semi == std::string_view::npos || cell.size() < suffix.size() + 4 ||
            cell.substr(cell.size() - suffix.size()) != suffix)
          throw std::invalid_argument("CSV line " + std::to_string(line_no) + ": '" +
                                      std::string(cell) + "' is not (a;b)OVERLAP_F_B");
        try {
          action first = parse_action(cell.substr(1, semi - 1));
          first.overlapped = true;
          row.emplace_back(first);
          row.emplace_back(parse_action(cell.substr(semi + 1, cell.size() - suffix.size() - semi - 1)));
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument("CSV line " + std::to_string(line_no) + ": " + e.what());
        }
      } else {
        try {
          row.emplace_back(parse_action(cell));
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument("CSV line " + std::to_string(line_no) + ": " + e.what());
        }
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    // A trailing idle cell carries no meaning.
    while (!row.empty() && !row.back()) row.pop_back();
    s.ranks.push_back(std::move(row));
  }
  if (s.ranks.empty()) throw std::invalid_argument("CSV schedule has no rows (one row per rank)");
  const int p = static_cast<int>(s.ranks.size());

  // Infer the stages each rank holds, the microbatch count and the placement.
  std::map<int, std::set<int>> stage_ranks;
  int max_stage = -1, max_mb = -1;
  for (int r = 0; r < p; ++r) {
    for (const auto& a : s.ranks[r]) {
      if (!a || !is_compute(a->kind)) continue;
      stage_ranks[a->stage].insert(r);
      max_stage = std::max(max_stage, a->stage);
      max_mb = std::max(max_mb, a->microbatch);
      if (max_stage == std::numeric_limits<int>::max() || max_mb == std::numeric_limits<int>::max())
        throw std::invalid_argument("CSV schedule: stage or microbatch number " + std::to_string(std::max(max_stage, max_mb)) +
                                    " is too large");
    }
  }
  if (max_stage < 0) throw std::invalid_argument("CSV schedule has no compute actions");
  // Older PyTorch files wrote the backward for inputs as B next to its W: read such a B as I.
  std::set<std::pair<int, int>> has_w;
  for (const auto& row : s.ranks)
    for (const auto& a : row)
      if (a && a->kind == op::W) has_w.insert({a->stage, a->microbatch});
  for (auto& row : s.ranks)
    for (auto& a : row)
      if (a && a->kind == op::B && has_w.count({a->stage, a->microbatch})) a->kind = op::I;
  const int stages = max_stage + 1;
  if (stages % p != 0)
    throw std::invalid_argument("CSV schedule has " + std::to_string(stages) + " stages on " +
                                std::to_string(p) + " ranks: not a whole number of stages per rank");
  s.microbatches = max_mb + 1;
  for (placement_kind kind : {placement_kind::looped, placement_kind::v_shape}) {
    placement pl{p, stages / p, kind};
    if (kind == placement_kind::v_shape && pl.stages_per_rank != 2) continue;
    bool fits = true;
    for (const auto& [stage, rs] : stage_ranks)
      if (rs.size() != 1 || *rs.begin() != pl.rank_of(stage)) fits = false;
    if (fits && static_cast<int>(stage_ranks.size()) == stages) {
      s.place = pl;
      return s;
    }
  }
  throw std::invalid_argument(
      "CSV schedule: its stages are placed neither looped (rank r holds r, r+p, ...) nor V-shaped "
      "(rank r holds r and 2p-1-r), or a stage appears on two ranks or on none");
}

checkpoint_policy checkpoint_policy::parse(std::string_view text) {
  checkpoint_policy p;
  if (text == "none") return p;
  if (text == "sqrt") {
    p.mode = kind::sqrt;
    return p;
  }
  if (text.substr(0, 6) == "every:" && read_int(text.substr(6), p.every) && p.every >= 1) {
    p.mode = kind::every_n;
    return p;
  }
  throw std::invalid_argument("checkpoint policy '" + std::string(text) +
                              "' is not one of: none, every:N (N >= 1), sqrt");
}

rational checkpoint_policy::kept(int layers) const {
  if (layers < 1) throw std::invalid_argument("a stage needs at least one layer to checkpoint");
  switch (mode) {
    case kind::none: return rational(1);
    case kind::every_n: return rational(layers / every + (layers % every != 0 ? 1 : 0), layers);
    case kind::sqrt: {
      std::int64_t root = 1;
      while (root * root < layers) ++root;  // ceil(sqrt(L)), in 64 bits: no overflow for any int L
      return rational(root, layers);
    }
  }
  return rational(1);
}

schedule with_checkpointing(const schedule& s, const checkpoint_policy& policy, int layers_per_stage) {
  if (s.lowered())
    throw std::invalid_argument("apply checkpointing before lowering (the schedule has sends)");
  const rational kept = policy.kept(layers_per_stage);
  schedule out = s;
  out.activation_kept.assign(s.stages(), kept);
  if (kept == rational(1)) return out;
  for (auto& row : out.ranks) {
    std::vector<std::optional<action>> next;
    next.reserve(row.size() * 3 / 2);
    for (const auto& a : row) {
      if (a && (a->kind == op::B || a->kind == op::I)) {
        // Before the backward, or before the overlapped pair the backward closes: a pair stays
        // one step (its recompute inside it would take the forward's place).
        const bool closes_pair = !next.empty() && next.back() && next.back()->overlapped;
        next.insert(closes_pair ? next.end() - 1 : next.end(), action{a->stage, op::recompute, a->microbatch});
      }
      next.push_back(a);
    }
    row = std::move(next);
  }
  return out;
}

schedule lower(const schedule& s) {
  if (s.place.ranks < 1 || s.place.stages_per_rank < 1)
    throw std::invalid_argument("lower: the schedule's placement needs at least one rank and one stage per rank");
  if (s.lowered()) return s;
  schedule out = s;
  const auto& pl = s.place;
  const int last = s.stages() - 1;
  std::set<std::pair<int, int>> recomputed;
  for (const auto& r : s.ranks)
    for (const auto& a : r)
      if (a && a->kind == op::recompute) recomputed.insert({a->stage, a->microbatch});
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    auto& row = out.ranks[r];
    row.clear();
    std::vector<action> sends_after_pair;  // an overlapped pair stays adjacent: its sends follow it
    for (const auto& a : s.ranks[r]) {
      if (!a) {
        row.emplace_back(std::nullopt);
        continue;
      }
      const bool in_pair = a->overlapped || (!row.empty() && row.back() && row.back()->overlapped);
      const int rank = static_cast<int>(r);
      // Receive what this action needs from another rank, right before it. A recomputation
      // waits for the gradient too, so it takes the receive in front of its backward.
      if (a->kind == op::F && a->stage > 0 && pl.rank_of(a->stage - 1) != rank)
        row.emplace_back(action{a->stage, op::recv_f, a->microbatch});
      const bool backward = a->kind == op::B || a->kind == op::I;
      if ((a->kind == op::recompute || (backward && !recomputed.count({a->stage, a->microbatch}))) &&
          a->stage < last && pl.rank_of(a->stage + 1) != rank)
        row.emplace_back(action{a->stage, op::recv_b, a->microbatch});
      if (in_pair && !a->overlapped) {
        // The second of a pair: its receive must come before the first.
        if (!row.empty() && row.back() && !is_compute(row.back()->kind)) {
          auto recv = *row.back();
          row.pop_back();
          auto first = *row.back();
          row.pop_back();
          row.emplace_back(recv);
          row.emplace_back(first);
        }
      }
      row.emplace_back(a);
      // Send what another rank needs, right after producing it (after the pair, for a pair).
      std::vector<action> sends;
      if (a->kind == op::F && a->stage < last && pl.rank_of(a->stage + 1) != rank)
        sends.push_back(action{a->stage, op::send_f, a->microbatch});
      if ((a->kind == op::B || a->kind == op::I) && a->stage > 0 &&
          pl.rank_of(a->stage - 1) != rank)
        sends.push_back(action{a->stage, op::send_b, a->microbatch});
      if (a->overlapped) {
        sends_after_pair = std::move(sends);
        continue;
      }
      for (auto& x : sends_after_pair) row.emplace_back(x);
      sends_after_pair.clear();
      for (auto& x : sends) row.emplace_back(x);
    }
  }
  return out;
}

}  // namespace troupe::pipeline
