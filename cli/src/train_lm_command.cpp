// troupe train --model gpt:... (a language model on a text corpus: progress bar, a line per
// evaluation, JSON lines with --json) and troupe generate (text sampled from a saved model).

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <troupe/actors/dashboard.hpp>
#include <troupe/kernels/lm.hpp>

#include "commands.hpp"
#include "pipeline_timeline.hpp"

namespace troupe::cli {

int run_lm_train(const troupe::kernels::lm_options& o, bool json, const troupe::kernels::lm_engine_factory& engine,
                 troupe::dashboard* board, timeline_view* view) {
  const bool tty = isatty(STDERR_FILENO);
  const auto result = troupe::kernels::train_lm(
      o,
      [&](const troupe::kernels::lm_progress& p) {
        if (board) {
          const double x = static_cast<double>(p.step);
          board->add_point("loss", "train loss", x, p.train_loss, "step", "loss");
          board->add_point("loss", "validation loss", x, p.val_loss, "step", "loss");
          board->add_point("throughput", "tokens per second", x, p.tokens_per_s, "step", "tokens/s");
          board->set_figure("tokens per second", p.tokens_per_s, "training tokens per second so far");
        }
        if (json) {
          std::printf("{\"step\":%lld,\"train_loss\":%s,\"val_loss\":%s,\"tokens_per_s\":%.1f}\n",
                      static_cast<long long>(p.step), json_number(p.train_loss, "%.4f").c_str(),
                      json_number(p.val_loss, "%.4f").c_str(), p.tokens_per_s);
          std::fflush(stdout);
        }
        std::fprintf(stderr, "%sstep %lld/%lld  train loss %.4f  val loss %.4f  %.0f tokens/s\n", tty ? "\r\033[K" : "",
                     static_cast<long long>(p.step), static_cast<long long>(p.steps), p.train_loss, p.val_loss,
                     p.tokens_per_s);
        std::fflush(stderr);
      },
      [&](std::int64_t step, double loss) {
        if (board) {
          board->add_point("training loss per step", "loss of the step's batch", static_cast<double>(step), loss, "step",
                           "loss");
          board->set_figure("step", static_cast<double>(step), "steps done of " + std::to_string(o.steps));
        }
        if (!tty || step % 10 != 0) return;
        const int width = 30, done = static_cast<int>(width * step / o.steps);
        std::fprintf(stderr, "\r\033[Kstep %lld/%lld [%.*s%*s] loss %.4f", static_cast<long long>(step),
                     static_cast<long long>(o.steps), done, "==============================", width - done, "", loss);
        std::fflush(stderr);
      },
      engine);
  if (view) {
    view->publish();
    if (const auto line = view->text(); !line.empty()) std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (json)
    std::printf("{\"val_loss\":%s,\"tokens_per_s\":%.1f,\"seconds\":%.2f,\"peak_rss_mb\":%.1f,\"parameters\":%lld,"
                "\"vocab\":%lld%s}\n",
                json_number(result.val_loss, "%.4f").c_str(), result.tokens_per_s, result.seconds, result.peak_rss_mb,
                static_cast<long long>(result.parameters), static_cast<long long>(result.vocab),
                view ? view->json_fields().c_str() : "");
  else
    std::printf("val loss %.4f after %lld steps, %.0f tokens/s, %.1f s, peak RSS %.0f MB (%lld parameters, vocabulary "
                "of %lld)\n",
                result.val_loss, static_cast<long long>(result.last_step), result.tokens_per_s, result.seconds,
                result.peak_rss_mb, static_cast<long long>(result.parameters), static_cast<long long>(result.vocab));
  if (result.skipped_steps > 0)
    std::fprintf(stderr, "troupe train: warning: %lld optimizer steps were skipped, their gradients not finite\n",
                 static_cast<long long>(result.skipped_steps));
  if (result.resumed_from > 0)
    std::fprintf(stderr, "resumed at step %lld of the checkpoint\n", static_cast<long long>(result.resumed_from));
  if (!o.checkpoint.empty())
    std::fprintf(stderr, "checkpoint of step %lld in %s%s\n", static_cast<long long>(result.last_step), o.checkpoint.c_str(),
                 result.last_step < o.steps ? (" (go on with --resume " + o.checkpoint + ")").c_str() : "");
  if (!o.save.empty()) std::fprintf(stderr, "saved to %s (troupe generate --load %s)\n", o.save.c_str(), o.save.c_str());
  return 0;
}

void add_generate_command(CLI::App& app, int& rc) {
  struct flags {
    std::string load, prompt;
    std::int64_t tokens = 200;
    double temperature = 0.8;
    std::uint64_t seed = 0;
  };
  auto f = std::make_shared<flags>();
  auto* cmd = app.add_subcommand("generate", "sample text from a language model that troupe train --save wrote");
  cmd->add_option("--load", f->load, "the model's directory (troupe train --model gpt:... --save DIR)")->required();
  cmd->add_option("--prompt", f->prompt, "the text to go on from (empty: from nothing)");
  cmd->add_option("--tokens", f->tokens, "characters to sample")->capture_default_str()->check(CLI::Range(0, 1000000));
  cmd->add_option("--temperature", f->temperature, "divides the logits; 0 takes the most likely character")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "seed of the sampling")->capture_default_str();
  cmd->callback([f, &rc] {
    try {
      if (!(f->temperature >= 0) || !std::isfinite(f->temperature))
        throw std::invalid_argument("--temperature must be a number >= 0 (0: the most likely character)");
      auto lm = troupe::kernels::load_lm(f->load);
      std::printf("%s\n", troupe::kernels::generate_text(lm, f->prompt, f->tokens, f->temperature, f->seed).c_str());
      rc = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe generate: %s\n", e.what());
      rc = 1;
    }
  });
}

}  // namespace troupe::cli
