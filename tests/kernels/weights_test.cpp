#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include <troupe/core/codec.hpp>
#include <troupe/core/file.hpp>
#include <troupe/kernels/weights.hpp>

namespace {

using namespace troupe;
using namespace troupe::kernels;

std::string temp(const std::string& name) { return ::testing::TempDir() + name; }

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_all(const std::string& path, const std::vector<char>& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

bool same_weights(layer& a, layer& b) {
  auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (pa[i]->value.nbytes() != pb[i]->value.nbytes() ||
        std::memcmp(pa[i]->value.bytes(), pb[i]->value.bytes(), pa[i]->value.nbytes()) != 0)
      return false;
  return true;
}

TEST(Weights, RoundTripBitExactly) {
  auto a = make_mlp("mlp:12-8-3"), b = make_mlp("mlp:12-8-3");
  a->initialize(1);
  b->initialize(2);
  ASSERT_FALSE(same_weights(*a, *b));
  const auto path = temp("weights_roundtrip.trpw");
  save_weights(*a, path);
  load_weights(*b, path);
  EXPECT_TRUE(same_weights(*a, *b));
}

void expect_load_error(layer& model, const std::string& path, const std::string& fragment) {
  auto before = make_mlp("mlp:12-8-3");
  before->initialize(7);
  model.initialize(7);
  try {
    load_weights(model, path);
    FAIL() << "expected an error containing '" << fragment << "'";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_weights(model, *before)) << "a failed load changed the model";
}

TEST(Weights, BadFilesAreClearErrorsAndLeaveTheModelUnchanged) {
  auto source = make_mlp("mlp:12-8-3");
  source->initialize(3);
  const auto good = temp("weights_good.trpw");
  save_weights(*source, good);
  const auto bytes = read_all(good);
  auto model = make_mlp("mlp:12-8-3");

  expect_load_error(*model, temp("no_such_file.trpw"), "does not exist");
  write_all(temp("weights_text.trpw"), {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!'});
  expect_load_error(*model, temp("weights_text.trpw"), "not a troupe weights file");
  write_all(temp("weights_header.trpw"), std::vector<char>(bytes.begin(), bytes.begin() + 8));
  expect_load_error(*model, temp("weights_header.trpw"), "is truncated (8 bytes, with its TRPW header)");
  for (std::size_t cut : {bytes.size() - 1, bytes.size() / 2, std::size_t{13}}) {
    write_all(temp("weights_cut.trpw"), std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(cut)));
    expect_load_error(*model, temp("weights_cut.trpw"), "corrupted or truncated");
  }
  auto flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x20;
  write_all(temp("weights_flip.trpw"), flipped);
  expect_load_error(*model, temp("weights_flip.trpw"), "corrupted or truncated");

  auto other = make_mlp("mlp:12-9-3");
  save_weights(*other, temp("weights_other.trpw"));
  expect_load_error(*model, temp("weights_other.trpw"), "the model expects");
  auto deeper = make_mlp("mlp:12-8-3-3");
  save_weights(*deeper, temp("weights_deeper.trpw"));
  expect_load_error(*model, temp("weights_deeper.trpw"), "parameters; the model has");
}

/// A weights file as `version` writes it, with these names for the model's parameters.
void write_file(layer& model, const std::string& path, std::uint32_t version, const std::vector<std::string>& names) {
  byte_writer w;
  w.write_bytes("TRPW", 4);
  w.write_raw(version);
  const auto params = model.parameters();
  w.write_varint(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    codec<std::string>::encode(w, names[i]);
    codec<tensor>::encode(w, params[i]->value);
  }
  w.write_raw(crc32(w.buffer()));
  const auto& bytes = w.buffer();
  write_all(path, std::vector<char>(reinterpret_cast<const char*>(bytes.data()),
                                    reinterpret_cast<const char*>(bytes.data()) + bytes.size()));
}

TEST(Weights, FilesOfVersionOneNamedParametersBareAndStillLoad) {
  auto source = make_mlp("mlp:12-8-3");
  source->initialize(5);
  const auto path = temp("weights_v1.trpw");
  // Before parameters were named by their path, every linear layer's were "weight" and "bias".
  write_file(*source, path, 1, {"weight", "bias", "weight", "bias"});
  auto model = make_mlp("mlp:12-8-3");
  model->initialize(6);
  load_weights(*model, path);
  EXPECT_TRUE(same_weights(*model, *source));
  // From version 2 on, a name is the whole path: bare names are another model's.
  write_file(*source, path, 2, {"weight", "bias", "weight", "bias"});
  expect_load_error(*model, path, "parameter 0 is 'weight' f32[8, 12] on cpu; the model expects '0.weight'");
  write_file(*source, path, 1, {"0.weight", "0.bias", "4.weight", "4.bias"});
  expect_load_error(*model, path, "parameter 2 is '4.weight'");
  write_file(*source, path, 3, {"0.weight", "0.bias", "2.weight", "2.bias"});
  expect_load_error(*model, path, "has format version 3; this build reads versions 1 to 2");
  std::remove(path.c_str());
}

}  // namespace

namespace {

TEST(Weights, NonFiniteValuesAreRefusedOnLoad) {
  // A file that a diverged run could have written: loading it is an error that names the
  // parameter, and the model keeps its weights.
  auto a = troupe::kernels::make_mlp("mlp:12-8-3"), b = troupe::kernels::make_mlp("mlp:12-8-3");
  a->initialize(1);
  b->initialize(2);
  a->parameters()[1]->value.data<float>()[3] = std::nanf("");
  const std::string path = temp("nonfinite.trpw");
  troupe::kernels::save_weights(*a, path);
  auto c = troupe::kernels::make_mlp("mlp:12-8-3");
  c->initialize(2);
  try {
    troupe::kernels::load_weights(*b, path);
    ADD_FAILURE() << "loaded a NaN weight";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(a->parameters()[1]->name), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_weights(*b, *c));
  std::remove(path.c_str());
}

}  // namespace
