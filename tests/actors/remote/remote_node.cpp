// A worker node for the remote tests: joins the head, optionally names a kv store, and runs
// until its standard input closes (the test ends) or it is killed.
//
//   remote_test_node --head HOST:PORT --token T [--listen HOST:PORT] [--name NAME] [--label L]...
//                    [--tls-cert PEM --tls-key PEM --tls-ca PEM] [--pester NAME]
//
// --pester NAME: tells the kv store named NAME a put every millisecond, numbered from 0.
//
// Prints {"node":N,"port":P} once it has joined.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "remote_types.hpp"

int main(int argc, char** argv) {
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = "127.0.0.1:0";
  std::string name, pester;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--head") cfg.node.head = value;
    else if (flag == "--token") cfg.node.token = value;
    else if (flag == "--listen") cfg.node.listen = value;
    else if (flag == "--name") name = value;
    else if (flag == "--label") cfg.node.labels.push_back(value);
    else if (flag == "--pester") pester = value;
    else if (flag == "--tls-cert") cfg.node.tls_certificate = value;
    else if (flag == "--tls-key") cfg.node.tls_private_key = value;
    else if (flag == "--tls-ca") cfg.node.tls_ca = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    troupe::actor_system sys(cfg);
    if (!name.empty()) sys.register_name(name, sys.spawn<remote_test::kv>());
    std::printf("{\"node\":%u,\"port\":%u}\n", sys.node(), sys.node_port());
    std::fflush(stdout);
    std::atomic<bool> done{false};
    std::thread pestering;
    if (!pester.empty()) {
      auto target = sys.lookup<remote_test::kv>(pester);
      if (!target) throw std::runtime_error("no kv store named " + pester);
      pestering = std::thread([&done, target = *target] {
        for (std::uint64_t i = 0; !done.load(); ++i) {
          target.tell(&remote_test::kv::put, std::to_string(i), std::string("x"));
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
    }
    char buf[64];
    while (std::fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    done.store(true);
    if (pestering.joinable()) pestering.join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remote_test_node: %s\n", e.what());
    return 1;
  }
  return 0;
}
