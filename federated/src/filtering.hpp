#pragma once
// An aggregator that leaves some of a round's updates out by its own test (a robust filter such
// as AlignIns), and says which: the simulation counts them per round, honest and malicious.

#include <cstdint>
#include <vector>

#include "troupe/federated/update.hpp"

namespace troupe::federated::detail {

class filtering_aggregator : public aggregator {
public:
  /// The clients whose update the last finish() left out, in the order they were added.
  virtual std::vector<std::uint64_t> filtered() const = 0;
};

}  // namespace troupe::federated::detail
