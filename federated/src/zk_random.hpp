#pragma once
/// @file
/// Deterministic randomness for the tests that compare two group backends: while a
/// scoped_test_randomness lives on a thread, every backend's G::random() on that thread draws its
/// 64 bytes from SHA-512(seed ‖ counter) instead of the system's secure generator, so that the
/// same protocol on two backends makes the same proof, byte for byte. A prover under it is not
/// zero knowledge (its blindings follow from the seed): tests only.

#include <array>
#include <cstdint>

namespace troupe::federated::zk {

class scoped_test_randomness {
public:
  explicit scoped_test_randomness(std::uint64_t seed);
  ~scoped_test_randomness();
  scoped_test_randomness(const scoped_test_randomness&) = delete;
  scoped_test_randomness& operator=(const scoped_test_randomness&) = delete;

private:
  std::uint64_t seed_, counter_ = 0;
  scoped_test_randomness* outer_;
  friend bool draw_test_randomness(std::array<std::uint8_t, 64>& out);
};

/// The next 64 bytes of this thread's test stream; false (out untouched) when none is active.
bool draw_test_randomness(std::array<std::uint8_t, 64>& out);

}  // namespace troupe::federated::zk
