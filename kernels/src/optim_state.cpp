// The optimizer's state: the storage each moment gets (fp32, bf16 or 8-bit blocks; automatic
// groups by the memory available, lowered one level at a time when an allocation fails), its
// conversion when the storage changes, the moments seen as fp32 by the step, the memory report,
// and saving and loading.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <stdexcept>
#include <vector>

#include "troupe/kernels/optim.hpp"

#include "troupe/core/log.hpp"

#include "checksum.hpp"
#include "cuda_ops.hpp"
#include "optim_step.hpp"
#include "quantize.hpp"

namespace troupe::kernels {

// ---- the moments as fp32 -----------------------------------------------------------------------

namespace optim {

const quant::qmap& map_of(const optimizer::moment& mo) { return quant::qmap::dynamic(mo.is_signed); }

quant::block_options block_opts(const optimizer::moment& mo, const rounding& r) {
  quant::block_options o;
  o.block = static_cast<std::size_t>(mo.block);
  o.percentile = r.percentile;
  o.stochastic = r.stochastic;
  return o;
}

float* load_moment(optimizer::moment& mo, std::size_t b, std::size_t n, float* out) {
  switch (mo.mode) {
    case mode_fp32: return mo.data.data<float>().data() + b;
    case mode_bf16: {
      const std::uint16_t* h = mo.data.data<std::uint16_t>().data() + b;
      for (std::size_t i = 0; i < n; ++i) out[i] = quant::from_bf16(h[i]);
      return out;
    }
    case mode_int8: {
      // b is a block boundary and n at most one block.
      const float s = mo.scales.data<float>()[b / static_cast<std::size_t>(mo.block)];
      quant::dequantize_block(mo.data.data<std::uint8_t>().data() + b, n, s, map_of(mo), out);
      return out;
    }
    default: return nullptr;
  }
}

void store_moment(optimizer::moment& mo, std::size_t b, std::size_t n, const float* x, const rounding& r, bool reference) {
  switch (mo.mode) {
    case mode_bf16: {
      std::uint16_t* h = mo.data.data<std::uint16_t>().data() + b;
      if (r.stochastic && reference)
        for (std::size_t i = 0; i < n; ++i)
          h[i] = quant::to_bf16_stochastic(x[i], quant::random_bits(r.key, static_cast<std::uint32_t>(b + i)));
      else if (r.stochastic)
        quant::to_bf16_stochastic(x, n, r.key, static_cast<std::uint32_t>(b), h);
      else
        for (std::size_t i = 0; i < n; ++i) h[i] = quant::to_bf16(x[i]);
      return;
    }
    case mode_int8: {
      const auto o = block_opts(mo, r);
      float& s = mo.scales.data<float>()[b / o.block];
      s = quant::stored_scale(quant::block_scale(x, n, o.percentile));
      std::uint8_t* c = mo.data.data<std::uint8_t>().data() + b;
      if (reference) quant::quantize_block_reference(x, n, s, map_of(mo), o, r.key, static_cast<std::uint32_t>(b), c);
      else quant::quantize_block(x, n, s, map_of(mo), o, r.key, static_cast<std::uint32_t>(b), c);
      return;
    }
    default: return;
  }
}

std::vector<float> decode(const optimizer::moment& mo, std::size_t n) {
  std::vector<float> out(n);
  switch (mo.mode) {
    case mode_fp32: std::copy_n(mo.data.data<float>().data(), n, out.data()); break;
    case mode_bf16:
      for (std::size_t i = 0; i < n; ++i) out[i] = quant::from_bf16(mo.data.data<std::uint16_t>()[i]);
      break;
    case mode_int8:
      quant::dequantize_blockwise(mo.data.data<std::uint8_t>().data(), mo.scales.data<float>().data(), n,
                                  static_cast<std::size_t>(mo.block), map_of(mo), out.data());
      break;
    default: break;
  }
  return out;
}

}  // namespace optim

// ---- storage choice and conversion ---------------------------------------------------------------

namespace {

using optim::mode_bf16, optim::mode_fp32, optim::mode_int8, optim::mode_none;
using optim::numel_of;

std::uint8_t mode_of(state_storage s) {
  switch (s) {
    case state_storage::bf16: return mode_bf16;
    case state_storage::int8: return mode_int8;
    default: return mode_fp32;
  }
}

/// MemAvailable from /proc/meminfo, in bytes; 0 when unknown.
std::size_t host_available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::size_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

/// The state a slot needs: which moments, in which storage.
struct wanted {
  std::uint8_t m = mode_none, v = mode_none, vmax = mode_none;
  std::int64_t block = 0;
};

/// A moment whose tensors are on the host (itself when they are).
optimizer::moment on_host(const optimizer::moment& mo) {
  optimizer::moment out = mo;
  if (out.data.defined()) out.data = out.data.to(device::cpu());
  if (out.scales.defined()) out.scales = out.scales.to(device::cpu());
  return out;
}

}  // namespace

void optimizer::prepare() {
  // Choose storage for automatic groups (again when a group's storage changed).
  const bool first = seen_hp_.empty();
  bool resolve = first || groups_.size() != seen_hp_.size();
  for (std::size_t g = 0; g < groups_.size() && !resolve; ++g)
    if (groups_[g].state.storage != seen_state_[g].storage) resolve = true;
  if (resolve) {
    resolved_.assign(groups_.size(), state_storage::fp32);
    std::size_t fp32_bytes = 0;
    bool any = false;
    for (const auto& s : slots_) {
      const auto& grp = groups_[s.group];
      if (grp.state.storage != state_storage::automatic) continue;
      any = true;
      const std::size_t moments =
          kind_ == optimizer_kind::sgd ? (grp.hp.momentum != 0 ? 1 : 0) : (grp.hp.amsgrad ? 3 : 2);
      fp32_bytes += moments * 4 * numel_of(s);
    }
    state_storage choice = state_storage::fp32;
    if (any) {
      if (const char* env = std::getenv("TROUPE_OPTIM_STATE"); env && *env) {
        try {
          choice = parse_state_storage(env);
        } catch (const std::invalid_argument&) {
          throw std::invalid_argument(std::string("TROUPE_OPTIM_STATE='") + env +
                                      "' is not one of: fp32, bf16, int8, auto");
        }
      } else {
        choice = state_storage::automatic;
      }
      if (choice == state_storage::automatic) {
        const std::size_t avail = options_.available_memory ? options_.available_memory
                                  : where_.is_cpu()          ? host_available_memory()
                                                             : cuda::free_memory(where_.index);
        const std::size_t small = std::size_t{64} << 20;
        if (fp32_bytes < small || avail == 0 || fp32_bytes <= avail / 4) choice = state_storage::fp32;
        else if (fp32_bytes / 2 <= avail / 4) choice = state_storage::bf16;
        else choice = state_storage::int8;
        if (choice != state_storage::fp32)
          log().info("optimizer state: {} ({} MiB in fp32, {} MiB available)", name_of(choice), fp32_bytes >> 20,
                     avail >> 20);
      }
    }
    for (std::size_t g = 0; g < groups_.size(); ++g)
      resolved_[g] = groups_[g].state.storage == state_storage::automatic ? choice : groups_[g].state.storage;
  }
  seen_hp_.clear();
  seen_state_.clear();
  for (const auto& g : groups_) {
    seen_hp_.push_back(g.hp);
    seen_state_.push_back(g.state);
  }
  // Allocate or convert; when memory runs out, lower automatic groups one level and start over.
  for (std::size_t i = 0; i < slots_.size();) {
    try {
      allocate(slots_[i]);
      ++i;
    } catch (const std::bad_alloc&) {
      bool lowered = false;
      for (std::size_t g = 0; g < groups_.size(); ++g) {
        if (groups_[g].state.storage != state_storage::automatic || resolved_[g] == state_storage::int8) continue;
        const auto from = resolved_[g];
        resolved_[g] = from == state_storage::fp32 ? state_storage::bf16 : state_storage::int8;
        log().warn("optimizer state of group {} does not fit in memory as {}: converting to {}", g, name_of(from),
                   name_of(resolved_[g]));
        lowered = true;
      }
      if (!lowered) throw;
      i = 0;
    }
  }
}

void optimizer::allocate(slot& s) {
  const auto& grp = groups_[s.group];
  const auto& so = grp.state;
  const std::size_t n = numel_of(s);
  wanted w;
  std::uint8_t compressed = mode_of(resolved_[s.group]);
  const bool forced = std::find(so.fp32_params.begin(), so.fp32_params.end(), s.p->name) != so.fp32_params.end();
  if (forced || (compressed == mode_int8 && static_cast<std::int64_t>(n) < so.min_8bit_elements))
    compressed = mode_fp32;
  if (kind_ == optimizer_kind::sgd) {
    if (grp.hp.momentum != 0) w.m = so.first_moment_fp32 ? mode_fp32 : compressed;
  } else {
    w.m = so.first_moment_fp32 ? mode_fp32 : compressed;
    w.v = compressed;
    if (grp.hp.amsgrad) w.vmax = compressed;
  }
  // A block longer than the tensor is the tensor: one scale either way, and scratch for no more.
  w.block = std::min<std::int64_t>(so.block_size, std::max<std::int64_t>(1, static_cast<std::int64_t>(n)));

  auto fit = [&](moment& mo, std::uint8_t mode, bool is_signed) {
    const std::int64_t block = mode == mode_int8 ? w.block : 0;
    if (mo.mode == mode && mo.block == block) return;
    if (mode == mode_none) {
      mo = moment{};
      if (&mo == &s.m) s.momentum_started = false;
      return;
    }
    // New storage, filled from the old values (zeros when there were none).
    const std::int64_t len = static_cast<std::int64_t>(n);
    std::size_t bytes = 0;
    const std::size_t blocks = block ? (n + static_cast<std::size_t>(block) - 1) / static_cast<std::size_t>(block) : 0;
    bytes = mode == mode_fp32 ? 4 * n : mode == mode_bf16 ? 2 * n : n + 4 * blocks;
    // (The old storage of this moment is freed by the conversion: not counted with the new.)
    const std::size_t replaced = (mo.data.defined() ? mo.data.nbytes() : 0) + (mo.scales.defined() ? mo.scales.nbytes() : 0);
    if (options_.state_memory_limit && state_bytes() - replaced + bytes > options_.state_memory_limit)
      throw std::bad_alloc();
    moment next;
    next.mode = mode;
    next.is_signed = is_signed;
    next.block = block;
    // Conversions go through the host; the new state is then copied to the parameters' device.
    const std::vector<float> old = mo.mode == mode_none ? std::vector<float>() : optim::decode(on_host(mo), n);
    switch (mode) {
      case mode_fp32:
        next.data = tensor::zeros({len});
        if (!old.empty()) std::copy(old.begin(), old.end(), next.data.data<float>().begin());
        break;
      case mode_bf16: {
        next.data = tensor::zeros({len}, dtype::bf16);
        auto h = next.data.data<std::uint16_t>();
        for (std::size_t i = 0; i < old.size(); ++i) h[i] = quant::to_bf16(old[i]);
        break;
      }
      case mode_int8: {
        next.data = tensor::empty({len}, dtype::u8);
        next.scales = tensor::zeros({static_cast<std::int64_t>(blocks)});
        const auto& map = optim::map_of(next);
        if (old.empty()) {
          std::fill_n(next.data.data<std::uint8_t>().data(), n, map.zero_code());
        } else {
          quant::block_options o;
          o.block = static_cast<std::size_t>(block);
          o.percentile = so.percentile_scale;
          quant::quantize_blockwise(old.data(), n, map, o, 0, next.data.data<std::uint8_t>().data(),
                                    next.scales.data<float>().data());
        }
        break;
      }
    }
    if (!where_.is_cpu()) {
      next.data = next.data.to(where_);
      if (next.scales.defined()) next.scales = next.scales.to(where_);
    }
    mo = std::move(next);
  };
  fit(s.m, w.m, true);
  fit(s.v, w.v, false);
  fit(s.vmax, w.vmax, false);
}

state_memory optimizer::state_memory_total() const noexcept {
  state_memory total;
  for (const auto& t : state_report()) {
    total.codes += t.bytes.codes;
    total.scales += t.bytes.scales;
    total.fp32 += t.bytes.fp32;
  }
  return total;
}

std::vector<tensor_state> optimizer::state_report() const {
  std::vector<tensor_state> out;
  for (const auto& s : slots_) {
    tensor_state t;
    t.name = s.p->name;
    t.numel = s.p->value.numel();
    for (const moment* mo : {&s.m, &s.v, &s.vmax}) {
      switch (mo->mode) {
        case mode_fp32: t.bytes.fp32 += mo->data.nbytes(); break;
        case mode_bf16:
          t.bytes.codes += mo->data.nbytes();
          t.storage = state_storage::bf16;
          break;
        case mode_int8:
          t.bytes.codes += mo->data.nbytes();
          t.bytes.scales += mo->scales.nbytes();
          t.storage = state_storage::int8;
          break;
        default: break;
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

// ---- saving and loading ------------------------------------------------------------------------
//
// The file (little-endian, version 3; version 2 has no per-tensor step count, which loads as
// the optimizer's, and version 1 differs from 2 in the parameters' names, see same_parameter):
// the magic "TRPO", a u32 version, the optimizer kind (u8), steps and skipped steps (i64), a
// varint tensor count; per tensor its parameter name, rank and dims (varints), whether its
// momentum has started (u8), the steps it took (varint, version 3), its recent squared gradient
// norms (varint count, f32 each), then three moments (first, second, AMSGrad maximum), each: its
// storage (u8: 0 absent, 1 fp32, 2 bf16, 3 int8) and, when present, the map id (u8: 0 none, 1
// signed dynamic, 2 unsigned dynamic), the block size (u32), the values as a tensor in the wire
// codec (dtype f32, bf16 or u8, with its shape) and, for int8, the block scales as an f32
// tensor. Finally a u32 CRC-32 of everything before it. Loading checks everything before it
// changes anything.

namespace {

constexpr char magic[4] = {'T', 'R', 'P', 'O'};
constexpr std::uint32_t version = 3;  // 2: no per-tensor steps; 1: also parameters by their bare names

std::string kind_name(std::uint8_t kind) {
  switch (kind) {
    case static_cast<std::uint8_t>(optimizer_kind::sgd): return "SGD";
    case static_cast<std::uint8_t>(optimizer_kind::adam): return "Adam";
    case static_cast<std::uint8_t>(optimizer_kind::adamw): return "AdamW";
    default: return "an unknown optimizer (kind " + std::to_string(kind) + ")";
  }
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("optimizer state file '" + path + "': " + why);
}

}  // namespace

void optimizer::save(const std::string& path) const {
  byte_writer w;
  w.write_bytes(magic, sizeof magic);
  write_state(w);
  write_checksummed(path, w, [&](const std::string& why) { fail(path, why); });
}

std::vector<std::byte> optimizer::save_state() const {
  byte_writer w;
  write_state(w);
  return w.take();
}

void optimizer::load(const std::string& path) {
  const auto file =
      read_checksummed(path, magic, "optimizer state", [&](const std::string& why) { fail(path, why); });
  read_state(file.body(), [&](const std::string& why) { fail(path, why); });
}

void optimizer::load_state(std::span<const std::byte> bytes) {
  read_state(bytes, [](const std::string& why) { throw std::runtime_error("optimizer state " + why); });
}

void optimizer::reset_state() {
  for (auto& s : slots_) {
    s.m = s.v = s.vmax = moment{};
    s.momentum_started = false;
    s.gnorms.clear();
    s.steps = 0;
    allocate(s);
  }
  steps_ = skipped_ = 0;
}

void optimizer::write_state(byte_writer& w) const {
  w.write_raw(version);
  w.write_raw(static_cast<std::uint8_t>(kind_));
  w.write_raw(steps_);
  w.write_raw(skipped_);
  w.write_varint(slots_.size());
  for (const auto& s : slots_) {
    codec<std::string>::encode(w, s.p->name);
    w.write_varint(s.p->value.shape().size());
    for (auto d : s.p->value.shape()) w.write_varint(static_cast<std::uint64_t>(d));
    w.write_raw(static_cast<std::uint8_t>(s.momentum_started));
    w.write_varint(static_cast<std::uint64_t>(s.steps));
    w.write_varint(s.gnorms.size());
    for (float g : s.gnorms) w.write_raw(g);
    for (const moment* mo : {&s.m, &s.v, &s.vmax}) {
      w.write_raw(mo->mode);
      if (mo->mode == 0) continue;
      const std::uint8_t map = mo->mode == 3 ? quant::qmap::dynamic(mo->is_signed).id() : 0;
      w.write_raw(map);
      w.write_raw(static_cast<std::uint32_t>(mo->block));
      codec<tensor>::encode(w, mo->data);
      if (mo->mode == 3) codec<tensor>::encode(w, mo->scales);
    }
  }
}

void optimizer::read_state(std::span<const std::byte> body, const std::function<void(const std::string&)>& fail_with) {
  auto fail = [&](const std::string& why) {
    fail_with(why);
    throw std::logic_error("optimizer::read_state: fail_with returned");  // it throws
  };
  byte_reader r(body);
  struct loaded {
    moment m, v, vmax;
    bool started;
    std::int64_t steps;
    std::vector<float> gnorms;
  };
  std::vector<loaded> next;
  std::int64_t steps = 0, skipped = 0;
  try {
    const auto v = r.read_raw<std::uint32_t>();
    if (v < 1 || v > version)
      fail("has format version " + std::to_string(v) + "; this build reads versions 1 to " + std::to_string(version));
    const auto kind = r.read_raw<std::uint8_t>();
    if (kind != static_cast<std::uint8_t>(kind_))
      fail("holds the state of " + std::string(kind_name(kind)) + ", this optimizer is " +
                     kind_name(static_cast<std::uint8_t>(kind_)));
    steps = r.read_raw<std::int64_t>();
    skipped = r.read_raw<std::int64_t>();
    if (steps < 0 || skipped < 0 || steps > (std::int64_t{1} << 53) || skipped > (std::int64_t{1} << 53))
      fail("has a step count out of range (" + std::to_string(steps) + ", " + std::to_string(skipped) + " skipped)");
    const auto count = r.read_varint();
    if (count != slots_.size())
      fail("holds " + std::to_string(count) + " tensors; the optimizer has " + std::to_string(slots_.size()));
    for (const auto& s : slots_) {
      const auto where = "tensor " + std::to_string(next.size()) + " ('" + s.p->name + "')";
      const auto name = codec<std::string>::decode(r);
      const auto rank = r.read_varint();
      if (rank > 16) fail(where + ": rank " + std::to_string(rank));
      tensor::shape_type shape(rank);
      for (auto& d : shape) d = static_cast<std::int64_t>(r.read_varint());
      if (!same_parameter(name, s.p->name, v) || shape != s.p->value.shape())
        fail(where + " is '" + name + "' " + tensor::str(shape) + " in the file; the optimizer expects '" +
                       s.p->name + "' " + s.p->value.str());
      loaded l;
      l.started = r.read_raw<std::uint8_t>() != 0;
      l.steps = steps;  // (before version 3, every tensor took every step)
      if (v >= 3) {
        const auto taken = r.read_varint();
        if (taken > static_cast<std::uint64_t>(steps))
          fail(where + " took " + std::to_string(taken) + " steps, more than the optimizer's " + std::to_string(steps));
        l.steps = static_cast<std::int64_t>(taken);
      }
      const auto norms = r.read_varint();
      if (norms > 100) fail(where + ": " + std::to_string(norms) + " gradient norms (at most 100)");
      for (std::uint64_t i = 0; i < norms; ++i) {
        l.gnorms.push_back(r.read_raw<float>());
        if (!(l.gnorms.back() >= 0) || !std::isfinite(l.gnorms.back()))
          fail(where + ": a gradient norm of " + std::to_string(l.gnorms.back()));
      }
      const std::int64_t n = s.p->value.numel();
      int which = 0;
      for (moment* mo : {&l.m, &l.v, &l.vmax}) {
        const char* mname = which == 0 ? "first moment" : which == 1 ? "second moment" : "AMSGrad maximum";
        const bool is_signed = which++ == 0;
        mo->mode = r.read_raw<std::uint8_t>();
        if (mo->mode == 0) continue;
        if (mo->mode > 3) fail(where + " " + mname + ": unknown storage " + std::to_string(mo->mode));
        const auto map = r.read_raw<std::uint8_t>();
        mo->block = r.read_raw<std::uint32_t>();
        mo->is_signed = is_signed;
        mo->data = codec<tensor>::decode(r);
        const dtype want = mo->mode == 1 ? dtype::f32 : mo->mode == 2 ? dtype::bf16 : dtype::u8;
        if (mo->data.type() != want || mo->data.numel() != n)
          fail(where + " " + mname + " is " + mo->data.str() + "; expected " + std::to_string(n) + " of " +
                         name_of(want));
        if (mo->mode == 1 || mo->mode == 2) {
          // What a step could have written: no NaN, and the second moment and its maximum >= 0.
          // (A finite gradient above 2^64 makes its square, and so the second moment, infinite,
          // as in torch.optim.)
          for (std::int64_t i = 0; i < n; ++i) {
            const float x = mo->mode == 1 ? mo->data.data<float>()[i] : quant::from_bf16(mo->data.data<std::uint16_t>()[i]);
            if (std::isnan(x) || (!is_signed && x < 0))
              fail(where + " " + mname + " holds " + std::to_string(x) + " at element " + std::to_string(i));
          }
        }
        if (mo->mode == 3) {
          if (map != quant::qmap::dynamic(is_signed).id())
            fail(where + " " + mname + ": quantization map " + std::to_string(map) + " is not the one it needs");
          if (mo->block < 1) fail(where + " " + mname + ": block size 0");
          if (!where_.is_cpu() && mo->block > cuda::max_int8_block)
            fail(where + " " + mname + ": 8-bit blocks of " + std::to_string(mo->block) + " elements; on " +
                           where_.str() + " the largest is " + std::to_string(cuda::max_int8_block));
          mo->scales = codec<tensor>::decode(r);
          if (mo->scales.type() != dtype::f32 || mo->scales.numel() != (n + mo->block - 1) / mo->block)
            fail(where + " " + mname + ": " + mo->scales.str() + " scales for blocks of " +
                           std::to_string(mo->block));
          for (float sc : mo->scales.data<float>())
            if (!(sc >= 0) || !std::isfinite(sc))
              fail(where + " " + mname + ": a block scale of " + std::to_string(sc));
        } else {
          if (map != 0 || mo->block != 0) fail(where + " " + mname + ": a map or block size without 8-bit codes");
        }
      }
      next.push_back(std::move(l));
    }
    if (r.remaining() != 0) fail(std::to_string(r.remaining()) + " unexpected bytes after the state");
  } catch (const troupe::error& e) {
    fail(std::string("cannot be decoded: ") + e.what());
  }
  // Everything checked: only now change the optimizer (moving the state to the parameters' device).
  if (!where_.is_cpu())
    for (auto& l : next)
      for (moment* mo : {&l.m, &l.v, &l.vmax}) {
        if (mo->data.defined()) mo->data = mo->data.to(where_);
        if (mo->scales.defined()) mo->scales = mo->scales.to(where_);
      }
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].m = std::move(next[i].m);
    slots_[i].v = std::move(next[i].v);
    slots_[i].vmax = std::move(next[i].vmax);
    slots_[i].momentum_started = next[i].started;
    slots_[i].gnorms = std::move(next[i].gnorms);
    slots_[i].steps = next[i].steps;
    slots_[i].numel = slots_[i].p->value.numel();  // the file's state is for the value's shape now
  }
  steps_ = steps;
  skipped_ = skipped;
}

}  // namespace troupe::kernels
