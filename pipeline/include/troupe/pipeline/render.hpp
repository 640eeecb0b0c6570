#pragma once
/// @file
/// Pictures of a simulated schedule: the timeline that `troupe schedule show` draws.
///
/// - ascii: one line per rank. Time is cut into cells of one exact width, the greatest
///   rational that divides every start and end time, so the shortest action is one cell and
///   nothing is rounded. A cell is as many characters as the longest label (`F7`, `B12`); an
///   action shows its letter and microbatch in its first cell, `.` is idle. A timeline wider than
///   render_options::max_columns gets a coarser, round cell (k x 10^e time units) that shows
///   each cell's longest action, and the header says so.
///   Letters: F forward, B backward, I backward for inputs, W backward for weights, R recompute;
///   with v > 1 the letter is lower case on odd chunks (the rank's 2nd, 4th, ... stage).
/// - csv: to_csv(s), PyTorch's format.
/// - svg: a standalone picture like the figures of the Zero Bubble paper: one row per rank,
///   boxes at their exact times, coloured per kind (a lighter to darker shade per chunk when
///   v > 1), the microbatch number in each box, a time axis and a title with the bubble.
/// - chrome: Chrome trace JSON (`{"traceEvents":[...]}`) for Perfetto or chrome://tracing: one
///   complete ("X") event per compute action on pid 0, tid = rank, with one cost unit drawn as
///   1000 us (1 ms), so a schedule with unit costs reads in milliseconds.
///
/// Send and receive actions take no time and are not drawn.

#include <string>
#include <string_view>
#include <vector>

#include "troupe/pipeline/schedule.hpp"
#include "troupe/pipeline/simulator.hpp"

namespace troupe::pipeline {

/// What render() writes.
enum class render_format { ascii, csv, svg, chrome };

/// The names parse_render_format() knows, in declaration order: ascii, csv, svg, chrome.
std::vector<std::string> render_format_names();

/// Reads a format name (exact, lower case); throws std::invalid_argument listing the formats.
render_format parse_render_format(std::string_view name);

struct render_options {
  bool color = false;      ///< ANSI background colours for ascii (for a terminal)
  int max_columns = 400;   ///< ascii: widest timeline, in characters, before scaling down
  /// svg: what one time unit is ("us" for a measured step, as_simulation's unit); empty: cost
  /// units of a simulated schedule.
  std::string time_unit;
};

/// Draws `sim`, the simulation of `s`, in format `f`. Throws std::invalid_argument when `sim`
/// does not have one timeline per rank of `s`.
std::string render(const schedule& s, const simulation& sim, render_format f,
                   const render_options& options = {});

}  // namespace troupe::pipeline
