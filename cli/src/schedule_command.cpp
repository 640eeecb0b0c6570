// troupe schedule simulate | best: pipeline schedules, generated, validated and simulated.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fstream>

#include <unistd.h>

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
  if (policy.mode == checkpoint_policy::kind::none) return s;
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
  std::ofstream f(o.out, std::ios::binary);
  if (!f) throw std::invalid_argument("cannot write '" + o.out + "'");
  f << text;
  if (!f.flush()) throw std::invalid_argument("writing '" + o.out + "' failed");
  std::cerr << "wrote " << o.out << " (" << text.size() << " bytes)\n";
  return 0;
}

/// Every (schedule, v) worth trying for p and m; refusals are skipped, and when every one is
/// refused the first refusal is the error.
std::vector<schedule> candidates(int p, int m) {
  std::vector<schedule> out;
  std::string first_refusal;
  for (const auto& name : schedule_names()) {
    for (int v = 1; v <= 4; ++v) {
      try {
        out.push_back(generate(name, p, m, v));
      } catch (const std::invalid_argument& e) {
        if (first_refusal.empty()) first_refusal = e.what();
      }
    }
  }
  if (out.empty()) throw std::invalid_argument("no schedule can be made: " + first_refusal);
  return out;
}

int best_command(const schedule_options& o) {
  if (!(o.memory_limit > 0) || !std::isfinite(o.memory_limit))
    throw std::invalid_argument("--memory-limit must be positive (in microbatch activations per rank)");
  const auto costs = costs_of(o);
  struct row {
    schedule s;
    simulation sim;
  };
  std::vector<row> rows;
  for (auto& c : candidates(o.stages, o.microbatches)) {
    auto s = prepared(std::move(c), o);
    auto sim = simulate(s, costs);
    rows.push_back({std::move(s), std::move(sim)});
  }
  std::sort(rows.begin(), rows.end(), [](const row& a, const row& b) {
    if (a.sim.makespan != b.sim.makespan) return a.sim.makespan < b.sim.makespan;
    return peak_of(a.sim) < peak_of(b.sim);
  });
  const row* pick = nullptr;
  for (const auto& r : rows)
    if (peak_of(r.sim) <= o.memory_limit) {
      pick = &r;
      break;
    }
  if (o.json) {
    if (!pick) {
      std::cout << "{\"schedule\":null,\"reason\":\"no schedule fits the memory limit\"}\n";
      return 1;
    }
    std::cout << simulation_json(pick->s, pick->sim) << "\n";
    return 0;
  }
  std::printf("%-18s %3s %12s %9s %12s %6s\n", "schedule", "v", "makespan", "bubble", "peak_act",
              "fits");
  for (const auto& r : rows)
    std::printf("%-18s %3d %12s %9.4f %12s %6s\n", r.s.name.c_str(), r.s.place.stages_per_rank,
                number(r.sim.makespan.to_double()).c_str(), r.sim.bubble,
                number(peak_of(r.sim)).c_str(), peak_of(r.sim) <= o.memory_limit ? "yes" : "no");
  if (!pick) {
    double smallest = peak_of(rows.front().sim);
    for (const auto& r : rows) smallest = std::min(smallest, peak_of(r.sim));
    std::cout << "\nno schedule keeps its peak activations within " << number(o.memory_limit)
              << "; raise --memory-limit to at least " << number(smallest) << "\n";
    return 1;
  }
  std::cout << "\nbest: " << pick->s.name << " (v=" << pick->s.place.stages_per_rank
            << "): the shortest simulated makespan (" << number(pick->sim.makespan.to_double())
            << ") among the schedules whose peak activations (" << number(peak_of(pick->sim))
            << ") fit the limit of " << number(o.memory_limit) << "\n";
  if (&rows.front() != pick)
    std::cout << "      " << rows.front().s.name << " would be faster ("
              << number(rows.front().sim.makespan.to_double()) << ") but holds "
              << number(peak_of(rows.front().sim)) << " activations\n";
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

void add_shape_options(CLI::App* c, schedule_options& o, bool with_name) {
  if (with_name) {
    std::string names;
    for (const auto& n : schedule_names()) names += (names.empty() ? "" : ", ") + n;
    c->add_option("--schedule", o.name, "one of: " + names)->required();
  }
  c->add_option("--stages", o.stages, "pipeline ranks p")->required()->check(positive_number);
  c->add_option("--microbatches", o.microbatches, "microbatches m")->required()->check(positive_number);
  c->add_option("--cost", o.cost,
                "per-action costs of a rank's whole shard, e.g. F=1,B=2,I=1,W=1,comm=0")
      ->capture_default_str();
  c->add_option("--stage-costs", o.stage_costs,
                "one cost list per stage, ';'-separated (e.g. F=1,B=2;F=2,B=4): that stage's own "
                "costs, overriding --cost");
  c->add_option("--checkpoint", o.checkpoint, "activation checkpointing: none, every:N or sqrt")
      ->capture_default_str();
  c->add_option("--layers", o.layers, "layers per stage, for --checkpoint")
      ->capture_default_str()
      ->check(positive_number);
  c->add_flag("--json", o.json, "one JSON object");
}

}  // namespace

void add_schedule_command(CLI::App& app, int& rc) {
  auto* cmd = app.add_subcommand("schedule", "pipeline schedules: simulate, draw, pick the best");
  cmd->require_subcommand(1);

  auto sim_opts = std::make_shared<schedule_options>();
  auto* sim = cmd->add_subcommand("simulate", "validate and simulate one schedule");
  add_shape_options(sim, *sim_opts, true);
  sim->add_option("--virtual", sim_opts->virtual_stages, "stages per rank (default: the schedule's)");
  sim->callback([sim_opts, &rc] { guarded([sim_opts] { return simulate_command(*sim_opts); })(rc); });

  auto show_opts = std::make_shared<schedule_options>();
  auto* show = cmd->add_subcommand("show", "draw a schedule's timeline");
  add_shape_options(show, *show_opts, true);
  show->add_option("--virtual", show_opts->virtual_stages, "stages per rank (default: the schedule's)");
  show->add_option("--format", show_opts->format, "ascii, csv, svg or chrome")->capture_default_str();
  show->add_option("--out", show_opts->out, "write to this file instead of the terminal");
  show->callback([show_opts, &rc] { guarded([show_opts] { return show_command(*show_opts); })(rc); });

  auto best_opts = std::make_shared<schedule_options>();
  auto* best = cmd->add_subcommand(
      "best", "the schedule with the shortest makespan whose peak activations fit a limit");
  add_shape_options(best, *best_opts, false);
  best->add_option("--memory-limit", best_opts->memory_limit,
                   "most activations a rank may hold, in microbatches through its whole shard")
      ->required();
  best->callback([best_opts, &rc] { guarded([best_opts] { return best_command(*best_opts); })(rc); });
}

}  // namespace troupe::cli
