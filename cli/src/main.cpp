// The troupe command: one binary, one subcommand per capability.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <functional>
#include <iostream>
#include <new>

#include "commands.hpp"
#include "fedsim_tee.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: a Ray-style actor framework in C++"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "troupe " TROUPE_VERSION);
  int rc = 0;
  troupe::cli::add_bench_command(app, rc);
  troupe::cli::add_schedule_command(app, rc);
  troupe::cli::add_partition_command(app, rc);
  troupe::cli::add_train_command(app, rc);
  troupe::cli::add_fedsim_command(app, rc);
  troupe::cli::add_node_command(app, rc);
  troupe::cli::add_attest_command(app, rc);
  troupe::cli::add_inspect_command(app, rc);
  troupe::cli::add_generate_command(app, rc);
  troupe::cli::add_zkbench_command(app, rc);
  troupe::cli::add_tee_enclave_command(app, rc);
  // CLI11 reads "-1" into an unsigned option as 2^64 - 1: every unsigned option refuses a sign.
  // And a value beyond 2^64 - 1 is clamped to it by the conversion: refuse it instead.
  const CLI::Validator no_sign(
      [](std::string& text) {
        if (text.find('-') == 0) return std::string("must not be negative");
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec == std::errc::result_out_of_range) return "is larger than " + std::to_string(UINT64_MAX);
        return std::string();
      },
      "", "NONNEGATIVE");
  // An empty text value is a mistake (an unset shell variable: `--tls-cert "$CERT"`), never a
  // way to say "none": every text option refuses it instead of quietly running without it.
  const CLI::Validator not_empty(
      [](std::string& text) { return text.empty() ? std::string("must not be empty") : std::string(); }, "",
      "NONEMPTY");
  std::function<void(CLI::App*)> check_all = [&](CLI::App* a) {
    for (CLI::Option* o : a->get_options()) {
      if (o->get_type_name() == "UINT") o->check(no_sign);
      if (o->get_type_name().rfind("TEXT", 0) == 0) o->check(not_empty);
    }
    for (CLI::App* sub : a->get_subcommands(std::function<bool(CLI::App*)>{})) check_all(sub);
  };
  check_all(&app);
  // A first word that is no command: say so (CLI11 would only say that a command is required).
  if (argc > 1 && argv[1][0] != '-') {
    const auto subs = app.get_subcommands(std::function<bool(CLI::App*)>{});
    if (std::none_of(subs.begin(), subs.end(), [&](CLI::App* s) { return s->get_name() == argv[1]; })) {
      std::string names;
      for (CLI::App* s : subs) names += (names.empty() ? "" : ", ") + s->get_name();
      std::cerr << "troupe: '" << argv[1] << "' is not a command (the commands: " << names << "; see troupe --help)\n";
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::bad_alloc&) {
    // Whatever a command did not catch itself: a clear message and a failing status, never
    // std::terminate.
    std::cerr << "troupe: out of memory (the sizes asked for do not fit in this machine's memory)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 1;
  }
  return rc;
}
