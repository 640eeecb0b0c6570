// The optimizer's state files: save and load round trips bit for bit, per-tensor step counts,
// files of older format versions still load, and bad files fail clearly and change nothing.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <troupe/core/file.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/optim.hpp>

#include "optim_support.hpp"

namespace {

using namespace troupe;
using namespace troupe::kernels;
using namespace optim_support;

/// A saved file as format `version` (1 or 2) wrote it: without the per-tensor step counts of
/// version 3, with a fresh checksum.
std::vector<char> as_older_version(const std::vector<char>& file, std::uint8_t version) {
  std::size_t at = 4 + 4 + 1 + 8 + 8;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<std::uint8_t>(file.at(at++));
      v |= std::uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return v;
    }
  };
  auto skip_tensor = [&] {
    const auto type = static_cast<std::uint8_t>(file.at(at++));
    std::uint64_t n = 1;
    for (auto rank = varint(); rank > 0; --rank) n *= varint();
    at += n * (type == static_cast<std::uint8_t>(dtype::u8) ? 1 : type == static_cast<std::uint8_t>(dtype::bf16) ? 2 : 4);
  };
  std::vector<char> out(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(at));
  out[4] = static_cast<char>(version);
  auto copy_from = [&](std::size_t from) { out.insert(out.end(), file.begin() + static_cast<std::ptrdiff_t>(from), file.begin() + static_cast<std::ptrdiff_t>(at)); };
  std::size_t from = at;
  for (auto tensors = varint(); tensors > 0; --tensors) {
    at += varint();  // name
    for (auto rank = varint(); rank > 0; --rank) varint();
    ++at;  // momentum flag
    copy_from(from);
    varint();  // the steps it took: not in older files
    from = at;
    at += 4 * varint();  // gradient norms
    for (int m = 0; m < 3; ++m) {
      const auto mode = static_cast<std::uint8_t>(file.at(at++));
      if (mode == 0) continue;
      at += 1 + 4;  // map, block
      skip_tensor();
      if (mode == 3) skip_tensor();
    }
  }
  at = file.size() - 4;
  copy_from(from);
  const auto crc = crc32(std::as_bytes(std::span(out.data(), out.size())));
  out.resize(out.size() + 4);
  std::memcpy(out.data() + out.size() - 4, &crc, 4);
  return out;
}

TEST(OptimizerState, StateSavedForAResizedTensorLoadsAndSteps) {
  const auto path = (std::filesystem::temp_directory_path() / ("troupe-resized-" + std::to_string(::getpid()))).string();
  model small(5, {100}), big(5, {200});
  optimizer a(optimizer_kind::adamw, {{small.ptrs(), {.lr = 1e-2}}});
  optimizer b(optimizer_kind::adamw, {{big.ptrs(), {.lr = 1e-2}}});
  std::mt19937 g(3);
  small.fresh_grads(g);
  big.fresh_grads(g);
  ASSERT_TRUE(a.step());
  ASSERT_TRUE(b.step());
  b.save(path);
  // The tensor grows to the saved shape; the file's state is for that shape, and steps go on.
  small.params[0] = parameter{small.params[0].name, big.params[0].value.clone(), big.params[0].grad.clone()};
  small.params[0].name = big.params[0].name;
  a.groups()[0].params = {&small.params[0]};
  EXPECT_THROW(a.step(), std::invalid_argument);  // resized under its old state: refused
  a.load(path);
  EXPECT_TRUE(a.step());
  std::filesystem::remove(path);
}

TEST(OptimizerState, SaveAndLoadRoundTripBitForBit) {
  for (const auto& st : storages()) {
    const std::vector<std::int64_t> sizes{10, 33'001, 4099};
    model a(1, sizes), b(1, sizes);
    hyperparameters hp{.lr = 1e-2, .amsgrad = true};
    optimizer oa(optimizer_kind::adamw, {{a.ptrs(), hp, st.state}}, {.seed = 3});
    optimizer ob(optimizer_kind::adamw, {{b.ptrs(), hp, st.state}}, {.seed = 3});
    std::mt19937 g(6);
    for (int s = 0; s < 3; ++s) {
      a.fresh_grads(g);
      oa.step();
    }
    const auto path = temp_path("roundtrip"), again = temp_path("roundtrip_again");
    oa.save(path);
    ob.load(path);
    for (std::size_t i = 0; i < sizes.size(); ++i) copy(a.params[i].value, b.params[i].value);
    ob.save(again);
    EXPECT_EQ(file_bytes(path), file_bytes(again)) << st.name;
    EXPECT_EQ(ob.steps(), 3);
    // The next steps agree to the bit.
    std::mt19937 ga(9), gb(9);
    for (int s = 0; s < 2; ++s) {
      a.fresh_grads(ga);
      b.fresh_grads(gb);
      oa.step();
      ob.step();
    }
    EXPECT_TRUE(a.same_values(b)) << st.name;
    std::filesystem::remove(path);
    std::filesystem::remove(again);
  }
}

// Adam's bias corrections count per tensor, as torch's state["step"]: a parameter added after
// 1,000 steps moves by lr on its first step (the global count would make it 2.5 lr), and its
// step count survives a save and load. zero_grad clears the gradient of a parameter added since
// the last step too.
TEST(OptimizerState, AParameterAddedLaterCountsItsOwnSteps) {
  parameter a{"a", tensor::from<float>({1.0f}, {1}), tensor::zeros({1})};
  parameter b{"b", tensor::from<float>({1.0f}, {1}), tensor::zeros({1})};
  optimizer opt(optimizer_kind::adam, {{{&a}, {.lr = 0.1}}});
  for (int i = 0; i < 1000; ++i) {
    opt.zero_grad();
    a.grad.data<float>()[0] = 0.5f;
    ASSERT_TRUE(opt.step());
  }
  b.grad.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();  // stale, before it joins
  opt.groups()[0].params.push_back(&b);
  opt.zero_grad();
  EXPECT_TRUE(opt.gradients_finite());
  b.grad.data<float>()[0] = 0.5f;
  a.grad.data<float>()[0] = 0.5f;
  ASSERT_TRUE(opt.step());
  EXPECT_NEAR(b.value.data<float>()[0], 0.9f, 1e-6f);  // 1 - lr * m_hat / (sqrt(v_hat) + eps), m_hat = g
  EXPECT_EQ(opt.slots()[0].steps, 1001);
  EXPECT_EQ(opt.slots()[1].steps, 1);
  const auto path = temp_path("per_tensor_steps");
  opt.save(path);
  parameter a2 = a, b2 = b;
  optimizer again(optimizer_kind::adam, {{{&a2, &b2}, {.lr = 0.1}}});
  again.load(path);
  EXPECT_EQ(again.slots()[1].steps, 1);
  // Files of version 2 knew one count for all.
  const auto old = as_older_version(file_bytes(path), 2);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(old.data(), static_cast<std::streamsize>(old.size()));
  }
  again.load(path);
  EXPECT_EQ(again.slots()[1].steps, 1001);
  std::filesystem::remove(path);
}

TEST(OptimizerState, FilesOfVersionOneNamedParametersBareAndStillLoad) {
  // The same model twice, one with the bare names of the files written before parameters were
  // named by their path.
  auto before = make_mlp("mlp:80-60-10"), now = make_mlp("mlp:80-60-10");
  for (auto* p : before->parameters()) p->name = p->name.substr(p->name.find('.') + 1);
  for (auto* m : {before.get(), now.get()})
    for (auto* p : m->parameters()) {
      std::mt19937 same(static_cast<std::uint32_t>(p->value.numel()));
      std::normal_distribution<float> n(0, 1);
      for (float& v : p->grad.data<float>()) v = n(same);
    }
  const state_options int8{.storage = state_storage::int8};
  optimizer old(optimizer_kind::adamw, {{before->parameters(), {}, int8}});
  ASSERT_TRUE(old.step());
  const auto path = temp_path("v1");
  old.save(path);
  auto bytes = file_bytes(path);
  optimizer opt(optimizer_kind::adamw, {{now->parameters(), {}, int8}});
  try {
    opt.load(path);
    ADD_FAILURE() << "version 2 with bare names was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("is 'weight' [60, 80] in the file; the optimizer expects '0.weight'"), std::string::npos)
        << e.what();
  }
  // The same file as version 1 wrote it.
  bytes = as_older_version(bytes, 1);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  opt.load(path);
  EXPECT_EQ(opt.steps(), 1);
  for (std::size_t i = 0; i < now->parameters().size(); ++i)
    copy(before->parameters()[i]->value, now->parameters()[i]->value);
  ASSERT_TRUE(old.step());
  ASSERT_TRUE(opt.step());
  const auto a = before->parameters(), b = now->parameters();
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i]->value.bytes(), b[i]->value.bytes(), a[i]->value.nbytes()), 0) << b[i]->name;
  std::filesystem::remove(path);
}

TEST(OptimizerState, BadFilesFailClearlyAndChangeNothing) {
  model a(1, {5000, 300}), other(1, {5000, 301});
  optimizer oa(optimizer_kind::adam, {{a.ptrs(), {}, {.storage = state_storage::int8}}});
  std::mt19937 g(2);
  a.fresh_grads(g);
  oa.step();
  const auto path = temp_path("bad"), probe = temp_path("probe"), before = temp_path("before");
  oa.save(path);
  const auto good = file_bytes(path);

  model b(1, {5000, 300});
  optimizer ob(optimizer_kind::adam, {{b.ptrs(), {}, {.storage = state_storage::int8}}});
  b.fresh_grads(g);
  ob.step();
  ob.step();
  ob.save(before);
  auto expect_refused = [&](const std::string& file, const char* what) {
    try {
      ob.load(file);
      ADD_FAILURE() << "loaded " << what;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("optimizer state file"), std::string::npos) << e.what();
    }
    ob.save(probe);
    EXPECT_EQ(file_bytes(probe), file_bytes(before)) << what << " changed the optimizer";
    EXPECT_EQ(ob.steps(), 2);
  };
  auto write = [&](const std::vector<char>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  expect_refused(temp_path("missing"), "a missing file");
  write({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)});
  expect_refused(path, "a truncated file");
  auto corrupt = good;
  corrupt[corrupt.size() / 2] ^= 0x10;
  write(corrupt);
  expect_refused(path, "a corrupted file");
  write({'T', 'R', 'P', 'W', 0, 0, 0, 0, 0, 0, 0, 0});
  expect_refused(path, "a weights file");
  // Another model's state.
  optimizer oo(optimizer_kind::adam, {{other.ptrs(), {}, {.storage = state_storage::int8}}});
  oo.save(path);
  expect_refused(path, "another model's state");
  // Another optimizer's state.
  optimizer sgd(optimizer_kind::sgd, {{a.ptrs(), {.momentum = 0.9}}});
  sgd.save(path);
  expect_refused(path, "an SGD state");
  for (const auto& f : {path, probe, before}) std::filesystem::remove(f);
}

}  // namespace
