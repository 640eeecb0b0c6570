#pragma once
// What the simulation tests share: the error check and the model as a vector.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "troupe/federated/simulation.hpp"

namespace troupe::federated::test_support {

/// Runs `f`, which must throw E with `words` in its message.
template <class E, class F>
void expect_error(F&& f, const std::string& words) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error about " << words;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

inline std::vector<float> model_of(const simulation& sim) { return {sim.global_model().begin(), sim.global_model().end()}; }

}  // namespace troupe::federated::test_support
