#pragma once
// The federated tests' data: the first 3,000 Fashion-MNIST training images (and the whole test
// set), loaded once per test binary and shared read-only, as a simulation shares its data.

#include <memory>

#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated::test_data {

inline const shared_data& fashion_subset() {
  static const shared_data data = [] {
    auto all = troupe::load_fashion_mnist();
    all.train.images = all.train.images.slice(0, 3000).clone();
    all.train.labels = all.train.labels.slice(0, 3000).clone();
    return std::make_shared<const troupe::fashion_mnist>(std::move(all));
  }();
  return data;
}

}  // namespace troupe::federated::test_data
