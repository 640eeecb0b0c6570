#pragma once
// Command-line specs of the federated module ("dirichlet:0.5", "fedprox:0.01", "backdoor:0.1:0"):
// one way to split them and read their numbers, with one form of error message.

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::federated::detail {

/// "name:a:b" split at its colons: {"name", "a", "b"}.
inline std::vector<std::string> split_spec(const std::string& spec) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const auto colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon - start));
    if (colon == std::string::npos) return parts;
    start = colon + 1;
  }
}

/// The finite number `text` is; otherwise std::invalid_argument("<context>: '<text>' is not a
/// number"), `context` naming the spec (e.g. "partition 'dirichlet:x'").
inline double spec_number(const std::string& text, const std::string& context) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
    throw std::invalid_argument(context + ": '" + text + "' is not a number");
  return v;
}

}  // namespace troupe::federated::detail
