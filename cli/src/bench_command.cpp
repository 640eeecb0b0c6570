#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors_bench.hpp"
#include "gpt_bench.hpp"
#include "group_bench.hpp"
#include "nn_bench.hpp"
#include "optim_bench.hpp"
#include "pipeline_bench.hpp"
#include "remote_bench.hpp"
#include "bench_report.hpp"
#include "commands.hpp"

#include <troupe/core/report.hpp>

namespace troupe::cli {

namespace {

struct report_options {
  std::string path;
  std::vector<std::string> anchors;
};

void add_report_options(CLI::App* suite, report_options& r) {
  auto* report = suite->add_option("--report", r.path, "also write the rows as an HTML page (tables and bar charts) to FILE.html");
  suite->add_option("--anchor", r.anchors,
                    "JSON rows of another program's run of the same workloads (CAF's, PyTorch's, ...), shown beside "
                    "troupe's in the report; NAME=FILE names it (default: the file's name)")
      ->needs(report);
}

// Runs a suite; with --report, runs it for its JSON rows, prints them (as JSON with --json, as a
// table otherwise) and writes the page. The anchors are read first, so a bad file costs no run.
int run_reported(const std::string& suite, const report_options& r, bool& json, const std::function<int(std::ostream&)>& run) {
  if (r.path.empty()) return run(std::cout);
  std::vector<std::pair<std::string, std::vector<bench_row>>> anchors;
  try {
    troupe::check_report_path(r.path);
    for (const auto& spec : r.anchors) {
      const auto eq = spec.find('=');
      const std::string file = eq == std::string::npos ? spec : spec.substr(eq + 1);
      std::string name = eq == std::string::npos ? file.substr(file.find_last_of('/') + 1) : spec.substr(0, eq);
      std::ifstream in(file, std::ios::binary);
      if (!in) throw std::invalid_argument("cannot read the anchor's rows " + file);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto rows = parse_bench_rows(text, file);
      if (rows.empty()) throw std::invalid_argument("the anchor's file " + file + " holds no benchmark rows");
      anchors.emplace_back(std::move(name), std::move(rows));
    }
  } catch (const std::exception& e) {
    std::cerr << "troupe bench " << suite << ": " << e.what() << "\n";
    return 1;
  }
  const bool asked_json = json;
  json = true;
  std::ostringstream rows_text;
  const int rc = run(rows_text);
  if (asked_json) std::cout << rows_text.str() << std::flush;
  try {
    const auto rows = parse_bench_rows(rows_text.str(), "troupe bench " + suite);
    if (!asked_json) print_bench_rows(std::cout, rows);
    write_bench_report(r.path, suite, rows, anchors);
  } catch (const std::exception& e) {
    std::cerr << "troupe bench " << suite << ": " << e.what() << "\n";
    return 1;
  }
  return rc;
}

}  // namespace

void add_bench_command(CLI::App& app, int& rc) {
  auto* bench = app.add_subcommand("bench", "run a benchmark suite");
  bench->require_subcommand(1);
  auto opts = std::make_shared<troupe::bench::options>();
  auto* actors = bench->add_subcommand("actors", "the actor runtime: latency, throughput, memory");
  actors->add_flag("--json", opts->json, "one JSON object per line");
  actors->add_flag("--quick", opts->quick, "smaller sizes (for CI)");
  std::string only_help = "run one workload:";
  for (auto* n = troupe::bench::actor_bench_names(); *n; ++n) only_help += std::string(" ") + *n;
  actors->add_option("--only", opts->only, only_help);
  actors->add_option("--threads", opts->threads, "worker threads (default: hardware threads)")
      ->check(CLI::Range(0, 4096));
  auto actors_report = std::make_shared<report_options>();
  add_report_options(actors, *actors_report);
  actors->callback([opts, actors_report, &rc] {
    rc = run_reported("actors", *actors_report, opts->json, [&](std::ostream& out) { return troupe::bench::run_actors(*opts, out); });
  });

  auto remote_opts = std::make_shared<troupe::bench::remote_options>();
  auto* remote = bench->add_subcommand("remote", "two processes on loopback: remote actor calls (sync, async, bulk), remote spawns and failover beside raw TCP ping-pong");
  remote->add_flag("--json", remote_opts->json, "one JSON object per line");
  remote->add_flag("--quick", remote_opts->quick, "smaller sizes (for CI)");
  std::string remote_only = "run one workload:";
  for (auto* n = troupe::bench::remote_bench_names(); *n; ++n) remote_only += std::string(" ") + *n;
  remote->add_option("--only", remote_opts->only, remote_only);
  remote->add_option("--peer", remote_opts->peer)->group("");  // the peer process started by the suite
  auto remote_report = std::make_shared<report_options>();
  add_report_options(remote, *remote_report);
  remote->callback([remote_opts, remote_report, &rc] {
    quiet_info_logs();
    rc = remote_opts->peer.empty()
             ? run_reported("remote", *remote_report, remote_opts->json,
                            [&](std::ostream& out) { return troupe::bench::run_remote(*remote_opts, out); })
             : troupe::bench::run_remote_peer(*remote_opts);
  });

  auto nn_opts = std::make_shared<troupe::bench::options>();
  auto* nn = bench->add_subcommand("nn", "GEMM at the default MLP's shapes, and its training throughput");
  nn->add_flag("--json", nn_opts->json, "one JSON object per line");
  nn->add_flag("--quick", nn_opts->quick, "shorter timings (for CI)");
  nn->add_option("--only", nn_opts->only, "gemm, train, or one GEMM shape");
  auto nn_report = std::make_shared<report_options>();
  add_report_options(nn, *nn_report);
  nn->callback([nn_opts, nn_report, &rc] {
    rc = run_reported("nn", *nn_report, nn_opts->json, [&](std::ostream& out) { return troupe::bench::run_nn(*nn_opts, out); });
  });

  auto gpt_opts = std::make_shared<troupe::bench::gpt_options>();
  auto* gpt = bench->add_subcommand(
      "gpt", "training tokens/s of nanoGPT's CPU configuration (gpt:layers=4,heads=4,embd=128,ctx=64, batch 12), and "
             "each kernel of its step");
  gpt->add_flag("--json", gpt_opts->json, "one JSON object per line");
  gpt->add_flag("--quick", gpt_opts->quick, "20 training steps, shorter kernel timings (for CI)");
  std::string gpt_only = "run one workload: train, pipeline (per schedule on 2 ranks: the measured step against the "
                         "simulator's prediction), kernels, or one kernel:";
  for (auto* n = troupe::bench::gpt_kernel_names(); *n; ++n) gpt_only += std::string(" ") + *n;
  gpt->add_option("--only", gpt_opts->only, gpt_only);
  gpt->add_option("--steps", gpt_opts->steps, "training steps timed")->capture_default_str()->check(CLI::Range(1, 1000000));
  gpt->add_option("--text", gpt_opts->text, "a UTF-8 text file to train on (default: the King James Bible)");
  auto gpt_report = std::make_shared<report_options>();
  add_report_options(gpt, *gpt_report);
  gpt->callback([gpt_opts, gpt_report, &rc] {
    rc = run_reported("gpt", *gpt_report, gpt_opts->json, [&](std::ostream& out) { return troupe::bench::run_gpt(*gpt_opts, out); });
  });

  auto group_opts = std::make_shared<troupe::bench::options>();
  auto* group = bench->add_subcommand("group", "ristretto255 (the project's own, beside libsodium): products, hashing, MSM");
  group->add_flag("--json", group_opts->json, "one JSON object per line");
  group->add_flag("--quick", group_opts->quick, "fewer runs, MSM up to 8,000 points (for CI)");
  group->add_option("--only", group_opts->only, "multiply, base, hash or msm");
  auto group_report = std::make_shared<report_options>();
  add_report_options(group, *group_report);
  group->callback([group_opts, group_report, &rc] {
    rc = run_reported("group", *group_report, group_opts->json, [&](std::ostream& out) { return troupe::bench::run_group(*group_opts, out); });
  });

  auto pipeline_opts = std::make_shared<troupe::bench::pipeline_options>();
  auto* pipe = bench->add_subcommand(
      "pipeline", "pipeline runtime steps per schedule, with and without recomputed activations, against the whole model");
  pipe->add_flag("--json", pipeline_opts->json, "one JSON object per line");
  pipe->add_flag("--quick", pipeline_opts->quick, "3 timed steps per row (for CI)");
  pipe->add_option("--only", pipeline_opts->only, "whole, or one schedule (gpipe, 1f1b, zb-v, ...)");
  pipe->add_option("--threads", pipeline_opts->threads, "the ranks' worker threads (default: hardware threads)")
      ->check(CLI::Range(0, 4096));
  pipe->add_option("--model", pipeline_opts->model, "mlp:IN-H1-...-OUT, cut into the stages by parameter count")
      ->capture_default_str();
  pipe->add_option("--batch", pipeline_opts->batch, "samples per step")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  pipe->add_option("--microbatches", pipeline_opts->microbatches, "microbatches per step (divides --batch)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  pipe->add_option("--ranks", pipeline_opts->ranks, "pipeline ranks")->capture_default_str()->check(CLI::Range(1, 64));
  auto pipeline_report = std::make_shared<report_options>();
  add_report_options(pipe, *pipeline_report);
  pipe->callback([pipeline_opts, pipeline_report, &rc] {
    rc = run_reported("pipeline", *pipeline_report, pipeline_opts->json,
                      [&](std::ostream& out) { return troupe::bench::run_pipeline(*pipeline_opts, out); });
  });

  auto optim_opts = std::make_shared<troupe::bench::optim_options>();
  auto* optim = bench->add_subcommand("optim", "fused optimizer steps per state storage, against memory bandwidth");
  optim->add_flag("--json", optim_opts->json, "one JSON object per line");
  auto quick = std::make_shared<bool>(false);
  optim->add_flag("--quick", *quick, "1 M parameters in 10 tensors, 3 steps (for CI)");
  auto* params = optim->add_option("--params", optim_opts->params, "parameters in all")->capture_default_str();
  auto* tensors = optim->add_option("--tensors", optim_opts->tensors, "tensors they are split into")->capture_default_str();
  auto* steps = optim->add_option("--steps", optim_opts->steps, "timed steps per row (median)")->capture_default_str();
  optim->add_option("--threads", optim_opts->threads, "threads per step (default: all cores)")->check(CLI::Range(1, 4096));
  optim->add_option("--only", optim_opts->only, "sgd, adam or adamw");
  optim->add_flag("--options", optim_opts->options,
                  "also each optimizer's state options (stochastic rounding, AMSGrad, percentiles, block 2048, "
                  "first moment fp32): rows with an \"options\" field");
  optim->add_option("--device", optim_opts->device, "cpu, cuda or cuda:N: where parameters and state live")
      ->capture_default_str();
  auto optim_report = std::make_shared<report_options>();
  add_report_options(optim, *optim_report);
  optim->callback([optim_opts, optim_report, quick, params, tensors, steps, &rc] {
    if (*quick) {  // the CI sizes, where not given explicitly
      if (params->count() == 0) optim_opts->params = 1'000'000;
      if (tensors->count() == 0) optim_opts->tensors = 10;
      if (steps->count() == 0) optim_opts->steps = 3;
    }
    rc = run_reported("optim", *optim_report, optim_opts->json,
                      [&](std::ostream& out) { return troupe::bench::run_optim(*optim_opts, out); });
  });
}

}  // namespace troupe::cli
