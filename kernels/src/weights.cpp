#include "troupe/kernels/weights.hpp"

#include <cmath>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "checksum.hpp"

namespace troupe::kernels {
namespace {

constexpr char magic[4] = {'T', 'R', 'P', 'W'};
constexpr std::uint32_t version = 2;  // 1: parameters by their bare names (same_parameter)

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("weights file '" + path + "': " + why);
}

}  // namespace

void save_weights(layer& model, const std::string& path) {
  byte_writer w;
  w.write_bytes(magic, sizeof magic);
  w.write_raw(version);
  const auto params = model.parameters();
  w.write_varint(params.size());
  for (auto* p : params) {
    codec<std::string>::encode(w, p->name);
    codec<tensor>::encode(w, p->value);
  }
  write_checksummed(path, w, [&](const std::string& why) { fail(path, why); });
}

void load_weights(layer& model, const std::string& path) {
  const auto file = read_checksummed(path, magic, "weights", [&](const std::string& why) { fail(path, why); });
  byte_reader r(file.body());
  auto params = model.parameters();
  std::vector<tensor> values;
  try {
    const auto v = r.read_raw<std::uint32_t>();
    if (v != 1 && v != version)
      fail(path, "has format version " + std::to_string(v) + "; this build reads versions 1 to " + std::to_string(version));
    const auto count = r.read_varint();
    if (count != params.size())
      fail(path, "holds " + std::to_string(count) + " parameters; the model has " + std::to_string(params.size()));
    for (auto* p : params) {
      const auto name = codec<std::string>::decode(r);
      tensor t = codec<tensor>::decode(r);
      if (!same_parameter(name, p->name, v) || t.shape() != p->value.shape() || t.type() != p->value.type())
        fail(path, "parameter " + std::to_string(values.size()) + " is '" + name + "' " + t.str() +
                       "; the model expects '" + p->name + "' " + p->value.str());
      if (t.type() == dtype::f32 && !all_finite(t.data<float>()))
        fail(path, "parameter '" + name + "' holds a value that is not finite");
      values.push_back(std::move(t));
    }
    if (r.remaining() != 0) fail(path, std::to_string(r.remaining()) + " unexpected bytes after the parameters");
  } catch (const troupe::error& e) {
    fail(path, std::string("cannot be decoded: ") + e.what());
  }
  // Everything checked: only now change the model.
  for (std::size_t i = 0; i < params.size(); ++i) copy(values[i], params[i]->value);
}

}  // namespace troupe::kernels
