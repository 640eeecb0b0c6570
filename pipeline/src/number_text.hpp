#pragma once
// Numbers in messages and JSON of the pipeline module.

#include <charconv>
#include <string>

namespace troupe::pipeline {

/// The shortest text that reads back as the same double (17 digits where needed, "6" for 6.0).
inline std::string format_number(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

}  // namespace troupe::pipeline
