// Training a GPT on a character corpus and sampling from it (lm.hpp).

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/lm.hpp"
#include "troupe/kernels/optim.hpp"
#include "troupe/core/file.hpp"
#include "lm_checkpoint.hpp"

namespace troupe::kernels {

double grad_square_sum(const tensor& grad) {
  double sum = 0;
  for (float g : grad.data<float>()) sum += static_cast<double>(g) * g;
  return sum;
}

double global_norm(const std::vector<double>& square_sums) {
  double sum = 0;
  for (double s : square_sums) sum += s;
  return std::sqrt(sum);
}

double clip_coefficient(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1 && std::isfinite(norm) ? coef : 1.0;
}

void scale_gradient(tensor& grad, double coefficient) {
  if (coefficient == 1.0) return;
  const auto c = static_cast<float>(coefficient);
  for (float& g : grad.data<float>()) g *= c;
}

double clip_grad_norm(sequential& model, double max_norm) {
  std::vector<double> sums;
  for (auto* p : model.parameters()) sums.push_back(grad_square_sum(p->grad));
  const double norm = global_norm(sums);
  const double coef = clip_coefficient(norm, max_norm);
  for (auto* p : model.parameters()) scale_gradient(p->grad, coef);
  return norm;
}

double warmup_cosine_lr(std::int64_t step, double lr, double min_lr, std::int64_t warmup, std::int64_t decay_steps) {
  const std::int64_t it = step - 1;  // nanoGPT counts iterations from 0
  if (it < warmup) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup + 1);
  if (it > decay_steps) return min_lr;
  const double ratio =
      decay_steps > warmup ? static_cast<double>(it - warmup) / static_cast<double>(decay_steps - warmup) : 1.0;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

std::function<double(std::int64_t, double)> warmup_cosine(double lr, double min_lr, std::int64_t warmup,
                                                          std::int64_t decay_steps) {
  return [=](std::int64_t step, double base) {
    return warmup_cosine_lr(step, base, min_lr * base / lr, warmup, decay_steps);
  };
}

std::vector<param_group> decay_matrices_only(const std::vector<parameter*>& params, const std::vector<std::uint64_t>& keys,
                                             const hyperparameters& hp, const state_options& state,
                                             std::vector<std::uint64_t>& out_keys) {
  if (keys.size() != params.size()) throw std::invalid_argument("decay_matrices_only: one key per parameter");
  param_group decay{{}, hp, state}, plain{{}, hp, state};
  plain.hp.weight_decay = 0;
  std::vector<std::uint64_t> decay_keys, plain_keys;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const bool matrix = params[i]->value.dim(0) > 1;
    (matrix ? decay : plain).params.push_back(params[i]);
    (matrix ? decay_keys : plain_keys).push_back(keys[i]);
  }
  out_keys = decay_keys;
  out_keys.insert(out_keys.end(), plain_keys.begin(), plain_keys.end());
  return {decay, plain};
}

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // kilobytes on Linux
}

void check_options(const lm_options& o) {
  const auto positive = [](double v) { return v > 0 && std::isfinite(v); };
  if (o.steps < 1) throw std::invalid_argument("--steps must be at least 1");
  if (o.batch < 1) throw std::invalid_argument("--batch must be at least 1");
  if (o.microbatches < 1) throw std::invalid_argument("--microbatches must be at least 1");
  if (!positive(o.lr)) throw std::invalid_argument("--lr must be a positive number");
  if (o.warmup < 0) throw std::invalid_argument("--warmup must not be negative");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay))
    throw std::invalid_argument("--weight-decay must be a number >= 0");
  if (!(o.clip >= 0) || !std::isfinite(o.clip)) throw std::invalid_argument("--clip must be a number >= 0 (0: none)");
  if (o.eval_every < 1) throw std::invalid_argument("--eval-every must be at least 1");
  if (o.eval_batches < 1) throw std::invalid_argument("--eval-batches must be at least 1");
  if (o.checkpoint_every < 0) throw std::invalid_argument("--checkpoint-every must be >= 0 (0: at every evaluation)");
  if (o.checkpoint_every > 0 && o.checkpoint.empty()) throw std::invalid_argument("--checkpoint-every requires --checkpoint");
  if (o.stop_after < 0 || (o.stop_after > 0 && o.stop_after >= o.steps))
    throw std::invalid_argument("--stop-after must be a step below --steps " + std::to_string(o.steps));
  if (o.stop_after > 0 && o.checkpoint.empty())
    throw std::invalid_argument("--stop-after requires --checkpoint (a run stopped early keeps nothing to resume otherwise)");
  if (!o.text.empty() && !o.dataset.empty())
    throw std::invalid_argument("--text FILE and --dataset " + o.dataset + " cannot combine: choose one corpus");
  if (o.text.empty() && o.dataset != "kjv")
    throw std::invalid_argument("dataset '" + o.dataset + "' is not a text corpus (a gpt model trains on kjv or --text FILE)");
}

/// The whole model in this thread: its microbatches in order, each loss counted 1/microbatches,
/// the gradients summed; clipping; one AdamW step. What a pipeline of the model computes.
class in_thread final : public lm_engine {
public:
  explicit in_thread(const lm_engine_setup& s) : model_(s.model), microbatches_(s.microbatches), clip_(s.clip) {
    const auto params = model_.parameters();
    std::vector<std::uint64_t> keys(params.size()), ordered;
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = i;
    auto groups = decay_matrices_only(params, keys, s.hp, s.state, ordered);
    opt_.emplace(optimizer_kind::adamw, std::move(groups), optimizer_options{.tensor_keys = std::move(ordered)});
    opt_->set_lr_schedule(warmup_cosine(s.hp.lr, s.min_lr, s.warmup, s.decay_steps));
  }
  step_outcome step(const tensor& x, const tensor& y) override {
    opt_->zero_grad();
    const auto xs = x.split(microbatches_), ys = y.split(microbatches_);
    const float scale = 1.0f / static_cast<float>(microbatches_);
    double loss_sum = 0;
    tensor dlogits;
    for (std::size_t j = 0; j < xs.size(); ++j) {
      saved_activations keep;
      const tensor logits = model_.forward(xs[j], keep, true);
      loss_sum += softmax_cross_entropy(logits, ys[j], dlogits);
      if (microbatches_ > 1)
        for (float& g : dlogits.data<float>()) g *= scale;
      model_.backward(dlogits, keep);
    }
    if (clip_ > 0) clip_grad_norm(model_, clip_);
    const bool applied = opt_->step();
    return {loss_sum / static_cast<double>(microbatches_), applied};
  }
  tensor predict(const tensor& x) override {
    saved_activations keep;
    return model_.forward(x, keep, false);
  }
  void sync(sequential&) override {}  // the model trained in place
  shard_layout layout() override { return {{0}, {model_.parameters().size()}}; }
  std::vector<shard_info> save_shards(const std::string& dir, const std::string& slot) override {
    return {write_shard((std::filesystem::path(dir) / shard_name(0, slot)).string(), {{0, &model_}}, *opt_)};
  }
  void load_shards(const std::string& dir, const std::vector<shard_info>& shards) override {
    if (shards.size() != 1) throw std::logic_error("lm_in_thread: one shard to load");
    read_shard((std::filesystem::path(dir) / shards[0].file).string(), shards[0], {{0, &model_}}, *opt_);
  }

private:
  sequential& model_;
  std::int64_t microbatches_;
  double clip_;
  std::optional<optimizer> opt_;
};

/// Mean loss of the engine's model over fixed batches (no training).
double mean_loss(lm_engine& engine, const std::vector<std::pair<tensor, tensor>>& batches) {
  double sum = 0;
  tensor dlogits;
  for (const auto& [x, y] : batches) sum += softmax_cross_entropy(engine.predict(x), y, dlogits);
  return sum / static_cast<double>(batches.size());
}

}  // namespace

std::unique_ptr<lm_engine> lm_in_thread(const lm_engine_setup& setup) {
  if (setup.microbatches < 1) throw std::invalid_argument("--microbatches must be at least 1");
  return std::make_unique<in_thread>(setup);
}

namespace {

/// `dir` as the ranks must see it: absolute, since ranks on other nodes of this machine resolve
/// a relative path against their own working directory.
std::string absolute_dir(const std::string& dir) {
  std::error_code ec;
  const auto a = std::filesystem::absolute(dir, ec);
  return ec ? dir : a.lexically_normal().string();
}

/// Where a run keeps its checkpoints: the directory made and writable, and the slot its next
/// checkpoint's shards take (beside the last checkpoint's, never over them).
struct checkpoint_target {
  std::string dir;
  std::string slot = "a";
};

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

/// Checked before anything trains: a directory that can be written, and that holds no checkpoint
/// of another run (which would be overwritten) unless this run resumes from it.
checkpoint_target prepare_checkpoint(const lm_options& o, const detail::lm_manifest* resumed) {
  checkpoint_target t{absolute_dir(o.checkpoint)};
  std::error_code ec;
  std::filesystem::create_directories(o.checkpoint, ec);
  if (ec) throw std::runtime_error("--checkpoint " + o.checkpoint + ": cannot make the directory (" + ec.message() + ")");
  const std::string manifest = detail::manifest_path(o.checkpoint);
  try {
    check_writable(manifest);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("--checkpoint " + o.checkpoint + ": cannot write the checkpoint (" + e.what() + ")");
  }
  if (std::filesystem::exists(manifest)) {
    if (!resumed || !same_directory(o.resume, o.checkpoint))
      throw std::invalid_argument("--checkpoint " + o.checkpoint +
                                  " holds a checkpoint already: go on from it with --resume " + o.checkpoint +
                                  ", or name another directory");
    t.slot = resumed->slot == "a" ? "b" : "a";
  }
  return t;
}

}  // namespace

lm_result train_lm(const lm_options& o, const std::function<void(const lm_progress&)>& report,
                   const std::function<void(std::int64_t, double)>& tick, const lm_engine_factory& make_engine) {
  check_options(o);
  const auto start = clock_type::now();
  const gpt_spec g = parse_gpt_spec(o.model);
  const auto storage = parse_state_storage(o.state);
  if (o.batch % o.microbatches != 0)
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + " is not a multiple of --microbatches " +
                                std::to_string(o.microbatches) + " (each microbatch holds whole windows of ctx=" +
                                std::to_string(g.ctx) + " tokens)");
  // A checkpoint to go on from, and where to write them: refused now, not after the corpus loads.
  std::optional<detail::lm_manifest> resumed;
  if (!o.resume.empty()) {
    resumed = detail::read_manifest(o.resume);
    if (resumed->step >= o.steps)
      throw std::invalid_argument("--resume " + o.resume + ": the checkpoint is at step " + std::to_string(resumed->step) +
                                  ", the last of --steps " + std::to_string(o.steps) + ": nothing is left to train");
    if (o.stop_after > 0 && o.stop_after <= resumed->step)
      throw std::invalid_argument("--resume " + o.resume + ": the checkpoint is at step " + std::to_string(resumed->step) +
                                  ", past --stop-after " + std::to_string(o.stop_after));
  }
  std::optional<checkpoint_target> target;
  if (!o.checkpoint.empty()) target = prepare_checkpoint(o, resumed ? &*resumed : nullptr);

  const text_corpus corpus = o.text.empty() ? make_corpus(kjv_text(), "the King James Bible") : load_text_file(o.text);
  for (const auto* part : {&corpus.train, &corpus.validation})
    if (static_cast<std::int64_t>(part->size()) < g.ctx + 1)
      throw std::invalid_argument(corpus.source + ": its " + (part == &corpus.train ? "training part (first 90%)" : "validation part (last 10%)") +
                                  " has " + std::to_string(part->size()) + " characters; a window of ctx + 1 = " +
                                  std::to_string(g.ctx + 1) + " needs more");
  const std::string fingerprint = detail::lm_fingerprint(o, corpus);
  const auto vocab = static_cast<std::int64_t>(corpus.vocab.size());
  auto model = make_gpt(o.model, vocab);
  model->initialize(o.seed);

  lm_result result;
  result.vocab = vocab;
  for (auto* p : model->parameters()) result.parameters += p->value.numel();
  // AdamW as nanoGPT configures it: betas (0.9, 0.99), weight decay on the matrices (weights,
  // embeddings) as nanoGPT decays every parameter of two or more dimensions.
  lm_engine_setup setup{.model = *model, .microbatches = o.microbatches, .hp = {}, .state = {}, .warmup = o.warmup,
                        .decay_steps = o.steps, .min_lr = o.min_lr < 0 ? o.lr / 10 : o.min_lr, .clip = o.clip};
  setup.hp.lr = o.lr;
  setup.hp.beta1 = 0.9;
  setup.hp.beta2 = 0.99;
  setup.hp.weight_decay = o.weight_decay;
  setup.state.storage = storage;
  if (target) setup.checkpoint_dirs.push_back(target->dir);
  if (!o.resume.empty()) setup.checkpoint_dirs.push_back(absolute_dir(o.resume));
  auto engine = make_engine ? make_engine(setup) : lm_in_thread(setup);

  std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + 1);
  std::mt19937_64 fixed(o.seed * 0x9E3779B97F4A7C15ull + 2);
  std::vector<std::pair<tensor, tensor>> val_batches(static_cast<std::size_t>(o.eval_batches));
  for (auto& [x, y] : val_batches) sample_windows(corpus.validation, o.batch, g.ctx, fixed, x, y);

  tensor x, y;
  double training_seconds = 0, loss_sum = 0;
  std::int64_t losses = 0, first = 1;
  if (resumed) {
    detail::check_resumable(*resumed, fingerprint, engine->layout(), o.resume);
    std::istringstream state(resumed->data_rng);
    state >> rng;
    if (!state) throw std::runtime_error("the checkpoint manifest " + detail::manifest_path(o.resume) + " has a malformed data-rng= line");
    engine->load_shards(absolute_dir(o.resume), resumed->shards);
    first = resumed->step + 1;
    loss_sum = resumed->loss_sum;
    losses = resumed->losses;
    result.skipped_steps = resumed->skipped_steps;
    result.resumed_from = resumed->step;
  }
  auto save_checkpoint = [&](std::int64_t step) {
    detail::lm_manifest m;
    m.options = fingerprint;
    m.layout = engine->layout();
    m.step = step;
    m.skipped_steps = result.skipped_steps;
    m.loss_sum = loss_sum;
    m.losses = losses;
    std::ostringstream state;
    state << rng;
    m.data_rng = state.str();
    m.slot = target->slot;
    m.shards = engine->save_shards(target->dir, target->slot);
    m.ranks = static_cast<int>(m.shards.size());
    detail::write_manifest(target->dir, m);  // the checkpoint counts from here on
    target->slot = target->slot == "a" ? "b" : "a";
  };
  const std::int64_t tokens_per_step = o.batch * g.ctx;
  const std::int64_t last = o.stop_after > 0 ? o.stop_after : o.steps;
  for (std::int64_t step = first; step <= last; ++step) {
    const auto t0 = clock_type::now();
    sample_windows(corpus.train, o.batch, g.ctx, rng, x, y);
    const auto outcome = engine->step(x, y);
    if (!std::isfinite(outcome.loss))
      throw std::runtime_error("training diverged at step " + std::to_string(step) + ": the loss is not finite (lower --lr)" +
                               (o.save.empty() ? "" : "; nothing was saved") +
                               (target ? "; the last checkpoint written stays" : ""));
    if (!outcome.applied) ++result.skipped_steps;
    training_seconds += since(t0);
    loss_sum += outcome.loss;
    ++losses;
    if (tick) tick(step, outcome.loss);
    const bool evaluate = step % o.eval_every == 0 || step == o.steps;
    auto evaluation = [&] {
      lm_progress p;
      p.step = step;
      p.steps = o.steps;
      p.train_loss = loss_sum / static_cast<double>(losses);
      p.val_loss = mean_loss(*engine, val_batches);
      p.tokens_per_s = static_cast<double>((step - first + 1) * tokens_per_step) / training_seconds;
      loss_sum = 0;
      losses = 0;
      result.evaluations.push_back(p);
      if (report) report(p);
    };
    if (evaluate) evaluation();
    // Saved after the evaluation is reported: a resumed run goes on with the losses since it.
    if (target && ((o.checkpoint_every > 0 ? step % o.checkpoint_every == 0 : evaluate) || step == last))
      save_checkpoint(step);
    if (step == last && !evaluate) evaluation();  // stopped early: the summary's figures
  }
  if (!o.save.empty()) {
    engine->sync(*model);
    save_lm(*model, o.model, corpus.vocab, o.save);
  }
  result.last_step = last;
  result.val_loss = result.evaluations.back().val_loss;
  result.tokens_per_s = static_cast<double>((last - first + 1) * tokens_per_step) / training_seconds;
  result.seconds = since(start);
  result.peak_rss_mb = peak_rss_mb();
  return result;
}

std::string generate_text(saved_lm& lm, const std::string& prompt, std::int64_t tokens, double temperature,
                          std::uint64_t seed) {
  if (tokens < 0) throw std::invalid_argument("--tokens must not be negative");
  if (!(temperature >= 0) || !std::isfinite(temperature)) throw std::invalid_argument("--temperature must be a number >= 0");
  const gpt_spec g = parse_gpt_spec(lm.spec);
  std::vector<std::int32_t> ids;
  for (char32_t c : decode_utf8(prompt, "--prompt")) {
    const auto it = std::lower_bound(lm.vocab.begin(), lm.vocab.end(), c);
    if (it == lm.vocab.end() || *it != c)
      throw std::invalid_argument("--prompt: the character '" + encode_utf8({c}) + "' is not in the model's vocabulary");
    ids.push_back(static_cast<std::int32_t>(it - lm.vocab.begin()));
  }
  if (ids.empty()) ids.push_back(0);  // nothing to go on: start from the first character
  std::mt19937_64 rng(seed);
  tensor x = tensor::zeros({g.ctx, 1});
  const auto vocab = static_cast<std::int64_t>(lm.vocab.size());
  std::vector<double> prob(static_cast<std::size_t>(vocab));
  for (std::int64_t n = 0; n < tokens; ++n) {
    // The last ctx tokens, at positions 0..len-1; the rest of the window is padding that the
    // causal mask keeps from the rows that matter.
    const std::size_t len = std::min<std::size_t>(ids.size(), static_cast<std::size_t>(g.ctx));
    auto xd = x.data<float>();
    std::fill(xd.begin(), xd.end(), 0.0f);
    for (std::size_t t = 0; t < len; ++t) xd[t] = static_cast<float>(ids[ids.size() - len + t]);
    saved_activations keep;
    const tensor logits = lm.model->forward(x, keep, false);
    const float* row = logits.data<float>().data() + (len - 1) * static_cast<std::size_t>(vocab);
    std::int64_t pick = std::max_element(row, row + vocab) - row;
    if (temperature > 0) {
      const double top = row[pick];
      double total = 0;
      for (std::int64_t v = 0; v < vocab; ++v) total += prob[static_cast<std::size_t>(v)] = std::exp((row[v] - top) / temperature);
      double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
      for (pick = 0; pick + 1 < vocab && u >= prob[static_cast<std::size_t>(pick)]; ++pick) u -= prob[static_cast<std::size_t>(pick)];
    }
    ids.push_back(static_cast<std::int32_t>(pick));
  }
  std::vector<char32_t> out;
  for (std::size_t i = prompt.empty() ? 1 : 0; i < ids.size(); ++i) out.push_back(lm.vocab[static_cast<std::size_t>(ids[i])]);
  return encode_utf8(out);
}

}  // namespace troupe::kernels
