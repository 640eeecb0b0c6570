// The simulated enclave's node for the --tee tests: what `troupe tee-enclave --head HOST:PORT`
// runs, in a program the federated tests can start without the troupe command.
//
//   tee_enclave_node tee-enclave --head HOST:PORT

#include <cstdio>
#include <string>

#include <troupe/federated/tee.hpp>

int main(int argc, char** argv) {
  if (argc != 4 || std::string(argv[1]) != "tee-enclave" || std::string(argv[2]) != "--head") {
    std::fprintf(stderr, "usage: tee_enclave_node tee-enclave --head HOST:PORT\n");
    return 2;
  }
  return troupe::federated::tee::run_enclave_node(argv[3]);
}
