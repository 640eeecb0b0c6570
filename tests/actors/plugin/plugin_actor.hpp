// A class a node learns from a library it loads (`troupe node start --load`): the library is
// plugin_actor.cpp; plugin_driver.cpp calls it on that node.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>

#include <troupe/actors/remote.hpp>

class plugin_greeter {
public:
  plugin_greeter() = default;
  explicit plugin_greeter(std::string name) : name_(std::move(name)) {}
  std::string greet() const { return name_ + " in process " + std::to_string(::getpid()); }
  std::int64_t add(std::int64_t a, std::int64_t b) const { return a + b; }

private:
  std::string name_ = "anonymous";
};
TROUPE_REMOTE(plugin_greeter, greet, add)
