#include <iostream>
#include <memory>
#include <string>

#include "actors_bench.hpp"
#include "group_bench.hpp"
#include "nn_bench.hpp"
#include "optim_bench.hpp"
#include "pipeline_bench.hpp"
#include "remote_bench.hpp"
#include "commands.hpp"

namespace troupe::cli {

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
  actors->callback([opts, &rc] { rc = troupe::bench::run_actors(*opts, std::cout); });

  auto remote_opts = std::make_shared<troupe::bench::remote_options>();
  auto* remote = bench->add_subcommand("remote", "two processes on loopback: remote actor calls (sync, async, bulk), remote spawns and failover beside raw TCP ping-pong");
  remote->add_flag("--json", remote_opts->json, "one JSON object per line");
  remote->add_flag("--quick", remote_opts->quick, "smaller sizes (for CI)");
  std::string remote_only = "run one workload:";
  for (auto* n = troupe::bench::remote_bench_names(); *n; ++n) remote_only += std::string(" ") + *n;
  remote->add_option("--only", remote_opts->only, remote_only);
  remote->add_option("--peer", remote_opts->peer)->group("");  // the peer process started by the suite
  remote->callback([remote_opts, &rc] {
    quiet_info_logs();
    rc = remote_opts->peer.empty() ? troupe::bench::run_remote(*remote_opts, std::cout)
                                   : troupe::bench::run_remote_peer(*remote_opts);
  });

  auto nn_opts = std::make_shared<troupe::bench::options>();
  auto* nn = bench->add_subcommand("nn", "GEMM at the default MLP's shapes, and its training throughput");
  nn->add_flag("--json", nn_opts->json, "one JSON object per line");
  nn->add_flag("--quick", nn_opts->quick, "shorter timings (for CI)");
  nn->add_option("--only", nn_opts->only, "gemm, train, or one GEMM shape");
  nn->callback([nn_opts, &rc] { rc = troupe::bench::run_nn(*nn_opts, std::cout); });

  auto group_opts = std::make_shared<troupe::bench::options>();
  auto* group = bench->add_subcommand("group", "ristretto255 (the project's own, beside libsodium): products, hashing, MSM");
  group->add_flag("--json", group_opts->json, "one JSON object per line");
  group->add_flag("--quick", group_opts->quick, "fewer runs, MSM up to 8,000 points (for CI)");
  group->add_option("--only", group_opts->only, "multiply, base, hash or msm");
  group->callback([group_opts, &rc] { rc = troupe::bench::run_group(*group_opts, std::cout); });

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
  pipe->callback([pipeline_opts, &rc] { rc = troupe::bench::run_pipeline(*pipeline_opts, std::cout); });

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
  optim->callback([optim_opts, quick, params, tensors, steps, &rc] {
    if (*quick) {  // the CI sizes, where not given explicitly
      if (params->count() == 0) optim_opts->params = 1'000'000;
      if (tensors->count() == 0) optim_opts->tensors = 10;
      if (steps->count() == 0) optim_opts->steps = 3;
    }
    rc = troupe::bench::run_optim(*optim_opts, std::cout);
  });
}

}  // namespace troupe::cli
