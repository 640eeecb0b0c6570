// troupe schedule simulate | best: pipeline schedules, generated, validated and simulated.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <troupe/core/file.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/render.hpp>
#include <troupe/pipeline/simulator.hpp>

#include "commands.hpp"

namespace troupe::cli {
namespace {

using namespace troupe::pipeline;

struct schedule_options {
  std::string name;
  int stages = 0;
  int microbatches = 0;
  int virtual_stages = 0;
  std::string cost = "F=1,B=2,I=1,W=1,comm=0";
  bool json = false;
  double memory_limit = 0;
  std::string checkpoint = "none";
  int layers = 1;
  bool layers_given = false;
  std::string format = "ascii";
  std::string out;
  std::string stage_costs;
};

/// The cost model of the options: uniform costs, or one cost list per stage.
cost_model costs_of(const schedule_options& o) {
  cost_model m = cost_model::parse(o.cost);
  std::string_view rest = o.stage_costs;
  while (!rest.empty()) {
    auto semi = rest.find(';');
    m.per_stage.push_back(cost_model::parse(rest.substr(0, semi)).uniform);
    rest = semi == std::string_view::npos ? std::string_view{} : rest.substr(semi + 1);
  }
  return m;
}

/// The schedule with the requested activation checkpointing applied.
schedule prepared(schedule s, const schedule_options& o) {
  const auto policy = checkpoint_policy::parse(o.checkpoint);
  if (policy.mode == checkpoint_policy::kind::none) {
    if (o.layers_given) throw std::invalid_argument("--layers counts the layers for --checkpoint: give both");
    return s;
  }
  return with_checkpointing(s, policy, o.layers);
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string simulation_json(const schedule& s, const simulation& sim) {
  std::ostringstream out;
  out << "{\"schedule\":\"" << s.name << "\",\"stages\":" << s.place.ranks
      << ",\"microbatches\":" << s.microbatches << ",\"virtual\":" << s.place.stages_per_rank
      << ",\"makespan\":" << number(sim.makespan.to_double()) << ",\"makespan_exact\":\""
      << sim.makespan.str() << "\",\"bubble\":" << number(sim.bubble)
      << ",\"bubble_span\":" << number(sim.bubble_span) << ",\"peak_activations\":[";
  for (std::size_t r = 0; r < sim.peak_activations.size(); ++r)
    out << (r ? "," : "") << number(sim.peak_activations[r]);
  out << "]}";
  return out.str();
}

double peak_of(const simulation& sim) {
  return *std::max_element(sim.peak_activations.begin(), sim.peak_activations.end());
}

int simulate_command(const schedule_options& o) {
  auto s = prepared(generate(o.name, o.stages, o.microbatches, o.virtual_stages), o);
  auto sim = simulate(s, costs_of(o));
  if (o.json) {
    std::cout << simulation_json(s, sim) << "\n";
    return 0;
  }
  std::cout << s.name << ": p=" << s.place.ranks << " m=" << s.microbatches
            << " v=" << s.place.stages_per_rank << "\n"
            << "  makespan     " << sim.makespan.str() << " (" << number(sim.makespan.to_double())
            << ")\n"
            << "  bubble       " << number(sim.bubble) << "  (1 - busy / (p x makespan))\n"
            << "  bubble_span  " << number(sim.bubble_span) << "  (the Zero Bubble paper's rate)\n"
            << "  peak activations per rank:";
  for (double a : sim.peak_activations) std::cout << " " << number(a);
  std::cout << "\n";
  return 0;
}

int show_command(const schedule_options& o) {
  const auto format = parse_render_format(o.format);
  auto s = prepared(generate(o.name, o.stages, o.microbatches, o.virtual_stages), o);
  auto sim = simulate(s, costs_of(o));
  render_options ropts;
  ropts.color = format == render_format::ascii && o.out.empty() && isatty(STDOUT_FILENO);
  const std::string text = render(s, sim, format, ropts);
  if (o.out.empty()) {
    std::cout << text;
    return 0;
  }
  // Atomically: a failed write (a full disk) leaves the file that was there.
  write_file_atomically(o.out, std::as_bytes(std::span<const char>(text)));
  std::cerr << "wrote " << o.out << " (" << text.size() << " bytes)\n";
  return 0;
}

int best_command(const schedule_options& o) {
  if (!(o.memory_limit > 0) || !std::isfinite(o.memory_limit))
    throw std::invalid_argument("--memory-limit must be positive (in microbatch activations per rank)");
  // Every (schedule, v <= 4) is simulated, one at a time: bound the total work up front (the
  // cells of all candidates together) instead of running for minutes.
  const auto names = schedule_names();
  constexpr std::int64_t budget = 16 * max_schedule_cells;
  const std::int64_t most = budget / ((1 + 2 + 3 + 4) * static_cast<std::int64_t>(names.size()));
  if (std::int64_t{o.stages} * o.microbatches > most)
    throw std::invalid_argument("schedule best simulates " + std::to_string(names.size()) +
                                " schedules at v = 1..4: --stages x --microbatches must be at most " +
                                std::to_string(most) +
                                " (simulate a single schedule with `schedule simulate` for larger shapes)");
  const auto costs = costs_of(o);
  struct row {
    std::string name;
    int v;
    rational makespan;
    double bubble, peak;
  };
  auto faster = [](const row& a, const row& b) {
    if (a.makespan != b.makespan) return a.makespan < b.makespan;
    return a.peak < b.peak;
  };
  std::vector<row> rows;
  std::optional<std::pair<schedule, simulation>> pick;  // the fastest that fits so far
  std::optional<row> pick_row;
  std::string first_refusal;
  for (const auto& name : names) {
    for (int v = 1; v <= 4; ++v) {
      std::optional<schedule> c;
      try {
        c = generate(name, o.stages, o.microbatches, v);
      } catch (const std::invalid_argument& e) {  // a shape this schedule cannot take
        if (first_refusal.empty()) first_refusal = e.what();
        continue;
      }
      if (!costs.per_stage.empty() && static_cast<std::size_t>(c->stages()) != costs.per_stage.size()) {
        if (first_refusal.empty())
          first_refusal = "--stage-costs gives " + std::to_string(costs.per_stage.size()) +
                          " stages; the candidates for --stages " + std::to_string(o.stages) + " have " +
                          std::to_string(o.stages) + ", " + std::to_string(2 * o.stages) + ", " +
                          std::to_string(3 * o.stages) + " or " + std::to_string(4 * o.stages);
        continue;  // another stage count than the costs describe
      }
      auto sc = prepared(std::move(*c), o);
      auto sim = simulate(sc, costs);
      const row r{sc.name, sc.place.stages_per_rank, sim.makespan, sim.bubble, peak_of(sim)};
      rows.push_back(r);
      if (r.peak <= o.memory_limit && (!pick_row || faster(r, *pick_row))) {
        pick_row = r;
        pick.emplace(std::move(sc), std::move(sim));
      }
    }
  }
  if (rows.empty()) throw std::invalid_argument("no schedule can be made: " + first_refusal);
  std::stable_sort(rows.begin(), rows.end(), faster);
  if (o.json) {
    if (!pick) {
      std::cout << "{\"schedule\":null,\"reason\":\"no schedule fits the memory limit\"}\n";
      return 1;
    }
    std::cout << simulation_json(pick->first, pick->second) << "\n";
    return 0;
  }
  std::printf("%-18s %3s %12s %9s %12s %6s\n", "schedule", "v", "makespan", "bubble", "peak_act",
              "fits");
  for (const auto& r : rows)
    std::printf("%-18s %3d %12s %9.4f %12s %6s\n", r.name.c_str(), r.v, number(r.makespan.to_double()).c_str(),
                r.bubble, number(r.peak).c_str(), r.peak <= o.memory_limit ? "yes" : "no");
  if (!pick_row) {
    double smallest = rows.front().peak;
    for (const auto& r : rows) smallest = std::min(smallest, r.peak);
    std::cout << "\nno schedule keeps its peak activations within " << number(o.memory_limit)
              << "; raise --memory-limit to at least " << number(smallest) << "\n";
    return 1;
  }
  std::cout << "\nbest: " << pick_row->name << " (v=" << pick_row->v
            << "): the shortest simulated makespan (" << number(pick_row->makespan.to_double())
            << ") among the schedules whose peak activations (" << number(pick_row->peak)
            << ") fit the limit of " << number(o.memory_limit) << "\n";
  const row& fastest = rows.front();
  if (fastest.makespan < pick_row->makespan)
    std::cout << "      " << fastest.name << " would be faster (" << number(fastest.makespan.to_double())
              << ") but holds " << number(fastest.peak) << " activations\n";
  return 0;
}

template <class F>
auto guarded(F f) {
  return [f](int& rc) {
    try {
      rc = f();
    } catch (const std::exception& e) {
      std::cerr << "troupe schedule: " << e.what() << "\n";
      rc = 1;
    }
  };
}

void add_shape_options(CLI::App* c, schedule_options& o, bool with_name, bool with_json) {
  if (with_name) {
    std::string names;
    for (const auto& n : schedule_names()) names += (names.empty() ? "" : ", ") + n;
    c->add_option("--schedule", o.name, "one of: " + names)->required();
  }
  c->add_option("--stages", o.stages, "pipeline ranks p")->required()->check(positive_number);
  c->add_option("--microbatches", o.microbatches, "microbatches m")->required()->check(positive_number);
  auto* cost = c->add_option("--cost", o.cost,
                             "per-action costs of a rank's whole shard, e.g. F=1,B=2,I=1,W=1,comm=0")
                   ->capture_default_str();
  c->add_option("--stage-costs", o.stage_costs,
                "one cost list per model stage, ';'-separated (e.g. F=1,B=2;F=2,B=4): that stage's own "
                "costs, in place of --cost (a cost not given takes its default); schedule best tries "
                "only the candidates with that many stages")
      ->excludes(cost);
  c->add_option("--checkpoint", o.checkpoint, "activation checkpointing: none, every:N or sqrt")
      ->capture_default_str();
  c->add_option("--layers", o.layers, "layers per stage, for --checkpoint")
      ->capture_default_str()
      ->check(positive_number)
      ->each([&o](const std::string&) { o.layers_given = true; });
  if (with_json) c->add_flag("--json", o.json, "one JSON object");
}

}  // namespace

void add_schedule_command(CLI::App& app, int& rc) {
  auto* cmd = app.add_subcommand("schedule", "pipeline schedules: simulate, draw, pick the best");
  cmd->require_subcommand(1);

  auto sim_opts = std::make_shared<schedule_options>();
  auto* sim = cmd->add_subcommand("simulate", "validate and simulate one schedule");
  add_shape_options(sim, *sim_opts, true, true);
  sim->add_option("--virtual", sim_opts->virtual_stages, "stages per rank (default: the schedule's)");
  sim->callback([sim_opts, &rc] { guarded([sim_opts] { return simulate_command(*sim_opts); })(rc); });

  auto show_opts = std::make_shared<schedule_options>();
  auto* show = cmd->add_subcommand("show", "draw a schedule's timeline");
  add_shape_options(show, *show_opts, true, false);
  show->add_option("--virtual", show_opts->virtual_stages, "stages per rank (default: the schedule's)");
  show->add_option("--format", show_opts->format, "ascii, csv, svg or chrome")->capture_default_str();
  show->add_option("--out", show_opts->out, "write to this file instead of the terminal");
  show->callback([show_opts, &rc] { guarded([show_opts] { return show_command(*show_opts); })(rc); });

  auto best_opts = std::make_shared<schedule_options>();
  auto* best = cmd->add_subcommand(
      "best", "the schedule with the shortest makespan whose peak activations fit a limit");
  add_shape_options(best, *best_opts, false, true);
  best->add_option("--memory-limit", best_opts->memory_limit,
                   "most activations a rank may hold, in microbatches through its whole shard")
      ->required();
  best->callback([best_opts, &rc] { guarded([best_opts] { return best_command(*best_opts); })(rc); });
}

}  // namespace troupe::cli
