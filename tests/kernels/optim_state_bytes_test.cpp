// An optimizer's state kept in memory (save_state / load_state / reset_state): what a
// federated client keeps between its rounds while one optimizer serves many clients in turn.

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/optim.hpp>

namespace {

using namespace troupe;
using namespace troupe::kernels;

/// Parameters of the given sizes, seeded normal values.
struct params {
  std::vector<parameter> p;
  params(std::uint32_t seed, const std::vector<std::int64_t>& sizes) {
    std::mt19937 g(seed);
    std::normal_distribution<float> n(0, 1);
    for (auto size : sizes) {
      parameter x{"w" + std::to_string(size), tensor::empty({size}), tensor::empty({size})};
      for (float& v : x.value.data<float>()) v = n(g);
      p.push_back(std::move(x));
    }
  }
  std::vector<parameter*> ptrs() {
    std::vector<parameter*> out;
    for (auto& x : p) out.push_back(&x);
    return out;
  }
  void grads(std::mt19937& g) {
    std::normal_distribution<float> n(0, 1);
    for (auto& x : p)
      for (float& v : x.grad.data<float>()) v = n(g);
  }
  std::vector<float> values() const {
    std::vector<float> out;
    for (const auto& x : p)
      for (float v : x.value.data<float>()) out.push_back(v);
    return out;
  }
  void set(const std::vector<float>& v) {
    std::size_t at = 0;
    for (auto& x : p)
      for (float& y : x.value.data<float>()) y = v[at++];
  }
};

const std::vector<std::int64_t> sizes{12, 5000, 300};

TEST(OptimizerStateBytes, OneOptimizerServesTwoStreamsOfStepsAsTwoOptimizersWould) {
  // Two "clients" each with their own optimizer (the definition), and the same two taking
  // turns on one optimizer whose state is swapped in and out: the same bits.
  for (const auto storage : {state_storage::fp32, state_storage::bf16, state_storage::int8}) {
    state_options so;
    so.storage = storage;
    so.min_8bit_elements = 256;
    const hyperparameters hp{.lr = 1e-2};
    params a(1, sizes), b(2, sizes), shared(0, sizes);
    optimizer oa(optimizer_kind::adamw, {{a.ptrs(), hp, so}}), ob(optimizer_kind::adamw, {{b.ptrs(), hp, so}});
    optimizer one(optimizer_kind::adamw, {{shared.ptrs(), hp, so}});
    std::vector<float> va = a.values(), vb = b.values();
    std::vector<std::byte> sa, sb;  // each client's kept state (empty: none yet)
    std::mt19937 ga(10), gb(20), ga2(10), gb2(20);
    for (int round = 0; round < 3; ++round) {
      for (int client = 0; client < 2; ++client) {
        auto& own = client == 0 ? a : b;
        auto& own_opt = client == 0 ? oa : ob;
        auto& g = client == 0 ? ga : gb;
        auto& g2 = client == 0 ? ga2 : gb2;
        auto& v = client == 0 ? va : vb;
        auto& kept = client == 0 ? sa : sb;
        for (int s = 0; s < 2; ++s) {
          own.grads(g);
          own_opt.step();
        }
        shared.set(v);
        if (kept.empty()) one.reset_state(); else one.load_state(kept);
        for (int s = 0; s < 2; ++s) {
          shared.grads(g2);
          one.step();
        }
        kept = one.save_state();
        v = shared.values();
        EXPECT_EQ(v, own.values()) << name_of(storage) << " round " << round << " client " << client;
        EXPECT_EQ(kept, own_opt.save_state()) << name_of(storage);
        EXPECT_EQ(one.steps(), own_opt.steps());
      }
    }
  }
}

TEST(OptimizerStateBytes, ResetIsAFreshOptimizer) {
  params a(1, sizes), b(1, sizes);
  const hyperparameters hp{.lr = 1e-2};
  optimizer used(optimizer_kind::adam, {{a.ptrs(), hp}}), fresh(optimizer_kind::adam, {{b.ptrs(), hp}});
  std::mt19937 g(3);
  for (int s = 0; s < 3; ++s) {
    a.grads(g);
    used.step();
  }
  used.reset_state();
  EXPECT_EQ(used.steps(), 0);
  EXPECT_EQ(used.save_state(), fresh.save_state());
  b.set(a.values());
  std::mt19937 g1(4), g2(4);
  a.grads(g1);
  b.grads(g2);
  used.step();
  fresh.step();
  EXPECT_EQ(a.values(), b.values());
}

TEST(OptimizerStateBytes, BadBytesFailClearlyAndChangeNothing) {
  params a(1, sizes);
  optimizer opt(optimizer_kind::adam, {{a.ptrs(), {.lr = 1e-2}}});
  std::mt19937 g(5);
  a.grads(g);
  opt.step();
  const auto good = opt.save_state();
  auto expect_refused = [&](std::vector<std::byte> bytes, const std::string& words) {
    try {
      opt.load_state(bytes);
      ADD_FAILURE() << "accepted; expected " << words;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    EXPECT_EQ(opt.save_state(), good);
  };
  expect_refused({}, "truncated");
  expect_refused({good.begin(), good.end() - 3}, "optimizer state");
  auto extra = good;
  extra.push_back(std::byte{0});
  expect_refused(extra, "unexpected bytes");
  params other(1, {12, 5000});
  optimizer sgd(optimizer_kind::sgd, {{other.ptrs(), {.lr = 1e-2, .momentum = 0.9}}});
  expect_refused(sgd.save_state(), "holds the state of SGD");
}

}  // namespace
