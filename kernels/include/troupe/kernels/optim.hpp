#pragma once
/// @file
/// Optimizers with PyTorch's torch.optim update rules: SGD (momentum, dampening, Nesterov,
/// weight decay), Adam (L2 weight decay) and AdamW (decoupled weight decay), with AMSGrad.
///
/// Each step is one fused pass over every parameter (the fast path); `reference_step` performs
/// the same arithmetic operation by operation, as torch.optim's single-tensor code does, and is
/// the definition of correctness: both give bit-identical results in every storage mode (tests
/// compare them). Large steps (>= 1<<20 elements) run on all cores, split at block boundaries,
/// with results identical for any thread count.
///
/// Non-finite gradients: by default a step whose gradients hold a NaN or an infinity changes
/// nothing (parameters and state stay as they were), returns false and is counted in
/// skipped(); the step count does not advance. On the host, Adam's 8-bit (or automatic) state
/// also counts a gradient of magnitude >= 2^63 so (its square would not be finite).
///
/// State storage, per parameter group (state_options), per tensor:
/// - fp32 (the default): torch.optim's state, exactly.
/// - bf16: moments rounded to nearest even (or stochastically) after each fp32 update.
/// - int8: moments as 8-bit codes of the dynamic (tree) quantization map of Dettmers et al.
///   (signed for the first moment and momentum, unsigned for second moments), in blocks of
///   `block_size` elements that share one fp32 scale: the block's absmax, recomputed from the
///   updated values each step. A step dequantizes, updates in fp32, updates the parameter from
///   the fp32 values, and requantizes (nearest code; a nonzero value never becomes zero, so
///   the first moment keeps its sign). Tensors under `min_8bit_elements` stay fp32.
///   Memory: 1 byte per element and moment plus 4 bytes per block (2.03 bytes/param for Adam
///   with blocks of 256).
/// - automatic: estimates the fp32 state against available memory (MemAvailable): fp32 when it
///   takes at most 25% of it, else bf16 when that does, else int8; models under 64 MiB of
///   fp32 state stay fp32. `TROUPE_OPTIM_STATE=fp32|bf16|int8|auto` decides for automatic
///   groups. If allocating state fails (std::bad_alloc), the state of automatic groups is
///   converted one level down (fp32 -> bf16 -> int8), logged, and the allocation retried.
///   Explicit storage that does not fit throws std::bad_alloc from step(), which then does not
///   run; tensors converted before the one that failed stay converted (docs/OPTIMIZERS.md).
/// Changing a group's hyperparameters or state options between steps is honored at the next
/// step: state is converted (or allocated, or released), never silently kept.
/// Device: every parameter and gradient of an optimizer lives on one device (the CPU, or one CUDA
/// device, where its state lives too and step() runs fused CUDA kernels; see docs/OPTIMIZERS.md).
/// More in docs/OPTIMIZERS.md.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "troupe/core/codec.hpp"
#include "troupe/kernels/layers.hpp"

namespace troupe::kernels {

enum class optimizer_kind { sgd, adam, adamw };

/// The learning rate along a half cosine from the base to zero over `total_steps` steps (step 1
/// runs at the base): a schedule for optimizer::set_lr_schedule, as `troupe train` uses. Throws
/// std::invalid_argument unless `total_steps` is a finite number of at least 1.
std::function<double(std::int64_t step, double base_lr)> cosine_lr(double total_steps);

/// "sgd", "adam", "adamw"; throws std::invalid_argument otherwise.
optimizer_kind parse_optimizer_kind(const std::string& name);

struct hyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< Adam, AdamW
  double weight_decay = 0;  ///< L2 for SGD and Adam, decoupled for AdamW
  double momentum = 0, dampening = 0;  ///< SGD
  bool nesterov = false;  ///< SGD (needs momentum > 0 and dampening 0)
  bool amsgrad = false;   ///< Adam, AdamW
};

/// How optimizer state is stored (see the file comment).
enum class state_storage : std::uint8_t { fp32, bf16, int8, automatic };

/// "fp32", "bf16", "int8", "auto"; throws std::invalid_argument otherwise.
state_storage parse_state_storage(const std::string& name);
const char* name_of(state_storage s) noexcept;

struct state_options {
  state_storage storage = state_storage::fp32;
  std::int64_t block_size = 256;            ///< int8: elements per scale
  std::int64_t min_8bit_elements = 4096;    ///< int8: smaller tensors stay fp32
  bool first_moment_fp32 = false;           ///< int8/bf16: compress only second moments
  bool stochastic_rounding = false;         ///< bf16 and int8: round stochastically (seeded)
  double percentile_scale = 0;              ///< int8: scale blocks by this percentile of |x| (e.g. 99.9); 0: absmax
  /// Clip each tensor's gradient to this percentile of its last 100 gradient norms
  /// (bitsandbytes' percentile_clipping); 100: off.
  double percentile_clipping = 100;
  /// Parameters (by name, "2.weight") kept in fp32 (embeddings); each must be the optimizer's.
  std::vector<std::string> fp32_params{};
};

/// Parameters that share hyperparameters.
struct param_group {
  std::vector<parameter*> params;
  hyperparameters hp;
  state_options state{};
};

struct optimizer_options {
  /// Threads of a step; 0: all cores when the step's elements are >= 1<<20, else 1.
  int threads = 0;
  std::uint64_t seed = 0;               ///< stochastic rounding
  /// Stochastic rounding draws for the k-th tensor (in group order) from a stream keyed by
  /// (seed, tensor_keys[k]); empty: by k. An optimizer of part of a model (a pipeline rank's)
  /// passes its tensors' places in the whole model, and rounds as the whole model's optimizer
  /// would. When given, one key per tensor, no key twice.
  std::vector<std::uint64_t> tensor_keys{};
  std::size_t available_memory = 0;     ///< automatic storage: 0 reads MemAvailable (device: its free memory)
  std::size_t state_memory_limit = 0;   ///< state allocations beyond it throw std::bad_alloc (0: none)
};

/// Bytes of optimizer state, by kind of storage.
struct state_memory {
  std::size_t codes = 0;   ///< bf16 values and 8-bit codes
  std::size_t scales = 0;  ///< fp32 scales of 8-bit blocks
  std::size_t fp32 = 0;    ///< fp32 moments (fp32 mode and fallbacks)
  std::size_t total() const noexcept { return codes + scales + fp32; }
};

/// One tensor's state.
struct tensor_state {
  std::string name;
  std::int64_t numel = 0;
  state_storage storage = state_storage::fp32;  ///< of its compressed moments
  state_memory bytes;
};

class optimizer {
public:
  /// Throws std::invalid_argument for hyperparameters torch.optim refuses (negative lr, betas
  /// outside [0, 1), Nesterov without momentum or with dampening, ...), for bad state options, and
  /// for parameters that do not all live on one device.
  optimizer(optimizer_kind kind, std::vector<param_group> groups, optimizer_options options = {});

  /// Steps every parameter with its gradient. False when a gradient was not finite (nothing
  /// changed; see the file comment).
  bool step();
  /// The same step, performed operation by operation (slow; the definition of correctness).
  /// Host parameters only (std::invalid_argument otherwise): compare a CUDA optimizer with a
  /// host one over copies of its parameters.
  bool reference_step();
  /// Sets the gradient of every parameter the groups list now to zero.
  void zero_grad();
  /// True when every gradient is finite, checked where the parameters live (one pass on the
  /// device for CUDA ones): what step() checks first, over the parameters the groups list now.
  bool gradients_finite() const;

  /// Called before each step with the step number (1-based) and the group's base lr; returns the
  /// lr to use. Unset: the base lr.
  void set_lr_schedule(std::function<double(std::int64_t step, double base_lr)> schedule);

  std::int64_t steps() const noexcept { return steps_; }
  std::int64_t skipped() const noexcept { return skipped_; }
  bool has_lr_schedule() const noexcept { return static_cast<bool>(schedule_); }
  /// Counts a step that a fused kernel performed on these parameters for this optimizer (the
  /// classifier's fused SGD step, classifier.hpp), as step() counts its own. Only plain SGD,
  /// which keeps no state, may be stepped that way.
  void count_step(bool applied) noexcept { ++(applied ? steps_ : skipped_); }
  /// Bytes of optimizer state (moments, maxima, momentum buffers).
  std::size_t state_bytes() const noexcept { return state_memory_total().total(); }
  state_memory state_memory_total() const noexcept;
  /// Per tensor, in parameter order.
  std::vector<tensor_state> state_report() const;
  optimizer_kind kind() const noexcept { return kind_; }
  /// Where the parameters and the state live.
  device where() const noexcept { return where_; }
  /// Changes take effect at the next step: hyperparameters and storage (state is converted as
  /// needed), and membership (a parameter added starts with fresh state, one removed loses its
  /// state). A parameter listed twice, or whose value or gradient changed size, is an
  /// std::invalid_argument at that step.
  std::vector<param_group>& groups() noexcept { return groups_; }
  void set_threads(int threads) noexcept { options_.threads = threads; }

  /// Writes the state (step count, per tensor storage and moments) to `path`: versioned,
  /// checksummed. Throws std::runtime_error naming the file on I/O errors. Like the state itself,
  /// save() and load() follow the parameters as of the last step (membership changes since then
  /// take effect at the next step).
  void save(const std::string& path) const;
  /// Reads state written by save(); throws std::runtime_error that says what is wrong (missing,
  /// truncated or corrupted file, another version, another model) and then changes nothing.
  void load(const std::string& path);
  /// The state as bytes in memory (save()'s format without the file's header and checksum), for
  /// many states kept by one optimizer in turn: a federated client's between its rounds.
  std::vector<std::byte> save_state() const;
  /// Restores what save_state() gave; throws std::runtime_error as load() does, changing nothing.
  void load_state(std::span<const std::byte> state);
  /// Forgets the state: moments zero, no step taken, as a fresh optimizer of these groups.
  void reset_state();

  /// Internal: one moment's storage.
  struct moment {
    std::uint8_t mode = 0;  // 0 none, 1 fp32, 2 bf16, 3 int8
    bool is_signed = true;
    std::int64_t block = 0;
    tensor data;    // f32, bf16 or u8 codes
    tensor scales;  // int8: one f32 per block
  };
  /// Internal: one parameter's state.
  struct slot {
    parameter* p;
    std::size_t group;
    std::int64_t numel;  // of the value the state was made for
    moment m, v, vmax;  // Adam: moments and the AMSGrad maximum; SGD: m is the momentum buffer
    bool momentum_started = false;
    std::vector<float> gnorms;  // percentile clipping: recent squared gradient norms
    std::int64_t steps = 0;     // steps this tensor took (Adam's bias corrections, as torch's per-parameter step)
  };

  /// Internal: the state per parameter, in parameter order (tests compare devices through it).
  const std::vector<slot>& slots() const noexcept { return slots_; }

private:
  /// True when every gradient is finite; also fills sums[k] with slot k's sum of squared
  /// gradients for the slots whose group clips by percentile (one pass over the gradients).
  bool grads_finite(std::vector<double>& sums) const;
  /// The exponent fields group `group`'s gradients must stay below (grads_finite).
  std::uint32_t finite_limit(std::size_t group) const;
  /// Each parameter's gradient, size and limit, for the device's check.
  void device_gradients(std::vector<const float*>& grads, std::vector<std::int64_t>& sizes,
                        std::vector<std::uint32_t>& limits) const;
  /// True when prepare() would change nothing: the members, hyperparameters and state options
  /// are those the state was made for.
  bool prepared() const;
  /// True when a group clips its gradients by a percentile of their norms (the step then needs
  /// the norms before it starts).
  bool clips() const;
  bool do_step(bool reference);
  /// The parameters as groups_ list them now, with their group, in order.
  std::vector<std::pair<parameter*, std::size_t>> members() const;
  /// True when slots_ holds the parameters groups_ lists now, in order, with their groups.
  bool same_members() const;
  /// Throws std::invalid_argument for a parameter that cannot be stepped (changes nothing).
  void check_slots() const;
  /// Throws std::invalid_argument for hyperparameters or state options that changed to bad values.
  void check_groups() const;
  /// slots_ as groups_ list the parameters now (checked); state kept for those still there.
  void sync_slots();
  /// Chooses, allocates or converts state storage for the (checked) groups.
  void prepare();
  void allocate(slot& s);
  void write_state(byte_writer& w) const;
  /// Checks and loads a state body; fail(why) throws, naming the source.
  void read_state(std::span<const std::byte> body, const std::function<void(const std::string&)>& fail);
  int thread_count(std::size_t elements) const;

  optimizer_kind kind_;
  device where_;
  std::vector<param_group> groups_;
  std::vector<hyperparameters> seen_hp_;    // what the state was built for, per group
  std::vector<state_options> seen_state_;
  std::vector<state_storage> resolved_;     // automatic groups: the storage chosen
  std::vector<slot> slots_;
  optimizer_options options_;
  std::function<double(std::int64_t, double)> schedule_;
  std::int64_t steps_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace troupe::kernels

namespace troupe {
template <>
struct enum_bounds<kernels::optimizer_kind> {
  static constexpr kernels::optimizer_kind last = kernels::optimizer_kind::adamw;
};
template <>
struct enum_bounds<kernels::state_storage> {
  static constexpr kernels::state_storage last = kernels::state_storage::automatic;
};
}  // namespace troupe
