// troupe train: training with a progress bar and per-epoch test accuracy, in this thread or with
// the pipeline runtime's stage actors (--pipeline), here or on a cluster's nodes (--head).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <iostream>
#include <memory>

#include <unistd.h>

#include <troupe/actors/actor_system.hpp>
#include <troupe/actors/remote.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/lm.hpp>
#include <troupe/kernels/train.hpp>
#include <troupe/core/report.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/render.hpp>
#include <troupe/pipeline/runtime.hpp>
#include <troupe/pipeline/simulator.hpp>

#include "commands.hpp"
#include "dashboard_option.hpp"
#include "pipeline_timeline.hpp"

namespace troupe::cli {

void add_train_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<troupe::kernels::train_options>();
  auto json = std::make_shared<bool>(false);
  auto report = std::make_shared<std::string>();
  auto dash = std::make_shared<dashboard_flags>();
  struct pipeline_flags {
    std::string schedule, head;
    int ranks = 2, microbatches = 4, virtual_stages = 0;
    bool recompute = false;
  };
  auto pipe = std::make_shared<pipeline_flags>();
  auto lm = std::make_shared<troupe::kernels::lm_options>();
  auto* cmd = app.add_subcommand("train", "train a model on a dataset, whole or as a pipeline of stage actors");
  auto* dataset = cmd->add_option("--dataset", o->dataset, "fashion-mnist; kjv (the King James Bible) for a gpt model")
                      ->capture_default_str();
  auto* data_dir = cmd->add_option("--data-dir", o->data_dir, "where the dataset's files are (default: its Debian location)");
  cmd->add_option("--model", o->model,
                  "mlp:IN-H1-...-OUT, or gpt:layers=4,heads=4,embd=128,ctx=64[,dropout=0.1] (a character-level "
                  "language model)")
      ->capture_default_str();
  // A gpt model's options (a language model trains for a number of steps on a text).
  auto* text = cmd->add_option("--text", lm->text, "gpt: train on this UTF-8 text file instead of --dataset kjv");
  auto* steps = cmd->add_option("--steps", lm->steps, "gpt: optimizer steps")->capture_default_str();
  auto* warmup = cmd->add_option("--warmup", lm->warmup, "gpt: steps of linear lr warmup (then a cosine to lr/10)")
                     ->capture_default_str();
  auto* clip = cmd->add_option("--clip", lm->clip, "gpt: clip gradients to this global norm (0: none)")
                   ->capture_default_str();
  auto* eval_every = cmd->add_option("--eval-every", lm->eval_every, "gpt: steps between validation losses")
                         ->capture_default_str();
  auto* eval_batches = cmd->add_option("--eval-batches", lm->eval_batches, "gpt: fixed validation batches")
                           ->capture_default_str();
  auto* checkpoint = cmd->add_option("--checkpoint", lm->checkpoint,
                                     "gpt: keep a sharded checkpoint in this directory (each rank writes its own shard, "
                                     "then a manifest names them), at every evaluation and after the last step");
  auto* checkpoint_every =
      cmd->add_option("--checkpoint-every", lm->checkpoint_every, "with --checkpoint: every N steps instead")
          ->check(CLI::Range(std::int64_t{0}, std::int64_t{1'000'000'000'000}))
          ->needs(checkpoint);
  auto* resume = cmd->add_option("--resume", lm->resume,
                                 "gpt: go on from the checkpoint in this directory (the same options, model, cut and "
                                 "ranks), bit for bit as a run that never stopped");
  auto* stop_after = cmd->add_option("--stop-after", lm->stop_after,
                                     "with --checkpoint: stop after this step, its checkpoint written (go on with --resume)")
                         ->check(CLI::Range(std::int64_t{1}, std::int64_t{1'000'000'000'000}))
                         ->needs(checkpoint);
  const std::vector<CLI::Option*> lm_only = {text,       steps,      warmup,           clip,   eval_every,
                                             eval_batches, checkpoint, checkpoint_every, resume, stop_after};
  cmd->add_option("--optimizer", o->optimizer, "sgd, adam or adamw")->capture_default_str();
  cmd->add_option("--state", o->state, "optimizer state storage: fp32, bf16, int8 or auto")->capture_default_str();
  cmd->add_option("--fp32-params", o->fp32_params,
                  "parameters whose optimizer state stays fp32 whatever --state says, comma-separated; named as "
                  "PyTorch names them, by the layer's place: 0.weight, 0.bias, 2.weight, ... (linear layers at "
                  "even places, ReLU between)")
      ->delimiter(',');
  auto* epochs = cmd->add_option("--epochs", o->epochs, "passes over the training set")->capture_default_str();
  auto* batch = cmd->add_option("--batch", o->batch, "samples per step (gpt: windows of ctx characters, default 12)")
                    ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of initialization and shuffling")->capture_default_str();
  cmd->add_option("--lr", o->lr, "learning rate")->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay,
                  "weight decay (default: 0.01 for adam and adamw, 0 for sgd; 0.1 for a gpt model's matrices)");
  cmd->add_option("--save", o->save, "write the trained weights to this file (gpt: the model to this directory)");
  auto* load = cmd->add_option("--load", o->load, "start from the weights in this file");
  cmd->add_flag("--json", *json, "print a final summary line as JSON (gpt: also a line per evaluation)");
  auto* report_option =
      cmd->add_option("--report", *report, "also write a self-contained HTML report (loss and throughput per step) to this file");
  auto* optimizer_option = cmd->get_option("--optimizer");
  auto* fp32_option = cmd->get_option("--fp32-params");
  add_dashboard_options(cmd, *dash, false);
  auto* schedule = cmd->add_option("--pipeline", pipe->schedule,
                                   "train with the pipeline runtime: one stage actor per rank, this schedule (gpipe, "
                                   "1f1b, interleaved-1f1b, zb-h1, zb-v, ...); the model's layers with parameters "
                                   "(an MLP's linear layers; a GPT's embedding, blocks, final norm and head) are cut "
                                   "into the stages by parameter count");
  cmd->add_option("--ranks", pipe->ranks, "pipeline ranks (stage actors, one or more stages each)")
      ->capture_default_str()
      ->needs(schedule);
  auto* microbatches =
      cmd->add_option("--microbatches", pipe->microbatches,
                      "microbatches per step (--batch must be a multiple; the last batch of an epoch is cut to one); "
                      "a gpt model takes it without --pipeline too (their gradients summed in this thread)")
          ->capture_default_str();
  cmd->add_option("--virtual-stages", pipe->virtual_stages, "stages per rank (0: the schedule's default)")
      ->capture_default_str()
      ->needs(schedule);
  cmd->add_flag("--recompute", pipe->recompute,
               "activation checkpointing: a stage keeps only its input from a forward to the backward, "
               "and runs the forward again before the backward (the same weights, less memory)")
      ->needs(schedule);
  cmd->add_option("--head", pipe->head,
                  "run the ranks on the other nodes of the cluster whose head is at HOST:PORT (`troupe node "
                  "start`); this process joins it, with the token in TROUPE_CLUSTER_TOKEN")
      ->needs(schedule);
  cmd->callback([=, &rc] {
    const bool tty = isatty(STDERR_FILENO);
    // The pipeline's schedule (with RECOMPUTE when asked, each stage of about `layers` / stages
    // top-level layers recomputed whole), its actor system, and the nodes of its ranks (with --head).
    struct pipeline_setup {
      troupe::pipeline::schedule plan;
      std::unique_ptr<troupe::actor_system> sys;
      std::vector<std::uint32_t> nodes;
    };
    auto make_pipeline = [pipe](int layers) {
      pipeline_setup out;
      out.plan = troupe::pipeline::generate(pipe->schedule, pipe->ranks, pipe->microbatches, pipe->virtual_stages);
      if (pipe->recompute) {
        const int per_stage = std::max(2, (layers + out.plan.stages() - 1) / out.plan.stages());
        out.plan = troupe::pipeline::with_checkpointing(
            out.plan, troupe::pipeline::checkpoint_policy::parse("every:" + std::to_string(per_stage)), per_stage);
      }
      if (pipe->head.empty()) {
        out.sys = std::make_unique<troupe::actor_system>(troupe::system_config{});
        return out;
      }
      troupe::system_config cfg;
      cfg.node.listen = "0.0.0.0:0";
      cfg.node.head = pipe->head;
      out.sys = std::make_unique<troupe::actor_system>(cfg);
      // The ranks go round the cluster's other live nodes, in node order.
      const char* token = std::getenv("TROUPE_CLUSTER_TOKEN");
      std::vector<std::uint32_t> others;
      for (const auto& n : troupe::cluster_status(pipe->head, token ? token : ""))
        if (n.info.alive && n.info.id != out.sys->node()) others.push_back(n.info.id);
      if (others.empty())
        throw std::runtime_error("the cluster at " + pipe->head +
                                 " has no other node to run the ranks on (start some with troupe node start)");
      std::string where;
      for (int r = 0; r < out.plan.place.ranks; ++r) {
        out.nodes.push_back(others[static_cast<std::size_t>(r) % others.size()]);
        where += (r ? ", " : "") + std::to_string(out.nodes.back());
      }
      std::fprintf(stderr, "pipeline %s: %d ranks on nodes %s\n", out.plan.name.c_str(), out.plan.place.ranks,
                   where.c_str());
      return out;
    };
    try {
      if (o->model.rfind("gpt:", 0) == 0) {
        // A language model: the flags that only an MLP on images reads are refused.
        for (auto* opt : {epochs, data_dir, load, report_option, fp32_option})
          if (opt->count() > 0)
            throw std::invalid_argument(opt->get_name() + " cannot combine with a gpt model" +
                                        (opt == epochs ? " (it trains for --steps)"
                                                       : opt == load ? " (sample a saved model with troupe generate --load)"
                                                       : ""));
        if (optimizer_option->count() > 0 && o->optimizer != "adamw")
          throw std::invalid_argument("--optimizer " + o->optimizer + ": a gpt model trains with adamw");
        lm->model = o->model;
        lm->dataset = text->count() > 0 && dataset->count() == 0 ? "" : dataset->count() > 0 ? o->dataset : "kjv";
        if (batch->count() > 0) lm->batch = o->batch;
        lm->lr = o->lr;
        if (o->weight_decay) lm->weight_decay = *o->weight_decay;
        lm->state = o->state;
        lm->seed = o->seed;
        lm->save = o->save;
        if (microbatches->count() > 0 || !pipe->schedule.empty()) lm->microbatches = pipe->microbatches;
        const auto g = troupe::kernels::parse_gpt_spec(o->model);
        auto board = open_dashboard(*dash, run_dashboard_token(*dash), "troupe train");
        if (board) {
          std::vector<std::pair<std::string, std::string>> rows = {
              {"model", o->model}, {"dataset", lm->dataset.empty() ? lm->text : lm->dataset},
              {"steps", std::to_string(lm->steps)}, {"batch", std::to_string(lm->batch)}};
          if (!pipe->schedule.empty())
            rows.emplace_back("pipeline", pipe->schedule + ", " + std::to_string(pipe->ranks) + " ranks, " +
                                              std::to_string(pipe->microbatches) + " microbatches");
          board->set_run("troupe train", std::move(rows));
        }
        if (pipe->schedule.empty()) {
          rc = run_lm_train(*lm, *json, {}, board.get());
          return;
        }
        // The model's top-level layers: embedding, dropout (when > 0), two blocks a layer, the
        // final norm and the head (make_gpt).
        auto p = make_pipeline(static_cast<int>(1 + (g.dropout > 0 ? 1 : 0) + 2 * g.layers + 2));
        if (board)
          board->set_schedule_svg(troupe::pipeline::render(p.plan, troupe::pipeline::simulate(p.plan),
                                                           troupe::pipeline::render_format::svg));
        timeline_view view(board.get());
        rc = run_lm_train(*lm, *json,
                          troupe::pipeline::lm_pipeline_engine(*p.sys, std::move(p.plan), std::move(p.nodes), view.observer()),
                          board.get(), &view);
        return;
      }
      if (microbatches->count() > 0 && pipe->schedule.empty())
        throw std::invalid_argument("--microbatches requires --pipeline (or a gpt model)");
      for (auto* opt : lm_only)
        if (opt->count() > 0) throw std::invalid_argument(opt->get_name() + " requires a gpt model (--model gpt:...)");
      if (!report->empty()) troupe::check_report_path(*report);
      auto board = open_dashboard(*dash, run_dashboard_token(*dash), "troupe train");
      if (board) {
        std::vector<std::pair<std::string, std::string>> rows = {
            {"model", o->model}, {"dataset", o->dataset}, {"optimizer", o->optimizer + " (" + o->state + ")"},
            {"epochs", std::to_string(o->epochs)}, {"batch", std::to_string(o->batch)}};
        if (!pipe->schedule.empty())
          rows.emplace_back("pipeline", pipe->schedule + ", " + std::to_string(pipe->ranks) + " ranks, " +
                                            std::to_string(pipe->microbatches) + " microbatches");
        board->set_run("troupe train", std::move(rows));
      }
      troupe::chart_book charts;
      std::string schedule_svg;
      // The pipeline's stage actors, when asked for; otherwise the model trains in this thread.
      std::unique_ptr<troupe::actor_system> sys;
      timeline_view view(board.get());
      troupe::kernels::engine_factory engine;
      if (!pipe->schedule.empty()) {
        // Linear and ReLU layers, as cut_mlp cuts them.
        auto p = make_pipeline(2 * static_cast<int>(troupe::kernels::mlp_sizes(o->model).size() - 1) - 1);
        if (!report->empty() || board)
          schedule_svg = troupe::pipeline::render(p.plan, troupe::pipeline::simulate(p.plan), troupe::pipeline::render_format::svg);
        if (board) board->set_schedule_svg(schedule_svg);
        sys = std::move(p.sys);
        engine = troupe::pipeline::pipeline_engine(*sys, std::move(p.plan), std::move(p.nodes), view.observer());
      }
      auto result = troupe::kernels::train(*o, [&](const troupe::kernels::train_progress& p) {
        if (board && p.steps > 0) {
          // The same thinning as the report's (about 200 points per epoch); the figures every step.
          const std::int64_t every = std::max<std::int64_t>(1, p.steps / 200);
          const double x = (p.epoch - 1) + static_cast<double>(p.step) / static_cast<double>(p.steps);
          if (!p.epoch_done && (p.step % every == 0 || p.step == p.steps)) {
            board->add_point("training loss", "running mean over the epoch", x, p.loss, "epoch", "loss");
            board->add_point("throughput", "samples per second", x, p.samples_per_s, "epoch", "samples/s");
            board->set_figure("samples per second", p.samples_per_s, "training samples per second so far in the epoch");
            board->set_figure("epoch", x, "epochs done of " + std::to_string(o->epochs));
          }
          if (p.epoch_done) board->add_point("test accuracy per epoch", "test accuracy", p.epoch, p.test_accuracy, "epoch", "accuracy");
        }
        if (!report->empty() && p.steps > 0) {
          // At most about 200 points per epoch: every k-th step, and the epoch's last.
          const std::int64_t every = std::max<std::int64_t>(1, p.steps / 200);
          const double x = (p.epoch - 1) + static_cast<double>(p.step) / static_cast<double>(p.steps);
          if (!p.epoch_done && (p.step % every == 0 || p.step == p.steps)) {
            charts.add("training loss", "running mean over the epoch", x, p.loss, "epoch", "loss");
            charts.add("throughput", "samples per second", x, p.samples_per_s, "epoch", "samples/s");
          }
          if (p.epoch_done) charts.add("test accuracy per epoch", "test accuracy", p.epoch, p.test_accuracy, "epoch", "accuracy");
        }
        if (p.epoch_done) {
          std::fprintf(stderr, "%sepoch %d/%d  loss %.4f  %.0f samples/s  test accuracy %.4f\n",
                       tty ? "\r\033[K" : "", p.epoch, o->epochs, p.loss, p.samples_per_s, p.test_accuracy);
        } else if (tty) {
          const int width = 30, done = static_cast<int>(width * p.step / p.steps);
          std::fprintf(stderr, "\r\033[Kepoch %d/%d [%.*s%*s] loss %.4f  %.0f samples/s", p.epoch,
                       o->epochs, done, "==============================", width - done, "", p.loss,
                       p.samples_per_s);
        }
        std::fflush(stderr);
      }, engine);
      view.publish();
      if (const auto line = view.text(); !line.empty()) std::fprintf(stderr, "%s\n", line.c_str());
      if (*json)
        std::printf("{\"test_accuracy\":%.4f,\"samples_per_s\":%.1f,\"seconds\":%.2f%s}\n",
                    result.test_accuracy, result.samples_per_s, result.seconds, view.json_fields().c_str());
      else
        std::printf("test accuracy %.4f after %d epochs, %.0f samples/s, %.1f s\n", result.test_accuracy,
                    o->epochs, result.samples_per_s, result.seconds);
      if (!report->empty()) {
        troupe::report r("troupe train");
        const auto num = troupe::report_number;
        r.heading("Result");
        r.table({"measure", "value"}, {{"test accuracy", num(result.test_accuracy)},
                                       {"samples per second", num(result.samples_per_s)},
                                       {"wall time (s)", num(result.seconds)},
                                       {"skipped steps", std::to_string(result.skipped_steps)}});
        r.heading("Curves");
        charts.add_to(r);
        if (!schedule_svg.empty()) {
          r.heading("Pipeline schedule " + pipe->schedule + " (simulated, unit costs)");
          r.svg(schedule_svg);
        }
        if (const auto measured = view.svg(); !measured.empty()) {
          r.heading("Pipeline: the last step as measured, per rank");
          r.paragraph(view.text());
          r.svg(measured);
        }
        r.heading("Options");
        std::vector<std::vector<std::string>> rows = {{"model", o->model}, {"dataset", o->dataset},
                                                      {"optimizer", o->optimizer + " (" + o->state + ")"},
                                                      {"epochs", std::to_string(o->epochs)}, {"batch", std::to_string(o->batch)},
                                                      {"learning rate", num(o->lr)}, {"seed", std::to_string(o->seed)}};
        if (!pipe->schedule.empty())
          rows.push_back({"pipeline", pipe->schedule + ", " + std::to_string(pipe->ranks) + " ranks, " +
                                          std::to_string(pipe->microbatches) + " microbatches"});
        r.table({"option", "value"}, rows);
        r.write(*report);
      }
      if (result.skipped_steps > 0)
        std::fprintf(stderr, "troupe train: warning: %lld optimizer steps were skipped, their gradients not finite (lower --lr?)\n",
                     static_cast<long long>(result.skipped_steps));
      rc = 0;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "troupe train: out of memory (the model or --batch is too large for this machine)\n");
      rc = 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe train: %s\n", e.what());
      rc = 1;
    }
  });
}

}  // namespace troupe::cli
