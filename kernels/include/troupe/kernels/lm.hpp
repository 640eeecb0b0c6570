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
#include "troupe/kernels/layers.hpp"

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
/// over every gradient exceeds `max_norm`, scales them all by max_norm / (norm + 1e-6). Returns
/// the norm before clipping.
double clip_grad_norm(sequential& model, double max_norm);

/// nanoGPT's learning rate at step `step` (1-based): linear warmup over `warmup` steps, then a
/// half cosine from `lr` down to `min_lr` at step `decay_steps`, `min_lr` after.
double warmup_cosine_lr(std::int64_t step, double lr, double min_lr, std::int64_t warmup, std::int64_t decay_steps);

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
  std::vector<lm_progress> evaluations;
};

/// Trains a GPT; throws std::invalid_argument for bad options or data, std::runtime_error when
/// training diverges or the corpus cannot be had. `tick`, when set, is called after every step
/// with the step number (a progress bar).
lm_result train_lm(const lm_options& options, const std::function<void(const lm_progress&)>& report = {},
                   const std::function<void(std::int64_t step, double loss)>& tick = {});

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
