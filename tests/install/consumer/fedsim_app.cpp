// A small federated simulation through the public API, as a user writes it: FedAvg over 20
// client actors on Fashion-MNIST (Debian's dataset-fashion-mnist), 5 clients a round.
// Exits 1 when the model has not learned (test accuracy at or below 0.6).
#include <cstdio>
#include <exception>

#include <troupe/federated/simulation.hpp>

namespace fl = troupe::federated;

int main() {
  try {
    fl::simulation_options o;
    o.clients = 20, o.per_round = 5, o.rounds = 5, o.eval_every = 5;
    o.model = "mlp:784-32-10", o.partition = "iid", o.seed = 3, o.threads = 2;
    o.train_limit = 4000, o.test_limit = 1000;  // a quick run
    const fl::summary s = fl::run_simulation(o, [](const fl::progress& p) {
      std::printf("round %d: train loss %.3f\n", p.round->round, p.round->train_loss);
    });
    std::printf("fedsim_app: %d rounds, test accuracy %.3f\n", s.rounds, s.final_accuracy);
    if (s.rounds != 5 || !(s.final_accuracy > 0.6)) {
      std::printf("fedsim_app: FAILED: expected 5 rounds and a test accuracy above 0.6\n");
      return 1;
    }
    std::printf("fedsim_app: ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fedsim_app: FAILED: %s\n", e.what());
    return 1;
  }
}
