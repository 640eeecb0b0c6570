#include <troupe/pipeline/partition_cli.hpp>
#include <troupe/pipeline/profile.hpp>

#include <charconv>
#include <new>
#include <cmath>
#include <iomanip>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "number_text.hpp"

namespace troupe::pipeline {
namespace {


std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// One finite, non-negative number, the whole of `item`; `where` says which item it is.
double parse_number(std::string_view item, const std::string& where) {
  double v = 0;
  // from_chars takes no leading '+'; accept it as people write it.
  std::string_view digits = (!item.empty() && item.front() == '+') ? item.substr(1) : item;
  const auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (res.ec == std::errc::result_out_of_range) {
    throw std::invalid_argument(where + " \"" + std::string(item) +
                                "\" is too large or too close to zero for a double; use another unit");
  }
  if (res.ec != std::errc{} || res.ptr != digits.data() + digits.size() || digits.empty() ||
      digits.front() == '+') {
    throw std::invalid_argument(where + " \"" + std::string(item) +
                                "\" is not a number; write a decimal number such as 2 or 0.5");
  }
  if (!std::isfinite(v)) {
    throw std::invalid_argument(where + " \"" + std::string(item) +
                                "\" is not finite; write a finite number");
  }
  if (v < 0) {
    throw std::invalid_argument(where + " is negative (" + std::string(item) +
                                "); write a number of 0 or more");
  }
  return v == 0 ? 0.0 : v;  // "-0" reads as 0
}

void write_list(std::ostream& out, const std::vector<double>& v) {
  out << '[';
  for (std::size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << format_number(v[i]);
  out << ']';
}

void write_table(std::ostream& out, const partition& p) {
  const bool mem = !p.stage_memory.empty();
  std::ostringstream t;
  t << std::left << std::setw(7) << "stage" << std::setw(12) << "layers" << std::setw(8)
    << "count" << std::setw(14) << "cost";
  if (mem) t << "memory";
  out << trim(t.str()) << '\n';
  for (std::size_t s = 0; s < p.stages(); ++s) {
    std::ostringstream row;
    const std::string layers = std::to_string(p.boundaries[s]) + "-" +
                               std::to_string(p.boundaries[s + 1] - 1);
    row << std::left << std::setw(7) << s << std::setw(12) << layers << std::setw(8)
        << p.stage_size(s) << std::setw(14) << format_number(p.stage_costs[s]);
    if (mem) row << format_number(p.stage_memory[s]);
    out << trim(row.str()) << '\n';
  }
  out << "max stage cost: " << format_number(p.max_cost) << '\n';
}

}  // namespace

std::vector<double> parse_number_list(std::string_view text, std::string_view option) {
  const std::string name(option);
  if (trim(text).empty()) {
    throw std::invalid_argument(name + " is empty; give comma-separated numbers such as 1,2.5,3");
  }
  std::vector<double> out;
  std::size_t start = 0;
  for (std::size_t item = 1;; ++item) {
    const std::size_t comma = text.find(',', start);
    const std::string_view raw =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::string where = name + " item " + std::to_string(item);
    const std::string_view value = trim(raw);
    if (value.empty()) {
      throw std::invalid_argument(where +
                                  " is empty; remove the extra comma or put a number there");
    }
    out.push_back(parse_number(value, where));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string partition_to_json(const partition& p) {
  std::ostringstream out;
  out << "{\"stages\":" << p.stages() << ",\"boundaries\":[";
  for (std::size_t i = 0; i < p.boundaries.size(); ++i) out << (i ? "," : "") << p.boundaries[i];
  out << "],\"stage_costs\":";
  write_list(out, p.stage_costs);
  out << ",\"max_cost\":" << format_number(p.max_cost);
  if (!p.stage_memory.empty()) {
    out << ",\"stage_memory\":";
    write_list(out, p.stage_memory);
  }
  out << '}';
  return out.str();
}

int run_partition_command(const partition_cli_options& opts, std::ostream& out,
                          std::ostream& err) {
  try {
    if (!opts.profile.empty() && !opts.costs.empty())
      throw std::invalid_argument("give --costs or --profile, not both");
    if (opts.profile.empty() && opts.costs.empty())
      throw std::invalid_argument("give the layer costs with --costs c1,c2,... or measure them with --profile MODEL");
    layer_profile profiled;
    if (!opts.profile.empty()) {
      auto model = kernels::make_mlp(opts.profile);
      profiled = profile_layers(*model, opts.batch, opts.repeats);
      err << "profiled " << profiled.names.size() << " layers of " << opts.profile << " (batch "
          << opts.batch << ", median of " << opts.repeats << "):";
      for (std::size_t i = 0; i < profiled.names.size(); ++i)
        err << (i ? "," : "") << " " << profiled.names[i] << " " << format_number(profiled.cost_us[i]) << " us";
      err << '\n';
    }
    const std::vector<double> costs =
        opts.profile.empty() ? parse_number_list(opts.costs, "--costs") : profiled.cost_us;
    if (opts.stages == 0) {
      throw std::invalid_argument("--stages is missing or 0; give a number of stages from 1 to " +
                                  std::to_string(costs.size()));
    }
    if (opts.stages > costs.size()) {
      throw std::invalid_argument("--stages " + std::to_string(opts.stages) + " is more than the " +
                                  std::to_string(costs.size()) +
                                  (opts.profile.empty() ? " layers in --costs" : " layers of " + opts.profile) +
                                  ", which would leave a stage empty; use at "
                                  "most " + std::to_string(costs.size()) + " stages");
    }
    std::vector<double> memory;
    if (!opts.memory.empty()) {
      memory = parse_number_list(opts.memory, "--memory");
      if (memory.size() != costs.size()) {
        throw std::invalid_argument("--memory has " + std::to_string(memory.size()) + " values but " +
                                    (opts.profile.empty() ? "--costs has " + std::to_string(costs.size())
                                                          : opts.profile + " has " + std::to_string(costs.size()) + " layers") +
                                    "; give one memory value per layer");
      }
    }
    std::optional<memory_limit> limit;
    if (!trim(opts.memory_limit).empty()) {
      if (memory.empty()) {
        throw std::invalid_argument(
            "--memory-limit needs --memory m1,m2,... with the memory of every layer");
      }
      limit = memory_limit{memory, parse_number(trim(opts.memory_limit), "--memory-limit")};
    } else if (!opts.memory_limit.empty()) {
      throw std::invalid_argument("--memory-limit is empty; give one number such as 16");
    }

    // Memory without a limit is still worth reporting per stage: the largest double as the
    // limit constrains nothing but still checks that the memory values add up.
    if (!limit && !memory.empty()) limit = memory_limit{memory, std::numeric_limits<double>::max()};
    const partition p = partition_balanced(costs, opts.stages, limit);
    if (opts.json) {
      out << partition_to_json(p) << '\n';
    } else {
      write_table(out, p);
    }
    return 0;
  } catch (const std::bad_alloc&) {
    err << "troupe partition: out of memory (the model or --batch is too large for this machine)\n";
    return 1;
  } catch (const std::exception& e) {
    err << "troupe partition: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace troupe::pipeline
