#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <troupe/federated/neural_cleanse.hpp>
#include <troupe/federated/robust.hpp>
#include <troupe/kernels/classifier.hpp>
#include <troupe/kernels/data.hpp>
#include <troupe/kernels/optim.hpp>
#include <troupe/kernels/weights.hpp>

#include "fashion_subset.hpp"

namespace {

using namespace troupe;
using namespace troupe::federated;

TEST(NeuralCleanse, AnomalyIndexIsTheDistanceToTheMedianOverTheScaledMad) {
  // Sorted: 2 10 10 11 11 12 12 13 13 14 -> median 11.5; deviations sorted 0.5 x4, 1.5 x4, 2.5,
  // 9.5 -> median 1.5, MAD 1.4826 * 1.5 = 2.2239.
  const std::vector<double> norms{10, 12, 11, 13, 2, 12, 14, 11, 10, 13};
  const auto r = mad_anomaly_index(norms);
  EXPECT_DOUBLE_EQ(r.median, 11.5);
  EXPECT_DOUBLE_EQ(r.mad, 1.4826 * 1.5);
  EXPECT_NEAR(r.index[4], 9.5 / 2.2239, 1e-12);
  EXPECT_NEAR(r.index[6], 2.5 / 2.2239, 1e-12);
  EXPECT_NEAR(r.index[0], 1.5 / 2.2239, 1e-12);
  EXPECT_EQ(r.flagged, std::vector<int>{4});
}

TEST(NeuralCleanse, FlagsOnlyTheSmallSideAndUsesTheMiddleValueOfAnOddCount) {
  // Median 5; deviations 4 0 1 1 25 -> median 1, MAD 1.4826. 30 is far above: not flagged;
  // 1 is 2.698 MADs below: flagged.
  const std::vector<double> norms{1, 5, 4, 6, 30};
  const auto r = mad_anomaly_index(norms);
  EXPECT_DOUBLE_EQ(r.median, 5);
  EXPECT_DOUBLE_EQ(r.mad, 1.4826);
  EXPECT_NEAR(r.index[4], 25 / 1.4826, 1e-12);
  EXPECT_EQ(r.flagged, std::vector<int>{0});
  // A stricter threshold flags nothing.
  EXPECT_TRUE(mad_anomaly_index(norms, 3).flagged.empty());
  EXPECT_THROW(mad_anomaly_index(std::vector<double>{1}), std::invalid_argument);
  EXPECT_THROW(mad_anomaly_index(std::vector<double>{1, NAN}), std::invalid_argument);
}

TEST(NeuralCleanse, TheObjectivesGradientMatchesFiniteDifferences) {
  auto model = kernels::make_mlp("mlp:16-8-3");
  model->initialize(3);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(0, 1);
  std::normal_distribution<float> normal(0, 1);
  const int rows = 4, d = 16;
  std::vector<float> x(rows * d), mu(d), pi(d), gmu(d), gpi(d), scratch_mu(d), scratch_pi(d);
  for (float& v : x) v = unit(rng);
  for (float& v : mu) v = normal(rng);
  for (float& v : pi) v = normal(rng);
  const double cost = 0.05;
  trigger_objective(*model, x, rows, 0.3f, 0.4f, 1, mu, pi, cost, gmu, gpi);
  auto loss = [&](const std::vector<float>& m, const std::vector<float>& p) {
    return trigger_objective(*model, x, rows, 0.3f, 0.4f, 1, m, p, cost, scratch_mu, scratch_pi);
  };
  const float h = 1e-2f;
  for (int j = 0; j < d; ++j) {
    auto up = mu, down = mu;
    up[j] += h;
    down[j] -= h;
    const double fd_mu = (loss(up, pi) - loss(down, pi)) / (2 * h);
    EXPECT_NEAR(gmu[j], fd_mu, 2e-3 + 2e-2 * std::abs(fd_mu)) << "mask " << j;
    auto pu = pi, pd = pi;
    pu[j] += h;
    pd[j] -= h;
    const double fd_pi = (loss(mu, pu) - loss(mu, pd)) / (2 * h);
    EXPECT_NEAR(gpi[j], fd_pi, 2e-3 + 2e-2 * std::abs(fd_pi)) << "pattern " << j;
  }
}

/// The test subset's 3,000 training images, and with `poisoned` 10% more: copies stamped with the
/// backdoor's trigger and labelled 0; an MLP 784-100-10 trained on them by SGD.
std::unique_ptr<kernels::sequential> train_model(bool poisoned, int epochs = 6) {
  const auto& data = *test_data::fashion_subset();
  const std::int64_t n = data.train.size(), extra = poisoned ? n / 10 : 0;
  std::vector<std::uint8_t> images(static_cast<std::size_t>((n + extra) * 784)), labels(static_cast<std::size_t>(n + extra));
  const auto src = data.train.images.data<std::uint8_t>();
  const auto src_labels = data.train.labels.data<std::uint8_t>();
  std::memcpy(images.data(), src.data(), static_cast<std::size_t>(n * 784));
  std::memcpy(labels.data(), src_labels.data(), static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < extra; ++i) {
    auto image = std::span(images).subspan(static_cast<std::size_t>((n + i) * 784), 784);
    std::memcpy(image.data(), src.data() + i * 784, 784);
    stamp_backdoor(image);
    labels[static_cast<std::size_t>(n + i)] = 0;
  }
  const tensor x = normalize(tensor::from<std::uint8_t>(images, {n + extra, 28, 28}));
  auto model = kernels::make_mlp("mlp:784-100-10");
  model->initialize(11);
  kernels::hyperparameters hp;
  hp.lr = 0.05;
  kernels::optimizer opt(kernels::optimizer_kind::sgd, {kernels::param_group{model->parameters(), hp}});
  kernels::classifier c(*model, opt, 784);
  std::mt19937 rng(5);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n + extra));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  const int batch = 32;
  std::vector<float> xb(batch * 784);
  std::vector<std::uint8_t> yb(batch);
  const auto xs = x.data<float>();
  for (int e = 0; e < epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t at = 0; at + batch <= order.size(); at += batch) {
      for (int b = 0; b < batch; ++b) {
        const auto row = static_cast<std::size_t>(order[at + static_cast<std::size_t>(b)]);
        std::memcpy(xb.data() + b * 784, xs.data() + row * 784, 784 * sizeof(float));
        yb[static_cast<std::size_t>(b)] = labels[row];
      }
      c.step(xb.data(), yb.data(), batch);
    }
  }
  return model;
}

/// The share of test images of other classes that the model puts in class 0 once stamped.
double backdoor_success(kernels::sequential& model) {
  const auto& data = *test_data::fashion_subset();
  std::vector<std::uint8_t> stamped;
  std::int64_t rows = 0;
  const auto images = data.test.images.data<std::uint8_t>();
  const auto labels = data.test.labels.data<std::uint8_t>();
  for (std::int64_t i = 0; i < 1000; ++i) {
    if (labels[static_cast<std::size_t>(i)] == 0) continue;
    stamped.insert(stamped.end(), images.begin() + i * 784, images.begin() + (i + 1) * 784);
    stamp_backdoor(std::span(stamped).subspan(static_cast<std::size_t>(rows * 784), 784));
    ++rows;
  }
  const tensor x = normalize(tensor::from<std::uint8_t>(stamped, {rows, 28, 28}));
  tensor target = tensor::zeros({rows}, dtype::u8);
  kernels::saved_activations keep;
  return static_cast<double>(kernels::count_correct(model.forward(x, keep, false), target)) / static_cast<double>(rows);
}

neural_cleanse_options quick_options() {
  neural_cleanse_options o;
  o.images = 256;
  o.epochs = 60;
  o.patience = 3;
  o.early_stop_patience = 10;
  return o;
}

TEST(NeuralCleanse, FlagsTheTargetOfAPlantedTriggerWithASmallerMaskThanTwiceTheTrigger) {
  auto model = train_model(true);
  ASSERT_GT(backdoor_success(*model), 0.9) << "the planted trigger did not take";
  const auto r = neural_cleanse(*model, *test_data::fashion_subset(), quick_options());
  ASSERT_EQ(r.triggers.size(), 10u);
  for (const auto& t : r.triggers) EXPECT_TRUE(t.reached) << "label " << t.label;
  EXPECT_EQ(r.anomaly.flagged, std::vector<int>{0});
  EXPECT_LE(r.triggers[0].l1, 2 * 16.0);  // the trigger is a 4 x 4 square
  // The mask sits where the trigger is: most of its weight in the bottom-right 8 x 8 corner.
  double corner = 0;
  for (int row = 20; row < 28; ++row)
    for (int col = 20; col < 28; ++col) corner += r.triggers[0].mask[static_cast<std::size_t>(row * 28 + col)];
  EXPECT_GT(corner, 0.5 * r.triggers[0].l1);
}

TEST(NeuralCleanse, FlagsNothingOnACleanModel) {
  auto model = train_model(false);
  EXPECT_LT(backdoor_success(*model), 0.5);
  const auto r = neural_cleanse(*model, *test_data::fashion_subset(), quick_options());
  EXPECT_TRUE(r.anomaly.flagged.empty()) << "flagged label " << r.anomaly.flagged.front() << " with index "
                                         << r.anomaly.index[static_cast<std::size_t>(r.anomaly.flagged.front())];
}

TEST(NeuralCleanse, WithoutEarlyStoppingEveryLabelRunsItsEpochsAndKeepsTheSmallestSuccessfulMask) {
  auto model = train_model(false, 2);
  const auto& data = *test_data::fashion_subset();
  auto o = quick_options();
  o.images = 64;
  o.epochs = 80;
  o.early_stop_patience = 0;
  const auto stopped_never = reverse_engineer_trigger(*model, data.test.images.slice(0, 64), data.mean, data.stddev, 3, o);
  EXPECT_EQ(stopped_never.epochs, 80);
  o.early_stop_patience = 1;
  const auto stopped_early = reverse_engineer_trigger(*model, data.test.images.slice(0, 64), data.mean, data.stddev, 3, o);
  EXPECT_LT(stopped_early.epochs, 80) << "the early stop never fired: the comparison shows nothing";
  // The same seed runs the same epochs up to the early stop; running on can only find a smaller mask.
  ASSERT_TRUE(stopped_early.reached);
  EXPECT_LE(stopped_never.l1, stopped_early.l1);
  o.early_stop_patience = -1;
  EXPECT_THROW(reverse_engineer_trigger(*model, data.test.images.slice(0, 64), data.mean, data.stddev, 3, o),
               std::invalid_argument);
}

TEST(NeuralCleanse, LoadsATrainedWeightsFileAndRefusesWhatDoesNotFit) {
  auto model = kernels::make_mlp("mlp:784-16-10");
  model->initialize(1);
  const auto path = (std::filesystem::temp_directory_path() / "neural_cleanse_test.trpw").string();
  kernels::save_weights(*model, path);
  auto loaded = load_saved_model(path, "mlp:784-16-10");
  const auto a = model->parameters(), b = loaded->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i]->value.data<float>(), y = b[i]->value.data<float>();
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
  }
  EXPECT_THROW(load_saved_model(path, "mlp:784-32-10"), std::invalid_argument);
  EXPECT_THROW(load_saved_model(path, ""), std::invalid_argument);
  EXPECT_THROW(load_saved_model("/nonexistent/model", "mlp:784-16-10"), std::invalid_argument);
  std::filesystem::remove(path);
  // f32 features have no pixel space to stamp a trigger in.
  tensor features = tensor::zeros({4, 784});
  EXPECT_THROW(reverse_engineer_trigger(*model, features, 0, 1, 0), std::invalid_argument);
  tensor images = tensor::zeros({4, 28, 28}, dtype::u8);
  EXPECT_THROW(reverse_engineer_trigger(*model, images, 0, 1, 10), std::invalid_argument);
}

}  // namespace
