// LoRA fine-tuning in the simulation: the adapters' gradients, the rounds (only the adapters
// travel, the frozen weights stay frozen), --shift, --finetune-from and the refused combinations.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <vector>

#include "engine.hpp"
#include "support.hpp"
#include "troupe/federated/lora.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/weights.hpp"

using namespace troupe;
using namespace troupe::federated;
using namespace troupe::federated::test_support;

namespace {

tensor random_tensor(std::int64_t rows, std::int64_t cols, std::mt19937_64& g) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  tensor t = tensor::empty({rows, cols});
  for (float& v : t.data<float>()) v = n(g);
  return t;
}

/// The mean loss of `net` on (x, y) with its first layer's weight W0 + s B A.
double loss_with(kernels::sequential& net, const std::vector<float>& w0, const tensor& a, const tensor& b, float s,
                 const tensor& x, const tensor& y) {
  auto w = net.parameters()[0]->value.data<float>();
  const std::int64_t out = b.dim(0), in = a.dim(1), r = a.dim(0);
  const auto av = a.data<float>(), bv = b.data<float>();
  for (std::int64_t i = 0; i < out; ++i)
    for (std::int64_t j = 0; j < in; ++j) {
      double v = w0[static_cast<std::size_t>(i * in + j)];
      for (std::int64_t t = 0; t < r; ++t) v += static_cast<double>(s) * bv[i * r + t] * av[t * in + j];
      w[static_cast<std::size_t>(i * in + j)] = static_cast<float>(v);
    }
  kernels::saved_activations keep;
  tensor d;
  return kernels::softmax_cross_entropy(net.forward(x, keep, false), y, d);
}

}  // namespace

TEST(LoraTraining, AdapterGradientsEqualTheReferenceAndFiniteDifferences) {
  auto net = kernels::make_mlp("mlp:7-5-3");
  net->initialize(3);
  std::mt19937_64 g(5);
  const tensor x = random_tensor(4, 7, g);
  const tensor y = tensor::from<std::uint8_t>({0, 2, 1, 2}, {4});
  tensor a = random_tensor(2, 7, g), b = random_tensor(5, 2, g);
  const float s = 0.7f;
  const auto w0v = std::as_const(net->parameters()[0]->value).data<float>();
  const std::vector<float> w0(w0v.begin(), w0v.end());
  // dW from the layers' own backward at W = W0 + s B A.
  (void)loss_with(*net, w0, a, b, s, x, y);
  for (auto* p : net->parameters()) std::fill(p->grad.data<float>().begin(), p->grad.data<float>().end(), 0.0f);
  kernels::saved_activations keep;
  tensor dlogits;
  (void)kernels::softmax_cross_entropy(net->forward(x, keep, true), y, dlogits);
  net->backward(dlogits, keep);
  const tensor dw = net->parameters()[0]->grad.clone();
  tensor da = tensor::zeros({2, 7}), db = tensor::zeros({5, 2}), ra = tensor::zeros({2, 7}), rb = tensor::zeros({5, 2});
  lora::adapter_gradients(dw, a, b, s, da, db);
  lora::adapter_gradients_reference(dw, a, b, s, ra, rb);
  for (std::size_t i = 0; i < 14; ++i) EXPECT_NEAR(da.data<float>()[i], ra.data<float>()[i], 1e-5 + 1e-4 * std::abs(ra.data<float>()[i]));
  for (std::size_t i = 0; i < 10; ++i) EXPECT_NEAR(db.data<float>()[i], rb.data<float>()[i], 1e-5 + 1e-4 * std::abs(rb.data<float>()[i]));
  // Central differences of the loss itself (float forward: h = 1e-2, error O(h^2) + rounding / h).
  const float h = 1e-2f;
  double largest = 0;
  for (tensor* m : {&a, &b}) {
    const tensor& grad = m == &a ? da : db;
    for (std::size_t i = 0; i < static_cast<std::size_t>(m->numel()); ++i) {
      float& v = m->data<float>()[i];
      const float keep_v = v;
      v = keep_v + h;
      const double up = loss_with(*net, w0, a, b, s, x, y);
      v = keep_v - h;
      const double down = loss_with(*net, w0, a, b, s, x, y);
      v = keep_v;
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(grad.data<float>()[i], fd, 2e-3 + 2e-2 * std::abs(fd)) << (m == &a ? "A " : "B ") << i;
      largest = std::max(largest, std::abs(fd));
    }
  }
  EXPECT_GT(largest, 1e-2);  // gradients worth comparing
}

namespace {

constexpr std::size_t base_floats = 784 * 24 + 24 + 24 * 10 + 10;  // small()'s mlp:784-24-10

/// A base model trained for two rounds and saved in a checkpoint directory, once per binary.
const std::string& base_checkpoint() {
  static const std::string dir = [] {
    const std::string d = temp_file("lora_base");
    std::filesystem::remove_all(d);
    auto o = small("fedavg", 2);
    o.rounds = 2;
    o.train_limit = 3000;
    o.checkpoint = d;
    (void)run_simulation(o);
    return d;
  }();
  return dir;
}

simulation_options lora_options(const std::string& ranks, const std::string& agg) {
  auto o = small("fedavg", 2);
  o.rounds = 2;
  o.train_limit = 3000;
  o.finetune_from = base_checkpoint();
  o.shift = "rot90";
  o.lora = ranks;
  o.lora_agg = agg;
  return o;
}

std::vector<float> saved_base() {
  auto o = small("fedavg", 2);
  o.train_limit = 3000;
  simulation sim(o, fashion());
  sim.load_checkpoint(base_checkpoint() + "/fedsim.ckpt");
  return model_of(sim);
}

}  // namespace

TEST(LoraFinetuning, StartsFromTheSavedModelAndUploadsOnlyTheAdapters) {
  const auto base = saved_base();
  ASSERT_EQ(base.size(), base_floats);
  simulation sim(lora_options("4", "fedit"));
  const auto start = model_of(sim);
  ASSERT_GT(start.size(), base_floats);
  EXPECT_TRUE(std::equal(base.begin(), base.end(), start.begin()));
  const round_report r = sim.run_round();
  // Per client: rank 4 times (784 + 24) for the first layer and (24 + 10) for the second, 4 bytes each.
  EXPECT_EQ(r.uplink_bytes, r.participants * 4u * 4u * (784 + 24 + 24 + 10));
  const auto after = model_of(sim);
  // FedIT leaves the frozen weights as they were and moves the adapters.
  EXPECT_TRUE(std::equal(base.begin(), base.end(), after.begin()));
  EXPECT_FALSE(std::equal(start.begin() + base_floats, start.end(), after.begin() + base_floats));
  const auto e = sim.evaluate();
  EXPECT_TRUE(std::isfinite(e.accuracy));
}

TEST(LoraFinetuning, FedExFoldsItsResidualIntoTheFrozenWeights) {
  const auto base = saved_base();
  simulation sim(lora_options("2", "fedex"));
  (void)sim.run_round();
  (void)sim.run_round();  // round 1 starts from B = 0, so its residual is 0 only if nothing trained
  const auto after = model_of(sim);
  EXPECT_FALSE(std::equal(base.begin(), base.end(), after.begin()));
}

TEST(LoraFinetuning, MixedRanksTravelAtEachClientsOwnRank) {
  for (const char* agg : {"flexlora", "hetlora"}) {
    simulation sim(lora_options("2,4,8", agg));
    const auto who = sim.participants(1);
    std::uint64_t want = 0;
    for (auto c : who) want += 4u * (c % 3 == 0 ? 2 : c % 3 == 1 ? 4 : 8) * (784 + 24 + 24 + 10);
    const round_report r = sim.run_round();
    EXPECT_EQ(r.uplink_bytes, want) << agg;
    (void)sim.run_round();
    EXPECT_TRUE(std::isfinite(sim.evaluate().accuracy)) << agg;
  }
}

TEST(LoraFinetuning, FullFineTuningCountsTheWholeModelPerUpdate) {
  auto o = lora_options("4", "fedit");
  o.lora.clear();
  simulation sim(o);
  const round_report r = sim.run_round();
  EXPECT_EQ(r.uplink_bytes, r.participants * 4u * base_floats);
}

TEST(LoraFinetuning, RefusesWhatCannotWorkWithAClearMessage) {
  auto refused = [](simulation_options o, const std::string& words) {
    expect_error<std::invalid_argument>([&] { simulation sim(o); }, words);
  };
  auto o = lora_options("4", "fedit");
  auto no_base = o;
  no_base.finetune_from.clear();
  refused(no_base, "--finetune-from");
  auto mixed = lora_options("2,4", "fedit");
  refused(mixed, "needs one rank");
  auto secagg = o;
  secagg.secagg = true;
  refused(secagg, "--secagg cannot combine with --lora");
  auto scaffold = o;
  scaffold.strategy = "scaffold";
  refused(scaffold, "--strategy scaffold cannot combine with --lora");
  auto compress = o;
  compress.compress = "topk:0.1";
  refused(compress, "--compress cannot combine");
  auto bad_rank = lora_options("0", "fedit");
  refused(bad_rank, "is not a rank");
  auto bad_agg = lora_options("4", "fedavg");
  refused(bad_agg, "unknown --lora-agg");
  auto agg_alone = small("fedavg", 2);
  agg_alone.lora_agg = "fedex";
  refused(agg_alone, "--lora-agg needs --lora");
  auto other_model = o;
  other_model.model = "mlp:784-32-10";
  refused(other_model, "saved with --model mlp:784-24-10; this run has --model mlp:784-32-10");
  auto missing = o;
  missing.finetune_from = temp_file("no_such_dir");
  refused(missing, "no such file or directory");
  auto empty_dir = o;
  empty_dir.finetune_from = ::testing::TempDir();
  refused(empty_dir, "holds no fedsim.ckpt");
  auto bad_shift = o;
  bad_shift.shift = "rot45";
  refused(bad_shift, "unknown --shift 'rot45'");
  auto bad_brightness = o;
  bad_brightness.shift = "brightness:x";
  refused(bad_brightness, "C must be a number");
}

TEST(LoraFinetuning, ATrainWeightsFileIsAcceptedWhenItsShapeMatches) {
  const std::string file = temp_file("lora_weights.trpw");
  auto net = kernels::make_mlp("mlp:784-24-10");
  net->initialize(11);
  kernels::save_weights(*net, file);
  auto o = lora_options("4", "fedit");
  o.finetune_from = file;
  simulation sim(o);
  const auto m = model_of(sim);
  EXPECT_EQ(m[0], std::as_const(net->parameters()[0]->value).data<float>()[0]);
  o.model = "mlp:784-32-10";
  expect_error<std::invalid_argument>([&] { simulation bad(o); }, "--finetune-from " + file);
}

TEST(Shift, Rot90TurnsEachImageAQuarterCounterClockwiseAndFourTurnsAreNone) {
  const shared_data& data = fashion();
  const auto once = detail::shift_data(data, "rot90");
  const auto pix = [](const shared_data& d, bool test, std::int64_t k, int i, int j) {
    const auto& split = test ? d->test : d->train;
    return split.images.data<std::uint8_t>()[static_cast<std::size_t>(k * 784 + i * 28 + j)];
  };
  for (std::int64_t k : {0, 7, 2999})
    for (int i = 0; i < 28; ++i)
      for (int j = 0; j < 28; ++j) ASSERT_EQ(pix(once, false, k, i, j), pix(data, false, k, j, 27 - i));
  EXPECT_EQ(pix(once, true, 5, 3, 20), pix(data, true, 5, 20, 24));  // the test images turn too
  auto four = once;
  for (int t = 0; t < 3; ++t) four = detail::shift_data(four, "rot90");
  EXPECT_TRUE(std::equal(four->train.images.data<std::uint8_t>().begin(), four->train.images.data<std::uint8_t>().end(),
                         data->train.images.data<std::uint8_t>().begin()));
  EXPECT_FALSE(std::equal(once->train.images.data<std::uint8_t>().begin(), once->train.images.data<std::uint8_t>().end(),
                          data->train.images.data<std::uint8_t>().begin()));
}

TEST(Shift, BrightnessMultipliesAndClipsThePixels) {
  const shared_data& data = fashion();
  const auto half = detail::shift_data(data, "brightness:0.5");
  const auto twice = detail::shift_data(data, "brightness:2");
  const auto a = data->train.images.data<std::uint8_t>(), h = half->train.images.data<std::uint8_t>(),
             t = twice->train.images.data<std::uint8_t>();
  bool clipped = false;
  for (std::size_t i = 0; i < 784 * 50; ++i) {
    ASSERT_EQ(h[i], static_cast<std::uint8_t>(std::round(a[i] * 0.5)));
    ASSERT_EQ(t[i], static_cast<std::uint8_t>(std::min(255, 2 * a[i])));
    clipped = clipped || 2 * a[i] > 255;
  }
  EXPECT_TRUE(clipped);
  EXPECT_EQ(half->test.images.data<std::uint8_t>()[400], static_cast<std::uint8_t>(std::round(data->test.images.data<std::uint8_t>()[400] * 0.5)));
}

TEST(Shift, Rot90RefusesImagesThatAreNotSquare) {
  labelled_data odd = *fashion();
  odd.train.images = tensor::zeros({10, 12}, dtype::u8);
  odd.train.labels = odd.train.labels.slice(0, 10).clone();
  expect_error<std::invalid_argument>([&] { (void)detail::shift_data(std::make_shared<const labelled_data>(odd), "rot90"); },
                                      "12 values each, not a square number");
}
