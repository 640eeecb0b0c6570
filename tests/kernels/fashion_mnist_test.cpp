// Loading Fashion-MNIST: a directory of its four files is checked as a whole, the installed set
// has its known sizes and class counts, and training counts the steps its optimizer skipped.

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "data_support.hpp"
#include "troupe/kernels/data.hpp"
#include "troupe/kernels/train.hpp"

namespace {

using namespace data_support;

// A directory of small files shaped like Fashion-MNIST's.
class fake_fashion_mnist {
public:
  fake_fashion_mnist() : dir_("fashion") { fs::create_directories(dir_.path()); }

  void write(const std::string& prefix, std::uint32_t n, std::uint32_t side, bytes labels) {
    write_gzip(path(prefix + "-images-idx3-ubyte.gz"),
               idx_file(0x08, {n, side, side}, random_bytes(std::size_t{n} * side * side, n)));
    write_gzip(path(prefix + "-labels-idx1-ubyte.gz"),
               idx_file(0x08, {static_cast<std::uint32_t>(labels.size())}, labels));
  }
  std::string path(const std::string& name) const { return (fs::path(dir_.path()) / name).string(); }
  const std::string& dir() const { return dir_.path(); }

private:
  temp_file dir_;
};

TEST(FashionMnist, LoadsAConsistentDirectory) {
  fake_fashion_mnist fake;
  fake.write("train", 3, 28, {0, 9, 4});
  fake.write("t10k", 2, 28, {1, 1});
  const troupe::fashion_mnist data = troupe::load_fashion_mnist(fake.dir());
  EXPECT_EQ(data.train.images.shape(), (tensor::shape_type{3, 28, 28}));
  EXPECT_EQ(data.train.size(), 3);
  EXPECT_EQ(data.test.size(), 2);
  EXPECT_EQ(data.train.labels.data<std::uint8_t>()[1], 9);
}

TEST(FashionMnist, RejectsLabelsOutsideZeroToNine) {
  fake_fashion_mnist fake;
  fake.write("train", 3, 28, {0, 10, 4});
  fake.write("t10k", 2, 28, {1, 1});
  const std::string what = error_of<std::runtime_error>([&] { troupe::load_fashion_mnist(fake.dir()); });
  EXPECT_TRUE(contains(what, "train-labels-idx1-ubyte.gz")) << what;
  EXPECT_TRUE(contains(what, "label 10 at index 1 is outside 0..9")) << what;
}

TEST(FashionMnist, RejectsDifferentImageAndLabelCounts) {
  fake_fashion_mnist fake;
  fake.write("train", 3, 28, {0, 1, 2});
  fake.write("t10k", 2, 28, {1, 1, 1});
  const std::string what = error_of<std::runtime_error>([&] { troupe::load_fashion_mnist(fake.dir()); });
  EXPECT_TRUE(contains(what, "holds 3 labels for the 2 images")) << what;
}

TEST(FashionMnist, RejectsImagesThatAreNot28By28) {
  fake_fashion_mnist fake;
  fake.write("train", 3, 27, {0, 1, 2});
  fake.write("t10k", 2, 28, {1, 1});
  const std::string what = error_of<std::runtime_error>([&] { troupe::load_fashion_mnist(fake.dir()); });
  EXPECT_TRUE(contains(what, "not u8 images [N, 28, 28]")) << what;
}

TEST(FashionMnist, MissingDirectorySaysWhatToPass) {
  temp_file absent("absent-dir");
  const std::string what = error_of<std::runtime_error>([&] { troupe::load_fashion_mnist(absent.path()); });
  EXPECT_TRUE(contains(what, absent.path())) << what;
  EXPECT_TRUE(contains(what, "pass the directory that holds train-images-idx3-ubyte.gz")) << what;
}

/// An engine that only counts: every other step is skipped, as an optimizer skips a step whose
/// gradients are not finite.
class skipping_engine final : public troupe::kernels::train_engine {
public:
  troupe::kernels::step_outcome step(const tensor&, const tensor&) override { return {1.0, ++steps_ % 2 == 1}; }
  tensor predict(const tensor& x) override { return tensor::zeros({x.shape()[0], 10}); }
  void sync(troupe::kernels::layer&) override {}

private:
  int steps_ = 0;
};

TEST(Train, CountsTheStepsTheOptimizerSkipped) {
  fake_fashion_mnist fake;
  fake.write("train", 10, 28, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  fake.write("t10k", 2, 28, {1, 1});
  troupe::kernels::train_options o;
  o.data_dir = fake.dir();
  o.model = "mlp:784-8-10";
  o.epochs = 2;
  o.batch = 2;
  const auto result = troupe::kernels::train(o, {}, [](const troupe::kernels::engine_setup&) {
    return std::make_unique<skipping_engine>();
  });
  EXPECT_EQ(result.skipped_steps, 5);  // 10 steps, the even ones skipped
}

class InstalledFashionMnist : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    if (fs::exists(fs::path(troupe::fashion_mnist_dir) / "train-images-idx3-ubyte.gz"))
      data_ = std::make_unique<troupe::fashion_mnist>(troupe::load_fashion_mnist());
  }
  static void TearDownTestSuite() { data_.reset(); }
  void SetUp() override {
    if (!data_)
      GTEST_SKIP() << "Fashion-MNIST is not installed under " << troupe::fashion_mnist_dir
                   << ": install Debian's dataset-fashion-mnist (cmake/install-deps.sh does)";
  }
  static inline std::unique_ptr<troupe::fashion_mnist> data_;
};

TEST_F(InstalledFashionMnist, Has60000And10000ImagesOf28By28) {
  EXPECT_EQ(data_->train.images.shape(), (tensor::shape_type{60000, 28, 28}));
  EXPECT_EQ(data_->train.labels.shape(), (tensor::shape_type{60000}));
  EXPECT_EQ(data_->test.images.shape(), (tensor::shape_type{10000, 28, 28}));
  EXPECT_EQ(data_->test.labels.shape(), (tensor::shape_type{10000}));
}

TEST_F(InstalledFashionMnist, HasEachClassExactly6000TimesInTrainAnd1000InTest) {
  for (const auto& [split, expected] : {std::pair{&data_->train, 6000}, std::pair{&data_->test, 1000}}) {
    std::array<int, 10> counts{};
    for (std::uint8_t label : split->labels.data<std::uint8_t>()) {
      ASSERT_LT(label, 10);
      ++counts[label];
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[static_cast<std::size_t>(c)], expected) << "class " << c;
  }
}

TEST_F(InstalledFashionMnist, NormalizesTrainingPixelsToMeanZeroAndStdOne) {
  const tensor x = troupe::normalize(data_->train.images);
  ASSERT_EQ(x.shape(), (tensor::shape_type{60000, 784}));
  double sum = 0.0, squares = 0.0;
  for (float v : x.data<float>()) {
    sum += v;
    squares += double{v} * v;
  }
  const double n = static_cast<double>(x.numel());
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 2e-3);
  EXPECT_NEAR(std::sqrt(squares / n - mean * mean), 1.0, 2e-3);
}

}  // namespace
