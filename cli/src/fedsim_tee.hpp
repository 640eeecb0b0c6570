#pragma once
// troupe fedsim's --tee flags and the hidden `troupe tee-enclave` node command.

#include <CLI/CLI.hpp>

#include <string>

namespace troupe::federated {
struct simulation_options;
}

namespace troupe::cli {

/// --tee, --tee-root, --tee-oblivious.
void add_tee_options(CLI::App* cmd, troupe::federated::simulation_options& o);
/// The summary's field: ,"tee":"simulated" under --tee sim, "swtpm" under --tee swtpm, "none" otherwise.
std::string tee_json(const troupe::federated::simulation_options& o);
/// `troupe tee-enclave --head HOST:PORT` (hidden).
void add_tee_enclave_command(CLI::App& app, int& rc);

}  // namespace troupe::cli
