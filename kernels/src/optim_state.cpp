// Saving and loading optimizer state.
//
// Format (little-endian, version 3; version 2 has no per-tensor step count, which loads as the
// optimizer's, and version 1 differs from 2 in the parameters' names, see same_parameter): the
// magic "TRPO", a u32 version, the optimizer kind (u8), steps and skipped steps (i64), a varint
// tensor count; per tensor its parameter name, rank and dims (varints), whether its momentum
// has started (u8), the steps it took (varint, version 3), its recent squared gradient norms
// (varint count, f32 each), then three moments (first, second, AMSGrad maximum), each: its
// storage (u8: 0 absent, 1 fp32, 2 bf16, 3 int8) and, when present, the map id (u8: 0 none, 1
// signed dynamic, 2 unsigned dynamic), the block size (u32), the values as a tensor in the wire
// codec (dtype f32, bf16 or u8, with its shape) and, for int8, the block scales as an f32
// tensor. Finally a u32 CRC-32 of everything before it. Loading checks everything before it
// changes anything.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "troupe/kernels/optim.hpp"

#include "checksum.hpp"
#include "cuda_ops.hpp"
#include "quantize.hpp"

namespace troupe::kernels {
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
  write_checksummed(path, w, [&](const std::string& why) { fail(path, why); });
}

void optimizer::load(const std::string& path) {
  const auto file =
      read_checksummed(path, magic, "optimizer state", [&](const std::string& why) { fail(path, why); });
  byte_reader r(file.body());
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
      fail(path, "has format version " + std::to_string(v) + "; this build reads versions 1 to " + std::to_string(version));
    const auto kind = r.read_raw<std::uint8_t>();
    if (kind != static_cast<std::uint8_t>(kind_))
      fail(path, "holds the state of " + std::string(kind_name(kind)) + ", this optimizer is " +
                     kind_name(static_cast<std::uint8_t>(kind_)));
    steps = r.read_raw<std::int64_t>();
    skipped = r.read_raw<std::int64_t>();
    if (steps < 0 || skipped < 0 || steps > (std::int64_t{1} << 53) || skipped > (std::int64_t{1} << 53))
      fail(path, "has a step count out of range (" + std::to_string(steps) + ", " + std::to_string(skipped) + " skipped)");
    const auto count = r.read_varint();
    if (count != slots_.size())
      fail(path, "holds " + std::to_string(count) + " tensors; the optimizer has " + std::to_string(slots_.size()));
    for (const auto& s : slots_) {
      const auto where = "tensor " + std::to_string(next.size()) + " ('" + s.p->name + "')";
      const auto name = codec<std::string>::decode(r);
      const auto rank = r.read_varint();
      if (rank > 16) fail(path, where + ": rank " + std::to_string(rank));
      tensor::shape_type shape(rank);
      for (auto& d : shape) d = static_cast<std::int64_t>(r.read_varint());
      if (!same_parameter(name, s.p->name, v) || shape != s.p->value.shape())
        fail(path, where + " is '" + name + "' " + tensor::str(shape) + " in the file; the optimizer expects '" +
                       s.p->name + "' " + s.p->value.str());
      loaded l;
      l.started = r.read_raw<std::uint8_t>() != 0;
      l.steps = steps;  // (before version 3, every tensor took every step)
      if (v >= 3) {
        const auto taken = r.read_varint();
        if (taken > static_cast<std::uint64_t>(steps))
          fail(path, where + " took " + std::to_string(taken) + " steps, more than the optimizer's " + std::to_string(steps));
        l.steps = static_cast<std::int64_t>(taken);
      }
      const auto norms = r.read_varint();
      if (norms > 100) fail(path, where + ": " + std::to_string(norms) + " gradient norms (at most 100)");
      for (std::uint64_t i = 0; i < norms; ++i) {
        l.gnorms.push_back(r.read_raw<float>());
        if (!(l.gnorms.back() >= 0) || !std::isfinite(l.gnorms.back()))
          fail(path, where + ": a gradient norm of " + std::to_string(l.gnorms.back()));
      }
      const std::int64_t n = s.p->value.numel();
      int which = 0;
      for (moment* mo : {&l.m, &l.v, &l.vmax}) {
        const char* mname = which == 0 ? "first moment" : which == 1 ? "second moment" : "AMSGrad maximum";
        const bool is_signed = which++ == 0;
        mo->mode = r.read_raw<std::uint8_t>();
        if (mo->mode == 0) continue;
        if (mo->mode > 3) fail(path, where + " " + mname + ": unknown storage " + std::to_string(mo->mode));
        const auto map = r.read_raw<std::uint8_t>();
        mo->block = r.read_raw<std::uint32_t>();
        mo->is_signed = is_signed;
        mo->data = codec<tensor>::decode(r);
        const dtype want = mo->mode == 1 ? dtype::f32 : mo->mode == 2 ? dtype::bf16 : dtype::u8;
        if (mo->data.type() != want || mo->data.numel() != n)
          fail(path, where + " " + mname + " is " + mo->data.str() + "; expected " + std::to_string(n) + " of " +
                         name_of(want));
        if (mo->mode == 1 || mo->mode == 2) {
          // What a step could have written: no NaN, and the second moment and its maximum >= 0.
          // (A finite gradient above 2^64 makes its square, and so the second moment, infinite,
          // as in torch.optim.)
          for (std::int64_t i = 0; i < n; ++i) {
            const float x = mo->mode == 1 ? mo->data.data<float>()[i] : quant::from_bf16(mo->data.data<std::uint16_t>()[i]);
            if (std::isnan(x) || (!is_signed && x < 0))
              fail(path, where + " " + mname + " holds " + std::to_string(x) + " at element " + std::to_string(i));
          }
        }
        if (mo->mode == 3) {
          if (map != quant::qmap::dynamic(is_signed).id())
            fail(path, where + " " + mname + ": quantization map " + std::to_string(map) + " is not the one it needs");
          if (mo->block < 1) fail(path, where + " " + mname + ": block size 0");
          if (!where_.is_cpu() && mo->block > cuda::max_int8_block)
            fail(path, where + " " + mname + ": 8-bit blocks of " + std::to_string(mo->block) + " elements; on " +
                           where_.str() + " the largest is " + std::to_string(cuda::max_int8_block));
          mo->scales = codec<tensor>::decode(r);
          if (mo->scales.type() != dtype::f32 || mo->scales.numel() != (n + mo->block - 1) / mo->block)
            fail(path, where + " " + mname + ": " + mo->scales.str() + " scales for blocks of " +
                           std::to_string(mo->block));
          for (float sc : mo->scales.data<float>())
            if (!(sc >= 0) || !std::isfinite(sc))
              fail(path, where + " " + mname + ": a block scale of " + std::to_string(sc));
        } else {
          if (map != 0 || mo->block != 0) fail(path, where + " " + mname + ": a map or block size without 8-bit codes");
        }
      }
      next.push_back(std::move(l));
    }
    if (r.remaining() != 0) fail(path, std::to_string(r.remaining()) + " unexpected bytes after the state");
  } catch (const troupe::error& e) {
    fail(path, std::string("cannot be decoded: ") + e.what());
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
