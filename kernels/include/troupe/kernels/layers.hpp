#pragma once
/// @file
/// Trainable layers with a split backward, as zero-bubble pipeline schedules need:
///
///   y  = layer.forward(x, keep, training)   keeps in `keep` what the backward halves need
///   dx = layer.backward_input(dy, keep)     the gradient for the previous layer only; frees
///                                           what only it needed
///   layer.backward_weight(dy, keep)         accumulates the parameters' gradients; frees the rest
///   dx = layer.backward(dy, keep)           both
///
/// `keep` belongs to one microbatch, so a stage can hold several microbatches between their
/// forward and their backward (1F1B, zero bubble); its bytes() is the activation memory held.
/// Tensors are f32 rows: [batch, features], on the host or on a CUDA device. A layer computes where
/// its parameters live (move_to); inputs must be there too (std::invalid_argument otherwise).
/// Layers without parameters compute where their input lives.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/tensor.hpp"

namespace troupe::kernels {

/// A trainable tensor and its gradient (same shape), accumulated by backward_weight.
struct parameter {
  /// What the layer calls it ("weight", "bias", "gamma", "beta"), prefixed by its place in each
  /// sequential that holds it, as PyTorch's nn.Sequential names them: "2.weight" is the weight
  /// of a model's third layer, "1.0.gamma" the first inner layer's of a residual at place 1.
  std::string name;
  tensor value;
  tensor grad;
};

/// What a layer keeps from its forward for its backward, for one microbatch.
struct saved_activations {
  std::vector<tensor> tensors;
  std::vector<saved_activations> children;  ///< composite layers: one per inner layer
  std::vector<tensor> output_grads;         ///< composite layers: dy of inner layers, for W
  /// Bytes held (a tensor shared by two entries counts twice).
  std::size_t bytes() const;
  void clear();
};

class layer {
public:
  virtual ~layer() = default;
  /// "linear(784->256)".
  virtual std::string describe() const = 0;
  virtual tensor forward(const tensor& x, saved_activations& keep, bool training) = 0;
  virtual tensor backward_input(const tensor& dy, saved_activations& keep) = 0;
  /// Layers without parameters have nothing to do here but forget.
  virtual void backward_weight(const tensor& /*dy*/, saved_activations& keep) { keep.clear(); }
  tensor backward(const tensor& dy, saved_activations& keep) {
    tensor dx = backward_input(dy, keep);
    backward_weight(dy, keep);
    return dx;
  }
  virtual std::vector<parameter*> parameters() { return {}; }
  /// Deterministic initialization from a seed (PyTorch's defaults where it has one).
  virtual void initialize(std::uint64_t seed) { (void)seed; }
  /// Appends the state of the layer's random generators (dropout's), one entry per generator in
  /// layer order, so that a forward can draw the same again: activation checkpointing replays a
  /// forward this way. Layers that draw nothing append nothing.
  virtual void save_random_state(std::vector<std::string>& out) const { (void)out; }
  /// Restores, from `in` at `next`, what save_random_state appended, and moves `next` past it.
  /// Throws std::invalid_argument when an entry is missing or is not a generator's state.
  virtual void load_random_state(const std::vector<std::string>& in, std::size_t& next) {
    (void)in;
    (void)next;
  }
  /// True when backward_weight needs `dy` (the layer has parameters).
  bool needs_output_grad() { return !parameters().empty(); }
};

/// y = x W^T + b, W [out, in]. Initialized uniform in ±1/sqrt(in), as PyTorch does. Without
/// `bias` (a language model's head) y = x W^T, and the layer has the one parameter "weight".
std::unique_ptr<layer> make_linear(std::int64_t in, std::int64_t out, bool bias = true);
std::unique_ptr<layer> make_relu();
/// The exact GELU, x * Phi(x).
std::unique_ptr<layer> make_gelu();
/// Normalizes each row, then scales by gamma (ones) and shifts by beta (zeros).
std::unique_ptr<layer> make_layer_norm(std::int64_t features, float eps = 1e-5f);
/// Zeroes each element with probability p while training (scaling the rest by 1/(1-p)). The
/// masks are counter-based: the k-th training forward since initialize(seed) draws from a stream
/// keyed by (seed, k), so the random state is those two numbers, and the host backward draws
/// the mask again rather than keeping it.
std::unique_ptr<layer> make_dropout(float p);

/// Layers applied in order; backward_input keeps each parametrized layer's dy for
/// backward_weight. add() prefixes the names of the layer's parameters with its place ("0.").
class sequential : public layer {
public:
  sequential() = default;
  /// Throws std::invalid_argument for a null layer.
  explicit sequential(std::vector<std::unique_ptr<layer>> layers);
  void add(std::unique_ptr<layer> l);
  std::size_t size() const noexcept { return layers_.size(); }
  layer& at(std::size_t i) { return *layers_.at(i); }

  std::string describe() const override;
  tensor forward(const tensor& x, saved_activations& keep, bool training) override;
  tensor backward_input(const tensor& dy, saved_activations& keep) override;
  void backward_weight(const tensor& dy, saved_activations& keep) override;
  std::vector<parameter*> parameters() override;
  void initialize(std::uint64_t seed) override;
  void save_random_state(std::vector<std::string>& out) const override;
  void load_random_state(const std::vector<std::string>& in, std::size_t& next) override;

private:
  std::vector<std::unique_ptr<layer>> layers_;
};

/// y = x + f(x).
std::unique_ptr<layer> make_residual(std::unique_ptr<layer> inner);

/// Token and learned position embedding, a GPT's first layer: the input is f32 [n, 1] of token
/// ids (whole numbers 0..vocab-1, exact in f32 up to 2^24; f32 so that ids travel through a
/// sequential and between pipeline stages as every other activation does), n a multiple of
/// ctx, row r at position r % ctx; the output is [n, embd], wte[id] + wpe[r % ctx]. Parameters
/// "wte" [vocab, embd] and "wpe" [ctx, embd], initialized normal(0, 0.02) as GPT-2's. The ids
/// have no gradient: backward_input returns zeros [n, 1]; backward_weight adds each row's dy
/// into its token's and its position's rows, in row order. Refuses an id that is not a whole
/// number in range (std::invalid_argument).
std::unique_ptr<layer> make_embedding(std::int64_t vocab, std::int64_t ctx, std::int64_t embd);

/// Causal multi-head self-attention over rows grouped in sequences of ctx (attention.hpp):
/// qkv = x W_qkv^T + b ("qkv.weight" [3 embd, embd]), the tiled attention per head, then
/// y = a W_proj^T + b ("proj.weight" [embd, embd]). backward_input computes d qkv and dx and
/// keeps d qkv; backward_weight adds the two projections' gradients. embd % heads must be 0.
std::unique_ptr<layer> make_attention(std::int64_t embd, std::int64_t heads, std::int64_t ctx);

/// A GPT model spec, "gpt:layers=4,heads=4,embd=128,ctx=64[,tie=1][,dropout=0.1]".
struct gpt_spec {
  std::int64_t layers = 4, heads = 4, embd = 128, ctx = 64;
  bool tie = false;
  float dropout = 0;
};
/// Reads a spec; throws std::invalid_argument saying what to change for an unknown or repeated
/// key, a value that is not a positive whole number (dropout: in [0, 1)), embd not a multiple
/// of heads, layers above 256, embd above 16384, ctx above 65536, heads above embd, or tie=1
/// (not supported yet: the head keeps its own weight).
gpt_spec parse_gpt_spec(const std::string& spec);
/// The GPT of `spec` over a vocabulary of `vocab` tokens: embedding, dropout (when > 0), `layers`
/// blocks residual(layer_norm, attention[, dropout]) + residual(layer_norm, linear(embd->4 embd),
/// gelu, linear(4 embd->embd)[, dropout]), a final layer_norm and the head linear(embd->vocab,
/// no bias) whose rows are logits of the next token. Throws as parse_gpt_spec does, and for a
/// vocab outside 1..2^20.
std::unique_ptr<sequential> make_gpt(const std::string& spec, std::int64_t vocab);

/// The layer that `description` describes, as describe() writes it: "relu", "gelu",
/// "linear(784->256)" ("linear(128->65, bias=false)" without a bias), "layer_norm(16)" (", eps=1e-06"
/// when not the default), "dropout(0.1)", "embedding(vocab=65, ctx=64, embd=128)",
/// "attention(128, heads=4, ctx=64)",
/// "residual(...)", "sequential(a, b, ...)". Its parameters are freshly initialized (seed 0) and
/// its generators seeded with 0: values and random state go separately. Throws
/// std::invalid_argument, saying where, for anything else (sizes above 2^20, more than 2^28
/// parameters in all, nesting deeper than 64).
std::unique_ptr<layer> make_layer(std::string_view description);

/// How many numbers the parameters of the layer `description` describes hold, without building
/// it (checking first what was sent for a description costs nothing); throws as make_layer does.
std::int64_t parameter_count(std::string_view description);

/// Moves every parameter (value and gradient) of `l` to `where`.
void move_to(layer& l, device where);

/// "mlp:784-256-128-10": linear layers with ReLU between them.
std::unique_ptr<sequential> make_mlp(const std::string& spec);
/// The layer sizes of an MLP spec ("mlp:784-256-128-10" -> 784, 256, 128, 10), as make_mlp reads
/// them. Throws std::invalid_argument for anything but positive decimal sizes, for a layer above
/// 2^20 units, and for more than 2^28 parameters in all (a gigabyte of weights, four with
/// gradients and two Adam moments).
std::vector<std::int64_t> mlp_sizes(const std::string& spec);

/// Mean softmax cross-entropy of `logits` [N, C] against `labels` [N] (u8, i32 or i64 class
/// indices); writes d loss / d logits into `dlogits` (allocated when empty). Throws on a label
/// outside 0..C-1.
double softmax_cross_entropy(const tensor& logits, const tensor& labels, tensor& dlogits);

/// Rows whose largest logit is at the label.
std::int64_t count_correct(const tensor& logits, const tensor& labels);

}  // namespace troupe::kernels
