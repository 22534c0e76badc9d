// The `viper` CLI's command registry. Each command lives in its own cmd_*.cc and registers itself
// with a static ViperCommand object; main.cc knows none of them by name.
//
// A command's setup adds its options to the CLI11 subcommand and returns the function to run if
// that subcommand is chosen. The run function returns the process exit code; on failure it prints
// one line "viper <command>: <reason>" to stderr (use Fail()).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "viper/status.h"

namespace viper::cli {

using RunFn = std::function<int()>;
using SetupFn = std::function<RunFn(CLI::App& subcommand)>;
// A command that another program runs: given the whole argv (argv[1] is the command's name), it
// hands them over (exec) before this program parses anything, and returns an exit code only if
// it could not.
using ForwardFn = std::function<int(int argc, char** argv)>;

struct CommandInfo {
  std::string name;
  std::string description;
  SetupFn setup;
  int order = 100;    // position in --help
  ForwardFn forward;  // set: the command is another program's (setup only lists it in --help)
};

std::vector<CommandInfo>& registry();

struct ViperCommand {
  ViperCommand(std::string name, std::string description, SetupFn setup, int order = 100, ForwardFn forward = {}) {
    registry().push_back({std::move(name), std::move(description), std::move(setup), order, std::move(forward)});
  }
};

// The CLI (`viper` in usage and messages): parses argv against the registered commands and runs
// the one chosen; main() of `viper` and of `viper-bench` (tools/viper-bench/).
int RunCli(int argc, char** argv);

// Prints "viper <command>: <status message>" to stderr and returns the exit code for it
// (2 for invalid arguments, 1 otherwise).
int Fail(const std::string& command, const Status& status);

// True if stdout is a terminal (progress bars, colours).
bool StdoutIsTerminal();

}  // namespace viper::cli
