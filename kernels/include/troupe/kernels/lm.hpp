#pragma once
/// @file
/// Character-level language modelling: the corpus (the King James Bible from Debian's bible-kjv
/// packages, or any UTF-8 text file), its vocabulary and split, random batches of windows, the
/// training loop of a GPT (make_gpt) with AdamW, warmup + cosine and global-norm clipping, saved
/// models and sampling from them. What `troupe train --model gpt:...` and `troupe generate` run.

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/tensor.hpp"
#include "troupe/kernels/checkpoint.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"
#include "troupe/kernels/train.hpp"

namespace troupe::kernels {

/// A text as tokens: one per Unicode code point, numbered by the vocabulary (the distinct code
/// points, in increasing order). The first 90% of the tokens train, the last 10% validate.
struct text_corpus {
  std::string source;            ///< what it was read from ("kjv", or the file's path)
  std::vector<char32_t> vocab;   ///< token id -> code point
  std::vector<std::int32_t> train, validation;
};

/// The code points of UTF-8 `text`; throws std::invalid_argument naming `what` and the byte
/// offset for text that is not UTF-8 or holds a NUL byte (binary data).
std::vector<char32_t> decode_utf8(std::string_view text, const std::string& what);
std::string encode_utf8(const std::vector<char32_t>& text);

/// The corpus of UTF-8 `text` (vocabulary, 90/10 split); throws std::invalid_argument for empty,
/// binary or non-UTF-8 text.
text_corpus make_corpus(std::string_view text, const std::string& source);

/// The corpus of a text file; throws std::invalid_argument for a file that is missing,
/// unreadable, empty, binary or not UTF-8, saying which.
text_corpus load_text_file(const std::string& path);

/// The King James Bible as plain text, one verse a line without its reference ("Ge1:1 "): about
/// 4.1 MB, from the `bible` reader of Debian's bible-kjv and bible-kjv-text packages (installed
/// by cmake/install-deps.sh). Throws std::runtime_error saying what to install when it is not.
std::string kjv_text();

/// A random batch: `batch` windows of ctx + 1 tokens starting anywhere in `tokens` (offsets from
/// `g`); x f32 [batch * ctx, 1] holds the first ctx tokens of each window, y i32 [batch * ctx]
/// the next token of each. Throws std::invalid_argument when `tokens` holds no window.
void sample_windows(const std::vector<std::int32_t>& tokens, std::int64_t batch, std::int64_t ctx, std::mt19937_64& g,
                    tensor& x, tensor& y);

/// Clips gradients by their global norm as torch.nn.utils.clip_grad_norm_ does: when the L2 norm
/// over every gradient exceeds `max_norm`, scales them all by clip_coefficient(norm, max_norm).
/// Returns the norm before clipping. The norm is global_norm of each parameter's
/// grad_square_sum in model order, so that stages holding parts of a model (pipeline ranks)
/// find the same norm, to the bit, from their parts' sums.
double clip_grad_norm(sequential& model, double max_norm);

/// The sum of the squares of a host f32 gradient, in double, element by element in order.
double grad_square_sum(const tensor& grad);
/// sqrt of the sum of `square_sums`, added in order.
double global_norm(const std::vector<double>& square_sums);
/// What clipping to `max_norm` multiplies every gradient by: max_norm / (norm + 1e-6) when that
/// is below 1 and the norm is finite; 1 otherwise (no change).
double clip_coefficient(double norm, double max_norm);
/// Multiplies a host f32 gradient by `coefficient` (as f32), unless it is 1.
void scale_gradient(tensor& grad, double coefficient);

/// nanoGPT's learning rate at step `step` (1-based): linear warmup over `warmup` steps, then a
/// half cosine from `lr` down to `min_lr` at step `decay_steps`, `min_lr` after.
double warmup_cosine_lr(std::int64_t step, double lr, double min_lr, std::int64_t warmup, std::int64_t decay_steps);

/// warmup_cosine_lr as a schedule for optimizer::set_lr_schedule, for groups whose base lr is
/// `lr` (a group with another base ends at min_lr scaled alike). Every optimizer of a GPT (the
/// whole model's, each pipeline rank's) uses this one, so their rates agree to the bit.
std::function<double(std::int64_t step, double base_lr)> warmup_cosine(double lr, double min_lr, std::int64_t warmup,
                                                                       std::int64_t decay_steps);

/// A GPT's parameter groups, as nanoGPT makes them: `hp` (its weight decay) for the parameters of
/// more than one row (weights, embeddings), the same without weight decay for the rest (biases,
/// the norms' gains and shifts). `keys[i]` is `params[i]`'s place in the whole model; `out_keys`
/// gets them in the groups' order (optimizer_options::tensor_keys), so that stochastic rounding
/// draws alike in every optimizer of the model's parts.
std::vector<param_group> decay_matrices_only(const std::vector<parameter*>& params, const std::vector<std::uint64_t>& keys,
                                             const hyperparameters& hp, const state_options& state,
                                             std::vector<std::uint64_t>& out_keys);

struct lm_options {
  std::string model = "gpt:layers=4,heads=4,embd=128,ctx=64";
  std::string dataset = "kjv";  ///< "kjv", or empty with `text` set
  std::string text;             ///< a UTF-8 file to train on instead of the dataset
  std::int64_t steps = 2000;
  std::int64_t batch = 12;
  double lr = 1e-3;
  double min_lr = -1;           ///< < 0: lr / 10
  std::int64_t warmup = 100;
  double weight_decay = 0.1;    ///< on weights and embeddings; biases and norms get none
  double clip = 1.0;            ///< global gradient norm; 0: no clipping
  std::string state = "fp32";   ///< optimizer state: fp32, bf16, int8 or auto
  std::int64_t eval_every = 250;
  std::int64_t eval_batches = 20;  ///< fixed validation batches of `batch` windows
  std::uint64_t seed = 0;
  std::string save;             ///< a directory to write the model to (created); empty: do not
  /// Microbatches per step: the batch (a multiple of them) runs in this many equal parts, each
  /// loss counted 1/microbatches, their gradients summed before the step (as a pipeline runs it).
  std::int64_t microbatches = 1;
  /// A directory to keep a sharded checkpoint in (created; see train_lm); empty: none.
  std::string checkpoint;
  /// With `checkpoint`: write one every N steps (0: at every evaluation), and after the last step.
  std::int64_t checkpoint_every = 0;
  /// A checkpoint directory to go on from (a run with the same options, model, cut and ranks).
  std::string resume;
  /// > 0 (below `steps`, with `checkpoint`): stop after this step, its checkpoint written, as a
  /// run that was stopped there would; --resume goes on from it. 0: run to `steps`.
  std::int64_t stop_after = 0;
};

/// Reported at each evaluation.
struct lm_progress {
  std::int64_t step = 0, steps = 0;
  double train_loss = 0;    ///< mean loss of the training batches since the previous evaluation
  double val_loss = 0;      ///< mean loss over the fixed validation batches
  double tokens_per_s = 0;  ///< training tokens per second of training time so far
};

struct lm_result {
  double val_loss = 0;
  double tokens_per_s = 0;
  double seconds = 0;       ///< wall time of the whole run, data and evaluation included
  double peak_rss_mb = 0;
  std::int64_t parameters = 0;
  std::int64_t vocab = 0;
  std::int64_t skipped_steps = 0;
  std::int64_t resumed_from = 0;  ///< the step of the checkpoint it went on from (0: none)
  std::int64_t last_step = 0;     ///< the last step trained (below `steps` after stop_after)
  std::vector<lm_progress> evaluations;
};

/// What a GPT's training engine starts from: the model (initialized) and how each step trains it.
struct lm_engine_setup {
  sequential& model;
  std::int64_t microbatches = 1;
  hyperparameters hp;         ///< AdamW's; weight decay on matrices only (decay_matrices_only)
  state_options state;
  std::int64_t warmup = 0;    ///< the lr follows warmup_cosine(hp.lr, min_lr, warmup, decay_steps)
  std::int64_t decay_steps = 1;
  double min_lr = 0;
  double clip = 0;            ///< global gradient norm over the whole model; 0: none
  /// The directories save_shards and load_shards will be given (absolute, lexically normal):
  /// an engine whose ranks live elsewhere lets them hold shards there and nowhere else.
  std::vector<std::string> checkpoint_dirs{};
};

/// Runs a GPT's steps: the whole model in this thread (lm_in_thread), or cut into pipeline stage
/// actors (pipeline::lm_pipeline_engine). Every engine gives the same weights, to the bit.
class lm_engine {
public:
  virtual ~lm_engine() = default;
  /// One optimizer step on windows x f32 [batch * ctx, 1], next tokens y i32 [batch * ctx]: the
  /// microbatches' forwards and backwards, clipping, the step. loss: the mean of the
  /// microbatches' mean losses.
  virtual step_outcome step(const tensor& x, const tensor& y) = 0;
  /// The logits of `x` (no training).
  virtual tensor predict(const tensor& x) = 0;
  /// Copies the trained values into the setup's model (before it is saved).
  virtual void sync(sequential& model) = 0;
  /// Which rank holds each stage, and each stage's parameter tensors.
  virtual shard_layout layout() = 0;
  /// Between steps: each rank writes its shard (its stages' weights and random state, its
  /// optimizer's state), named shard_name(rank, slot), into directory `dir` (one of the setup's
  /// checkpoint_dirs where the ranks live elsewhere). In rank order.
  virtual std::vector<shard_info> save_shards(const std::string& dir, const std::string& slot) = 0;
  /// Before the first step: each rank r reads shards[r] from `dir` (read_shard).
  virtual void load_shards(const std::string& dir, const std::vector<shard_info>& shards) = 0;
};
using lm_engine_factory = std::function<std::unique_ptr<lm_engine>(const lm_engine_setup&)>;

/// The plain engine: the whole model in this thread, one AdamW optimizer.
std::unique_ptr<lm_engine> lm_in_thread(const lm_engine_setup& setup);

/// Trains a GPT; throws std::invalid_argument for bad options or data, std::runtime_error when
/// training diverges or the corpus cannot be had.
///
/// Checkpoints (`checkpoint`): every rank of the engine writes its own shard (write_shard), then
/// a text file `manifest` names them with their sizes and CRC-32s, beside the step, the training
/// data's generator, the options the run must be resumed with, and the layout (ranks, the rank
/// of each stage, the parameter tensors of each stage). Each file is replaced atomically, and a
/// checkpoint's shards go beside the last one's (slots a and b), so a crash at any point leaves
/// the last whole checkpoint. `resume` goes on from one, bit for bit as a run that never
/// stopped; another model, corpus, option, cut or rank count is refused, saying which, and so
/// is a shard that is missing, truncated or corrupted, naming the file. `tick`, when set, is called after every step
/// with the step number (a progress bar). `make_engine` empty: lm_in_thread.
lm_result train_lm(const lm_options& options, const std::function<void(const lm_progress&)>& report = {},
                   const std::function<void(std::int64_t step, double loss)>& tick = {},
                   const lm_engine_factory& make_engine = {});

/// Writes a language model to directory `dir` (created if missing): "model" (its spec),
/// "vocab" (the vocabulary's code points in UTF-8) and "weights.trpw" (weights.hpp).
void save_lm(sequential& model, const std::string& spec, const std::vector<char32_t>& vocab, const std::string& dir);

struct saved_lm {
  std::string spec;
  std::vector<char32_t> vocab;
  std::unique_ptr<sequential> model;
};
/// Reads what save_lm wrote; throws std::runtime_error saying what is missing or wrong.
saved_lm load_lm(const std::string& dir);

/// `prompt` followed by `tokens` sampled from `lm` one at a time (each from the model's logits over
/// the last ctx tokens, divided by `temperature`; 0 takes the most likely), from a generator
/// seeded with `seed`. Throws std::invalid_argument for a prompt character the vocabulary lacks.
std::string generate_text(saved_lm& lm, const std::string& prompt, std::int64_t tokens, double temperature,
                          std::uint64_t seed);

}  // namespace troupe::kernels
