// pipeline: a model cut into stages, one actor per rank, trained with a 1F1B schedule.
//
// A pipeline schedule is data: for each rank, the order in which it runs the forward (F) and
// backward (B) of each (stage, microbatch). pipeline::trainer spawns one actor per rank; each
// owns its stage's layers and its own optimizer state. A step splits the batch into
// microbatches; the first rank runs F of microbatch 0 and sends the activation to the next rank
// as a message, which runs its F on it, and so on; gradients come back the same way. When every
// rank is done, each steps its optimizer on its own shard.
//
// main shows the schedule, trains on a synthetic problem, and checks the guarantee that makes a
// pipeline trustworthy: its weights equal, bit for bit, those of the whole model trained on the
// same microbatches in one thread. Last, activation checkpointing: the same step with the
// activations recomputed before each backward.

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/optim.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/runtime.hpp>

namespace {

namespace kernels = troupe::kernels;
namespace pipeline = troupe::pipeline;
using troupe::tensor;

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

/// A batch of `n` points in 16 dimensions, labelled by which of 10 fixed directions they point
/// most along: a problem an MLP learns quickly.
void make_batch(std::mt19937_64& rng, std::int64_t n, tensor& x, tensor& y) {
  static const std::vector<float> directions = [] {
    std::mt19937_64 r(7);
    std::normal_distribution<float> d;
    std::vector<float> v(10 * 16);
    for (auto& e : v) e = d(r);
    return v;
  }();
  std::normal_distribution<float> d;
  std::vector<float> xs(static_cast<std::size_t>(n * 16));
  std::vector<std::int64_t> ys(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float* row = xs.data() + i * 16;
    for (int j = 0; j < 16; ++j) row[j] = d(rng);
    float best = -1e30f;
    for (int c = 0; c < 10; ++c) {
      float dot = 0;
      for (int j = 0; j < 16; ++j) dot += row[j] * directions[static_cast<std::size_t>(c * 16 + j)];
      if (dot > best) best = dot, ys[static_cast<std::size_t>(i)] = c;
    }
  }
  x = tensor::from<float>(xs, {n, 16});
  y = tensor::from<std::int64_t>(ys, {n});
}

int run() {
  // The schedule: 4 ranks, 8 microbatches per step. Each row is one rank's program.
  const auto schedule = pipeline::generate("1f1b", 4, 8);
  std::printf("the 1F1B schedule (each rank's work in order: stage, F or B, microbatch):\n%s\n",
              pipeline::to_text(schedule).c_str());

  // The model: 4 linear layers with ReLU between them, one per stage. cut_mlp copies the whole
  // model's values into the stages, so both start from the same weights.
  const std::vector<std::int64_t> sizes{16, 64, 64, 32, 10};
  auto whole = kernels::make_mlp("mlp:16-64-64-32-10");
  whole->initialize(42);
  kernels::hyperparameters hp;
  hp.lr = 3e-3;
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer trainer(sys, schedule, pipeline::cut_mlp(*whole, sizes, schedule.stages()),
                            {.optimizer = kernels::optimizer_kind::adamw, .hp = hp});
  kernels::optimizer whole_opt(kernels::optimizer_kind::adamw, {{whole->parameters(), hp}},
                               kernels::optimizer_options{.threads = 1});

  std::mt19937_64 rng(1);
  tensor x, y;
  for (int step = 1; step <= 300; ++step) {
    make_batch(rng, 64, x, y);
    const auto r = trainer.step(x, y);  // 4 rank actors, 8 microbatches, activations as messages
    // What a step means, run plainly on the whole model in this thread (the reference).
    const double expected = pipeline::whole_model_step(*whole, whole_opt, x, y, schedule.microbatches);
    check(r.applied, "every gradient was finite");
    check(r.loss == expected, "the pipeline's loss equals the whole model's");
    if (step % 60 == 0)
      std::printf("step %3d  loss %.4f  (ranks busy %.2f/%.2f/%.2f/%.2f ms)\n", step, r.loss, r.busy_seconds[0] * 1e3,
                  r.busy_seconds[1] * 1e3, r.busy_seconds[2] * 1e3, r.busy_seconds[3] * 1e3);
  }

  // The guarantee: the same weights, bit for bit.
  const auto got = trainer.parameters();
  const auto want = whole->parameters();
  for (std::size_t i = 0; i < got.size(); ++i)
    check(std::memcmp(got[i].bytes(), want[i]->value.bytes(), got[i].nbytes()) == 0,
          "the pipeline's weights equal the whole model's");
  std::printf("after 300 steps the weights of the 4 stage actors equal the whole model's, bit for bit\n");

  make_batch(rng, 1000, x, y);
  const double accuracy = static_cast<double>(kernels::count_correct(trainer.predict(x), y)) / 1000.0;
  std::printf("accuracy on 1000 new points: %.3f\n", accuracy);
  check(accuracy > 0.8, "the pipeline learned the problem");

  // Activation checkpointing: with_checkpointing inserts a RECOMPUTE before each backward, so a
  // stage keeps only its input from F to B and runs its forward again before B. Same weights,
  // less held in between.
  const auto recomputing = pipeline::with_checkpointing(schedule, pipeline::checkpoint_policy::parse("every:2"), 2);
  pipeline::trainer keep_all(sys, schedule, pipeline::cut_mlp(*whole, sizes, 4),
                             {.optimizer = kernels::optimizer_kind::adamw, .hp = hp});
  pipeline::trainer recompute(sys, recomputing, pipeline::cut_mlp(*whole, sizes, 4),
                              {.optimizer = kernels::optimizer_kind::adamw, .hp = hp});
  make_batch(rng, 64, x, y);
  const auto a = keep_all.step(x, y), b = recompute.step(x, y);
  check(a.loss == b.loss, "recomputing changes no loss");
  const auto pa = keep_all.parameters(), pb = recompute.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    check(std::memcmp(pa[i].bytes(), pb[i].bytes(), pa[i].nbytes()) == 0, "recomputing changes no weight");
  std::printf("recomputing activations: rank 0 held at most %zu bytes instead of %zu, the same weights\n",
              b.peak_activation_bytes[0], a.peak_activation_bytes[0]);
  check(b.peak_activation_bytes[0] < a.peak_activation_bytes[0], "recomputing holds less");
  std::printf("pipeline: all checks passed\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline: FAILED: %s\n", e.what());
    return 1;
  }
}
