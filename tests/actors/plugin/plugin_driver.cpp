// Joins the cluster whose head is at argv[1] (host:port), spawns a plugin_greeter on node 1 and
// prints what it answers; an error is printed and exits 1.
#include <chrono>
#include <cstdio>
#include <exception>

#include "plugin_actor.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s HEAD_HOST:PORT\n", argv[0]);
    return 2;
  }
  try {
    troupe::system_config cfg{.threads = 1};
    cfg.node.listen = "127.0.0.1:0";
    cfg.node.head = argv[1];
    troupe::actor_system sys(cfg);
    auto g = sys.spawn_on<plugin_greeter>(1, std::string("greeter"));
    const auto greeting = g.ask(&plugin_greeter::greet).timeout(std::chrono::seconds(10)).get();
    const auto sum = g.ask(&plugin_greeter::add, 2, 3).timeout(std::chrono::seconds(10)).get();
    std::printf("%s; 2 + 3 = %lld\n", greeting.c_str(), static_cast<long long>(sum));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plugin_driver: %s\n", e.what());
    return 1;
  }
}
