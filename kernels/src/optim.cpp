// The optimizer's public object: validation of hyperparameters and state options, parameter
// groups and their membership, the gradient checks, and the step (optimizer::do_step), which
// checks everything, makes each tensor's plan (constants, roundings, pieces) and dispatches it:
// to the device (cuda_ops.hpp), to the reference step (optim_reference.cpp) or to the fast step
// on the host's threads (optim_fast.cpp). How the state is stored, converted, saved and loaded is
// optim_state.cpp.

#include "troupe/kernels/optim.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cuda_ops.hpp"
#include "job_pool.hpp"
#include "optim_step.hpp"
#include "quantize.hpp"

namespace troupe::kernels {

using jobs::run_jobs;
using optim::mode_int8, optim::mode_none;
using optim::numel_of, optim::rounding, optim::tensor_plan;

optimizer_kind parse_optimizer_kind(const std::string& name) {
  if (name == "sgd") return optimizer_kind::sgd;
  if (name == "adam") return optimizer_kind::adam;
  if (name == "adamw") return optimizer_kind::adamw;
  throw std::invalid_argument("optimizer '" + name + "' is not one of: sgd, adam, adamw");
}

state_storage parse_state_storage(const std::string& name) {
  if (name == "fp32") return state_storage::fp32;
  if (name == "bf16") return state_storage::bf16;
  if (name == "int8") return state_storage::int8;
  if (name == "auto") return state_storage::automatic;
  throw std::invalid_argument("optimizer state '" + name + "' is not one of: fp32, bf16, int8, auto");
}

const char* name_of(state_storage s) noexcept {
  switch (s) {
    case state_storage::fp32: return "fp32";
    case state_storage::bf16: return "bf16";
    case state_storage::int8: return "int8";
    case state_storage::automatic: return "auto";
  }
  return "?";
}

namespace {

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument("optimizer: " + why); }

void validate(optimizer_kind kind, const hyperparameters& hp, const state_options& so) {
  if (static_cast<unsigned>(kind) > static_cast<unsigned>(optimizer_kind::adamw))
    bad("kind " + std::to_string(static_cast<unsigned>(kind)) + " is not SGD, Adam or AdamW");
  if (!(hp.lr >= 0) || !std::isfinite(hp.lr)) bad("lr must be finite and >= 0");
  if (!(hp.weight_decay >= 0) || !std::isfinite(hp.weight_decay)) bad("weight_decay must be finite and >= 0");
  if (kind == optimizer_kind::sgd) {
    if (!(hp.momentum >= 0) || !std::isfinite(hp.momentum)) bad("momentum must be finite and >= 0");
    if (!std::isfinite(hp.dampening)) bad("dampening must be finite");
    if (hp.nesterov && (hp.momentum <= 0 || hp.dampening != 0))
      bad("Nesterov momentum needs momentum > 0 and dampening 0");
  } else {
    if (!(hp.beta1 >= 0 && hp.beta1 < 1)) bad("beta1 must be in [0, 1)");
    if (!(hp.beta2 >= 0 && hp.beta2 < 1)) bad("beta2 must be in [0, 1)");
    if (!(hp.eps >= 0) || !std::isfinite(hp.eps)) bad("eps must be finite and >= 0");
  }
  if (static_cast<unsigned>(so.storage) > static_cast<unsigned>(state_storage::automatic))
    bad("state storage " + std::to_string(static_cast<unsigned>(so.storage)) + " is not fp32, bf16, int8 or automatic");
  // (A step keeps a few blocks per moment and thread in fast memory: 65,536 elements at most.)
  if (so.block_size < 1 || so.block_size > (1 << 16)) bad("state block_size must be in [1, 65536]");
  if (so.min_8bit_elements < 0) bad("state min_8bit_elements must be >= 0");
  if (!(so.percentile_scale >= 0 && so.percentile_scale <= 100)) bad("state percentile_scale must be in [0, 100]");
  if (!(so.percentile_clipping > 0 && so.percentile_clipping <= 100))
    bad("state percentile_clipping must be in (0, 100]");
}

bool same(const hyperparameters& a, const hyperparameters& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.momentum == b.momentum && a.dampening == b.dampening &&
         a.nesterov == b.nesterov && a.amsgrad == b.amsgrad;
}

bool same(const state_options& a, const state_options& b) {
  return a.storage == b.storage && a.block_size == b.block_size && a.min_8bit_elements == b.min_8bit_elements &&
         a.first_moment_fp32 == b.first_moment_fp32 && a.stochastic_rounding == b.stochastic_rounding &&
         a.percentile_scale == b.percentile_scale && a.percentile_clipping == b.percentile_clipping &&
         a.fp32_params == b.fp32_params;
}

}  // namespace

// ---- construction and membership ----------------------------------------------------------

optimizer::optimizer(optimizer_kind kind, std::vector<param_group> groups, optimizer_options options)
    : kind_(kind), groups_(std::move(groups)), options_(options) {
  for (const auto& g : groups_) {
    validate(kind, g.hp, g.state);
    for (const auto* p : g.params)
      if (p) {
        where_ = p->value.where();
        break;
      }
  }
  if (std::unordered_set<std::uint64_t>(options_.tensor_keys.begin(), options_.tensor_keys.end()).size() !=
      options_.tensor_keys.size())
    bad("tensor_keys names a key twice: two tensors would round with the same random numbers");
  check_slots();
  check_groups();
  sync_slots();
  prepare();
}

std::vector<std::pair<parameter*, std::size_t>> optimizer::members() const {
  std::vector<std::pair<parameter*, std::size_t>> out;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (auto* p : groups_[g].params) out.emplace_back(p, g);
  return out;
}

bool optimizer::same_members() const {
  std::size_t k = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (const auto* p : groups_[g].params) {
      if (k >= slots_.size() || slots_[k].p != p || slots_[k].group != g) return false;
      ++k;
    }
  return k == slots_.size();
}

void optimizer::check_slots() const {
  if (!options_.tensor_keys.empty()) {
    std::size_t tensors = 0;
    for (const auto& group : groups_) tensors += group.params.size();
    if (options_.tensor_keys.size() != tensors)
      bad("tensor_keys has " + std::to_string(options_.tensor_keys.size()) + " keys for " + std::to_string(tensors) +
          " tensors (one per tensor, or none)");
  }
  auto check_tensors = [&](const parameter* p) {
    if (!p || p->value.type() != dtype::f32 || p->grad.type() != dtype::f32 || p->grad.shape() != p->value.shape())
      bad("every parameter needs an f32 value and an f32 gradient of the same shape" +
          (p ? " ('" + p->name + "' has " + p->value.str() + " and " + p->grad.str() + ")" : std::string(" (a null one)")));
    if (p->value.where() != where_ || p->grad.where() != where_)
      bad("parameter '" + p->name + "' (value on " + p->value.where().str() + ", gradient on " +
          p->grad.where().str() + ") is not on " + where_.str() +
          ": every parameter and gradient of an optimizer must live on one device");
  };
  auto check_size = [](const parameter* p, const slot& s) {
    if (s.numel != p->value.numel())
      bad("parameter '" + p->name + "' changed size from " + std::to_string(s.numel) + " to " +
          std::to_string(p->value.numel()) + " elements since its state was made");
  };
  if (same_members()) {  // the usual step: the slots were checked for duplicates when made
    for (const auto& s : slots_) {
      check_tensors(s.p);
      check_size(s.p, s);
    }
    return;
  }
  std::unordered_map<const parameter*, std::size_t> had;
  for (std::size_t k = 0; k < slots_.size(); ++k) had.emplace(slots_[k].p, k);
  std::unordered_set<const parameter*> listed;
  for (const auto& group : groups_) {
    for (const auto* p : group.params) {
      check_tensors(p);
      if (!listed.insert(p).second) bad("parameter '" + p->name + "' is listed twice (it would be stepped twice)");
      if (auto it = had.find(p); it != had.end()) check_size(p, slots_[it->second]);
    }
  }
}

void optimizer::sync_slots() {
  if (same_members()) return;
  std::unordered_map<const parameter*, std::size_t> had;
  for (std::size_t k = 0; k < slots_.size(); ++k) had.emplace(slots_[k].p, k);
  std::vector<slot> next;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (auto* p : groups_[g].params) {
      if (auto it = had.find(p); it != had.end()) {
        next.push_back(std::move(slots_[it->second]));
        next.back().group = g;
      } else {
        next.push_back(slot{p, g, p->value.numel(), {}, {}, {}, false, {}, 0});
      }
    }
  }
  slots_ = std::move(next);
}

void optimizer::check_groups() const {
  // What changed since the last step is checked again.
  const bool first = seen_hp_.empty();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (!first && g < seen_hp_.size() && same(groups_[g].hp, seen_hp_[g]) && same(groups_[g].state, seen_state_[g]))
      continue;
    validate(kind_, groups_[g].hp, groups_[g].state);
    // A name that is no parameter would change nothing. Groups often share their state options,
    // so a name may be another group's parameter.
    for (const auto& name : groups_[g].state.fp32_params) {
      const auto all = members();
      if (std::none_of(all.begin(), all.end(), [&](const auto& m) { return m.first->name == name; }))
        bad("state option fp32_params names '" + name + "', which is no parameter of this optimizer" +
            (all.empty() ? std::string() : " (the first is '" + all.front().first->name + "')"));
    }
    if (!where_.is_cpu()) {
      const auto& so = groups_[g].state;
      // Checked here, before a step counts: the CUDA step keeps a block's values in shared memory.
      if (so.block_size > cuda::max_int8_block && so.storage != state_storage::fp32 &&
          so.storage != state_storage::bf16)
        bad("state block_size " + std::to_string(so.block_size) + " is above " +
            std::to_string(cuda::max_int8_block) + ", the largest 8-bit block on " + where_.str());
    }
  }
}

void optimizer::set_lr_schedule(std::function<double(std::int64_t, double)> schedule) {
  schedule_ = std::move(schedule);
}

int optimizer::thread_count(std::size_t elements) const {
  if (options_.threads > 0) return options_.threads;
  if (elements < (std::size_t{1} << 20)) return 1;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void optimizer::zero_grad() {
  // The parameters listed now: one added since the last step starts from zero too.
  for (const auto& [p, group] : members()) {
    if (!p || p->grad.where() != where_ || p->grad.type() != dtype::f32) continue;  // (refused by the next step)
    if (!where_.is_cpu()) cuda::fill_zero(p->grad.bytes(), p->grad.nbytes(), where_.index);
    else std::fill(p->grad.data<float>().begin(), p->grad.data<float>().end(), 0.0f);
  }
}

// ---- the gradient checks -------------------------------------------------------------------

bool optimizer::gradients_finite() const {
  std::vector<double> sums;
  return grads_finite(sums);
}

std::uint32_t optimizer::finite_limit(std::size_t group) const {
  // 8-bit (or automatic, which may pick it) second moments also refuse a gradient whose square
  // is not finite; so does SGD's 8-bit momentum (an infinite momentum would make its block's
  // scale infinite, and every value of the block NaN).
  const auto& [params, hp, state] = groups_[group];
  const bool eight_bit = state.storage == state_storage::int8 || state.storage == state_storage::automatic;
  const bool int8 = eight_bit && (kind_ != optimizer_kind::sgd || (hp.momentum != 0 && !state.first_moment_fp32));
  return int8 ? optim::square_finite_bits : optim::exponent_bits;
}

void optimizer::device_gradients(std::vector<const float*>& grads, std::vector<std::int64_t>& sizes,
                                 std::vector<std::uint32_t>& limits) const {
  for (const auto& [p, group] : members()) {
    grads.push_back(reinterpret_cast<const float*>(std::as_const(*p).grad.bytes()));
    sizes.push_back(p->grad.numel());
    limits.push_back(finite_limit(group));
  }
}

bool optimizer::clips() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const param_group& g) { return g.state.percentile_clipping < 100; });
}

bool optimizer::prepared() const {
  if (seen_hp_.size() != groups_.size() || !same_members()) return false;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (!same(groups_[g].hp, seen_hp_[g]) || !same(groups_[g].state, seen_state_[g])) return false;
  return true;
}

bool optimizer::grads_finite(std::vector<double>& sums) const {
  // Over the parameters as the groups list them now (the slots' order once synced).
  const auto params = members();
  sums.assign(params.size(), 0.0);
  if (!where_.is_cpu()) {
    std::vector<const float*> grads;
    std::vector<std::int64_t> sizes;
    std::vector<std::uint32_t> limits;
    device_gradients(grads, sizes, limits);
    if (!cuda::all_finite(grads, sizes, limits, where_.index)) return false;
    if (clips()) {
      // The device sums as optim::sum_of_squares does, to the bit.
      const std::vector<double> all = cuda::sums_of_squares(grads, sizes, where_.index);
      for (std::size_t k = 0; k < params.size(); ++k)
        if (groups_[params[k].second].state.percentile_clipping < 100) sums[k] = all[k];
    }
    return true;
  }
  // Pieces of at most 1<<16 elements, checked in parallel for large steps. A slot's sum of squares
  // is the sum of its pieces' in piece order (sum_of_squares within a piece), so that it is the
  // same for any thread count; the piece is still in cache from the check when it is summed.
  struct piece {
    const float* g;
    std::size_t n, slot;
    bool sum;
    std::uint32_t limit;  // the exponent fields allowed are below it
  };
  std::vector<piece> pieces;
  std::size_t total = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const auto g = std::as_const(*params[k].first).grad.data<float>();
    const bool sum = groups_[params[k].second].state.percentile_clipping < 100;
    const std::uint32_t limit = finite_limit(params[k].second);
    for (std::size_t b = 0; b < g.size(); b += 1u << 16)
      pieces.push_back({g.data() + b, std::min<std::size_t>(1u << 16, g.size() - b), k, sum, limit});
    total += g.size();
  }
  std::vector<double> piece_sums(pieces.size(), 0.0);
  std::atomic<bool> finite{true};
  run_jobs(pieces.size(), thread_count(total), [&](std::size_t j, int) {
    if (optim::top_exponent(pieces[j].g, pieces[j].n) >= pieces[j].limit) finite.store(false, std::memory_order_relaxed);
    else if (pieces[j].sum) piece_sums[j] = optim::sum_of_squares(pieces[j].g, pieces[j].n);
  });
  for (std::size_t j = 0; j < pieces.size(); ++j) sums[pieces[j].slot] += piece_sums[j];
  return finite.load();
}

// ---- the step ------------------------------------------------------------------------------

bool optimizer::step() { return do_step(false); }
bool optimizer::reference_step() { return do_step(true); }

bool optimizer::do_step(bool reference) {
  if (reference && !where_.is_cpu())
    bad("reference_step runs on host parameters only (these are on " + where_.str() +
        "): compare with an optimizer over host copies");
  // Everything is checked before anything changes: a refused or skipped step leaves the state,
  // its storage and the membership as they were.
  check_slots();
  check_groups();
  // On a device, when the state needs no change, the check and the step go to the device
  // together (cuda::checked_step, no wait between them): the step's kernels skip themselves when
  // a gradient fails, and the step counts taken below are given back.
  const bool together = !where_.is_cpu() && prepared() && !clips();
  std::vector<double> squares;  // per slot, for percentile clipping
  if (!together && !grads_finite(squares)) {
    ++skipped_;
    return false;
  }
  // The schedule is asked once per group and step: what was checked is what is used.
  std::vector<double> group_lr(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const double lr = schedule_ ? schedule_(steps_ + 1, groups_[g].hp.lr) : groups_[g].hp.lr;
    if (!(lr >= 0) || !std::isfinite(lr))
      bad("the lr schedule gave " + std::to_string(lr) + " at step " + std::to_string(steps_ + 1) +
          " (it must be finite and >= 0)");
    group_lr[g] = lr;
  }
  sync_slots();
  prepare();
  // Each worker's L1 scratch, taken before anything changes: a step that cannot have it fails
  // whole (std::bad_alloc), never after some tensors were stepped.
  std::size_t elements = 0, per_worker = 0;
  for (const auto& s : slots_) {
    elements += numel_of(s);
    per_worker = std::max(per_worker, optim::scratch_floats(s));
  }
  const std::size_t workers = where_.is_cpu() && !reference ? static_cast<std::size_t>(thread_count(elements)) : 0;
  const auto scratch = std::make_unique_for_overwrite<float[]>(per_worker * workers);
  const std::int64_t t = ++steps_;

  // Per tensor constants, and the gradient scale of percentile clipping.
  std::vector<tensor_plan> plans(slots_.size());
  struct {
    double beta1 = -1, beta2 = -1, ts = -1, bc1 = 0, bc2 = 0;
  } corrections;
  std::size_t total = 0;
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    auto& s = slots_[k];
    const auto& grp = groups_[s.group];
    const auto& hp = grp.hp;
    const double lr = group_lr[s.group];
    float gscale = 1.0f;
    if (grp.state.percentile_clipping < 100) {
      // bitsandbytes' percentile clipping over the last 100 squared norms (this one included):
      // the clip is the sorted history's entry at index p (0-based, of 100). Unlike bitsandbytes,
      // the history holds only the norms seen so far (no zeros at the start): index p N / 100.
      const double sq = squares[k];
      if (s.gnorms.size() == 100) s.gnorms.erase(s.gnorms.begin());
      s.gnorms.push_back(static_cast<float>(std::min(sq, static_cast<double>(std::numeric_limits<float>::max()))));
      std::vector<float> sorted = s.gnorms;
      std::sort(sorted.begin(), sorted.end());
      const auto index = std::min(sorted.size() - 1, static_cast<std::size_t>(std::floor(
                                                         grp.state.percentile_clipping / 100.0 * sorted.size())));
      const double clip = std::sqrt(static_cast<double>(sorted[index]));
      const double current = std::sqrt(sq);
      if (current > clip) gscale = static_cast<float>(clip / current);
    }
    auto& pl = plans[k];
    pl.absmax_scale = optim::scale_is_absmax(grp.state.percentile_scale, s.m.mode == mode_int8 ? s.m.block : s.v.block);
    pl.sgd = {static_cast<float>(lr), static_cast<float>(hp.momentum), static_cast<float>(1 - hp.dampening),
              static_cast<float>(hp.weight_decay), gscale, hp.nesterov};
    pl.first = !s.momentum_started;
    // Bias corrections in double, as torch.optim computes them from Python floats.
    // Per tensor, as torch counts state["step"]: a tensor added later starts from step 1.
    // Tensors of a group usually share the step count: the powers are computed once for them.
    const double ts = static_cast<double>(++s.steps);
    if (hp.beta1 != corrections.beta1 || hp.beta2 != corrections.beta2 || ts != corrections.ts)
      corrections = {hp.beta1, hp.beta2, ts, 1 - std::pow(hp.beta1, ts), 1 - std::pow(hp.beta2, ts)};
    const double bc1 = corrections.bc1;
    const double bc2 = corrections.bc2;
    pl.adam = {static_cast<float>(hp.beta1),
               static_cast<float>(hp.beta2),
               static_cast<float>(1 - hp.beta1),
               static_cast<float>(1 - hp.beta2),
               static_cast<float>(hp.eps),
               static_cast<float>(lr / bc1),
               static_cast<float>(1 / std::sqrt(bc2)),
               kind_ == optimizer_kind::adamw ? static_cast<float>(1 - lr * hp.weight_decay) : 1.0f,
               kind_ == optimizer_kind::adam ? static_cast<float>(hp.weight_decay) : 0.0f,
               gscale};
    for (int which = 0; which < 3; ++which) {
      rounding& r = which == 0 ? pl.rm : which == 1 ? pl.rv : pl.rx;
      r.stochastic = grp.state.stochastic_rounding;
      r.percentile = grp.state.percentile_scale;
      r.key = quant::random_key(options_.seed, static_cast<std::uint64_t>(t),
                                options_.tensor_keys.empty() ? k : options_.tensor_keys[k], static_cast<std::uint64_t>(which));
    }
    // Threads split tensors into pieces of whole chunks (8-bit blocks).
    const std::size_t chunk = optim::chunk_of(s);
    pl.piece = ((std::size_t{1} << 16) + chunk - 1) / chunk * chunk;
    total += numel_of(s);
  }

  if (!where_.is_cpu()) {
    // One fused multi-tensor step on the device (optim_cuda.cu), with the constants above.
    std::vector<cuda::tensor_update> list;
    list.reserve(slots_.size());
    for (std::size_t k = 0; k < slots_.size(); ++k) {
      auto& s = slots_[k];
      const auto& pl = plans[k];
      cuda::tensor_update u;
      u.p = reinterpret_cast<float*>(s.p->value.bytes());
      u.g = reinterpret_cast<const float*>(std::as_const(*s.p).grad.bytes());
      u.n = static_cast<std::int64_t>(numel_of(s));
      auto ref = [](moment& mo, const rounding& r) {
        cuda::moment_ref out;
        out.mode = mo.mode;
        out.is_signed = mo.is_signed;
        out.data = mo.mode == mode_none ? nullptr : mo.data.bytes();
        out.scales = mo.mode == mode_int8 ? reinterpret_cast<float*>(mo.scales.bytes()) : nullptr;
        out.key = r.key;
        return out;
      };
      u.m = ref(s.m, pl.rm);
      u.v = ref(s.v, pl.rv);
      u.x = ref(s.vmax, pl.rx);
      for (const auto* mo : {&s.m, &s.v, &s.vmax})
        if (mo->mode == mode_int8) u.block = mo->block;
      const auto& a = pl.adam;
      const auto& g = pl.sgd;
      u.c = {a.beta1, a.beta2, a.one_minus_beta1, a.one_minus_beta2, a.eps, a.step_size, a.inv_bias2_sqrt, a.decay, a.l2,
             g.lr,    g.momentum, g.one_minus_dampening, g.wd, kind_ == optimizer_kind::sgd ? g.gscale : a.gscale,
             g.nesterov, pl.first};
      u.stochastic = groups_[s.group].state.stochastic_rounding;
      u.percentile = pl.absmax_scale ? 0.0 : pl.rv.percentile;
      list.push_back(u);
    }
    if (together) {
      std::vector<const float*> grads;
      std::vector<std::int64_t> sizes;
      std::vector<std::uint32_t> limits;
      device_gradients(grads, sizes, limits);
      if (!cuda::checked_step(kind_ == optimizer_kind::sgd, list, grads, sizes, limits, where_.index)) {
        --steps_;
        for (auto& s : slots_) --s.steps;
        ++skipped_;
        return false;
      }
    } else {
      cuda::optimizer_step(kind_ == optimizer_kind::sgd, list, where_.index);
    }
  } else if (reference) {
    for (std::size_t k = 0; k < slots_.size(); ++k) optim::reference_step(kind_, slots_[k], plans[k]);
  } else {
    struct job {
      std::size_t slot, begin, end;
    };
    std::vector<job> jobs;
    for (std::size_t k = 0; k < slots_.size(); ++k)
      for (std::size_t b = 0, n = numel_of(slots_[k]); b < n; b += plans[k].piece)
        jobs.push_back({k, b, std::min(n, b + plans[k].piece)});
    run_jobs(jobs.size(), thread_count(total), [&](std::size_t j, int w) {
      float* const buffers = scratch.get() + static_cast<std::size_t>(w) * per_worker;
      optim::fast_step(kind_, slots_[jobs[j].slot], plans[jobs[j].slot], jobs[j].begin, jobs[j].end, buffers);
    });
  }
  for (auto& s : slots_)
    if (s.m.mode != mode_none) s.momentum_started = true;
  return true;
}

std::function<double(std::int64_t, double)> cosine_lr(double total_steps) {
  if (!(total_steps >= 1) || !std::isfinite(total_steps))
    throw std::invalid_argument("a cosine schedule needs a finite number of steps of at least 1, not " +
                                std::to_string(total_steps));
  return [total_steps](std::int64_t step, double base) {
    return base * 0.5 * (1 + std::cos(M_PI * static_cast<double>(step - 1) / total_steps));
  };
}

}  // namespace troupe::kernels
