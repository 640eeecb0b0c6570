// Shards of a training checkpoint (checkpoint.hpp): stages and optimizer state of one holder.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "checksum.hpp"
#include "troupe/kernels/checkpoint.hpp"

namespace troupe::kernels {
namespace {

constexpr char magic[4] = {'T', 'R', 'P', 'S'};
constexpr std::uint32_t version = 1;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("checkpoint shard " + path + " " + why);
}

std::string hex(std::uint32_t v) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", v);
  return s;
}

/// Whether every value of `t` is finite (no NaN, no infinity); true for integer tensors. bf16 and
/// f16 hold a NaN or an infinity where every exponent bit is set.
bool finite(const tensor& t) {
  switch (t.type()) {
    case dtype::f32: return all_finite(t.data<float>());
    case dtype::bf16:
    case dtype::f16: {
      const std::uint16_t exponent = t.type() == dtype::bf16 ? 0x7f80 : 0x7c00;
      for (const std::uint16_t bits : t.data<std::uint16_t>())
        if ((bits & exponent) == exponent) return false;
      return true;
    }
    default: return true;
  }
}

/// A stage as its shard holds it, decoded and checked before anything changes.
struct decoded_stage {
  std::vector<tensor> values;
  std::vector<std::string> random;
};

}  // namespace

std::string shard_name(int rank, const std::string& slot) { return "rank" + std::to_string(rank) + "-" + slot + ".shard"; }

shard_info write_shard(const std::string& path, const std::vector<shard_stage>& stages, const optimizer& opt) {
  byte_writer w;
  w.write_bytes(magic, sizeof magic);
  w.write_raw(version);
  w.write_varint(stages.size());
  for (const auto& s : stages) {
    w.write_varint(static_cast<std::uint64_t>(s.index));
    codec<std::string>::encode(w, s.layers->describe());
    const auto params = s.layers->parameters();
    w.write_varint(params.size());
    for (auto* p : params) {
      codec<std::string>::encode(w, p->name);
      codec<tensor>::encode(w, p->value.where().is_cpu() ? p->value : p->value.to(device::cpu()));
    }
    std::vector<std::string> random;
    s.layers->save_random_state(random);
    w.write_varint(random.size());
    for (const auto& r : random) codec<std::string>::encode(w, r);
  }
  const auto state = opt.save_state();
  w.write_varint(state.size());
  w.write_bytes(state.data(), state.size());
  write_checksummed(path, w, [&](const std::string& why) { fail(path, "cannot be written: " + why); });
  const auto& bytes = w.buffer();  // (with its CRC appended)
  return {std::filesystem::path(path).filename().string(), crc32(bytes), bytes.size()};
}

void read_shard(const std::string& path, const shard_info& expected, const std::vector<shard_stage>& stages,
                optimizer& opt) {
  check_file(check_regular, path, [&](const std::string& why) { fail(path, why); });
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(path, "is missing or cannot be read (the manifest names it)");
  const auto size = static_cast<std::uint64_t>(in.tellg());
  if (size != expected.bytes)
    fail(path, "is truncated or was replaced: " + std::to_string(size) + " bytes, the manifest says " +
                   std::to_string(expected.bytes));
  std::vector<std::byte> bytes(size);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (static_cast<std::uint64_t>(in.gcount()) != size) fail(path, "could not be read whole (it changed while being read?)");
  if (const auto crc = crc32(bytes); crc != expected.crc)
    fail(path, "is corrupted: its CRC-32 is " + hex(crc) + ", the manifest says " + hex(expected.crc));
  // What the manifest vouches for is a shard of this format, unless the manifest itself is of
  // another build: checked all the same.
  if (bytes.size() < sizeof magic + 8 || std::memcmp(bytes.data(), magic, sizeof magic) != 0)
    fail(path, "is not a troupe checkpoint shard (no TRPS header)");
  byte_reader r(std::span<const std::byte>(bytes).subspan(sizeof magic, bytes.size() - sizeof magic - 4));
  std::vector<decoded_stage> decoded;
  std::span<const std::byte> state;
  try {
    if (const auto v = r.read_raw<std::uint32_t>(); v != version)
      fail(path, "has format version " + std::to_string(v) + "; this build reads version " + std::to_string(version));
    const auto count = r.read_varint();
    if (count != stages.size())
      fail(path, "holds " + std::to_string(count) + " stages; this rank holds " + std::to_string(stages.size()) +
                     " (the checkpoint was cut otherwise)");
    for (const auto& s : stages) {
      const auto index = r.read_varint();
      const auto layers = codec<std::string>::decode(r);
      if (index != static_cast<std::uint64_t>(s.index) || layers != s.layers->describe())
        fail(path, "holds stage " + std::to_string(index) + " as " + layers + "; this run's stage " +
                       std::to_string(s.index) + " is " + s.layers->describe() + " (another model or cut)");
      const auto params = s.layers->parameters();
      if (const auto n = r.read_varint(); n != params.size())
        fail(path, "holds " + std::to_string(n) + " parameters of stage " + std::to_string(s.index) + "; it has " +
                       std::to_string(params.size()));
      decoded_stage d;
      for (auto* p : params) {
        const auto name = codec<std::string>::decode(r);
        tensor t = codec<tensor>::decode(r);
        if (name != p->name || t.shape() != p->value.shape() || t.type() != p->value.type())
          fail(path, "holds parameter '" + name + "' " + t.str() + " where the model has '" + p->name + "' " +
                         p->value.str());
        if (!finite(t))
          fail(path, "holds a value of parameter '" + name + "' that is not finite");
        d.values.push_back(std::move(t));
      }
      const auto randoms = r.read_length(1);
      for (std::size_t i = 0; i < randoms; ++i) d.random.push_back(codec<std::string>::decode(r));
      decoded.push_back(std::move(d));
    }
    state = r.take(r.read_length(1));
    if (r.remaining() != 0) fail(path, "has " + std::to_string(r.remaining()) + " unexpected bytes at its end");
  } catch (const troupe::error& e) {
    fail(path, std::string("cannot be decoded: ") + e.what());
  }
  // The random states must fit the stages' generators: tried on each stage, which is put back
  // as it was when they do not.
  for (std::size_t i = 0; i < stages.size(); ++i) {
    auto& layers = *stages[i].layers;
    std::vector<std::string> before;
    layers.save_random_state(before);
    std::size_t next = 0;
    std::string why;
    try {
      layers.load_random_state(decoded[i].random, next);
      if (next != decoded[i].random.size())
        why = "holds " + std::to_string(decoded[i].random.size()) + " random states for stage " +
              std::to_string(stages[i].index) + "'s " + std::to_string(next) + " generators";
    } catch (const std::exception& e) {
      why = std::string("holds a random state that stage ") + std::to_string(stages[i].index) + " cannot take: " + e.what();
    }
    std::size_t back = 0;
    layers.load_random_state(before, back);
    if (!why.empty()) fail(path, why);
  }
  // Everything that can fail comes before the first change: the values go to their parameters'
  // devices first (allocations, transfers), the optimizer checks its state before it takes it.
  // What is left to do then is copies between tensors of one device, type and size.
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const auto params = stages[i].layers->parameters();
    for (std::size_t k = 0; k < params.size(); ++k) {
      auto& v = decoded[i].values[k];
      if (v.where() != params[k]->value.where()) v = v.to(params[k]->value.where());
    }
  }
  try {
    opt.load_state(state);  // checks everything before it changes anything
  } catch (const std::runtime_error& e) {
    fail(path, std::string("holds optimizer state that does not fit: ") + e.what());
  }
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const auto params = stages[i].layers->parameters();
    for (std::size_t k = 0; k < params.size(); ++k) copy(decoded[i].values[k], params[k]->value);
    std::size_t next = 0;
    stages[i].layers->load_random_state(decoded[i].random, next);
  }
}

}  // namespace troupe::kernels
