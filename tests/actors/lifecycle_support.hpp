#pragma once
// Actor classes the lifecycle, monitor, supervision and timer tests share.

#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>

namespace lifecycle_support {

/// Monitors the actors it is told to watch and keeps the notices it hears.
struct watcher {
  std::vector<troupe::down_notice> notices;
  template <class T>
  void watch(troupe::actor_ref<T> target) {
    troupe::this_actor::monitor(target);
  }
  void on_down(const troupe::down_notice& n) { notices.push_back(n); }
  std::vector<troupe::down_notice> seen() const { return notices; }
};

/// Fails with the message it is given.
struct fragile {
  void crash(std::string why) { throw std::runtime_error(why); }
  int ping() { return 1; }
};

/// Counts ticks.
struct ticker {
  int ticks = 0;
  void tick(int by) { ticks += by; }
  int count() const { return ticks; }
};

}  // namespace lifecycle_support
