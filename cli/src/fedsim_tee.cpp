// troupe fedsim's --tee flags, and `troupe tee-enclave`: the node process that hosts the
// simulated enclave (started by fedsim itself, never by hand).

#include "fedsim_tee.hpp"

#include "commands.hpp"

#include <troupe/federated/simulation.hpp>
#include <troupe/federated/tee.hpp>

namespace troupe::cli {

void add_tee_options(CLI::App* cmd, troupe::federated::simulation_options& o) {
  auto* tee = cmd->add_option("--tee", o.tee,
                              "sim: the aggregator runs as a simulated enclave in its own process; each client verifies its "
                              "quote (DCAP format, a test key chain) and seals its update to the enclave; swtpm: the same with a "
                              "software TPM's quote of the measured enclave program (both need --tee-root test)")
                  ->check(CLI::IsMember({"sim", "swtpm"}));
  cmd->add_option("--tee-root", o.tee_root, "with --tee: the quotes' root the clients accept: test (the simulated platform's)")
      ->check(CLI::IsMember({"test"}))
      ->needs(tee);
  cmd->add_flag("--tee-oblivious", o.tee_oblivious,
                "with --tee and --compress topk:F: the enclave adds sparse updates touching every coordinate (no access "
                "pattern that depends on the positions)")
      ->needs(tee);
}

std::string tee_json(const troupe::federated::simulation_options& o) {
  return std::string(",\"tee\":\"") + (o.tee == "sim" ? "simulated" : o.tee == "swtpm" ? "swtpm" : "none") + "\"";
}

void add_tee_enclave_command(CLI::App& app, int& rc) {
  auto head = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("tee-enclave", "the enclave's node (started by troupe fedsim --tee)");
  cmd->group("");  // not listed: fedsim starts it
  cmd->add_option("--head", *head, "HOST:PORT of the fedsim process to join")->required();
  cmd->callback([head, &rc] {
    quiet_info_logs();
    rc = troupe::federated::tee::run_enclave_node(*head);
  });
}

}  // namespace troupe::cli
