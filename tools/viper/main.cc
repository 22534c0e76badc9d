// viper: the command-line front end. Commands register themselves (see command.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "command.h"
#include "viper/version.h"

namespace viper::cli {

std::vector<CommandInfo>& registry() {
  static std::vector<CommandInfo> commands;
  return commands;
}

int Fail(const std::string& command, const Status& status) {
  std::fprintf(stderr, "viper %s: %s\n", command.c_str(), status.message().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

bool StdoutIsTerminal() { return ::isatty(STDOUT_FILENO) == 1; }

}  // namespace viper::cli

int main(int argc, char** argv) {
  using namespace viper::cli;
  CLI::App app{"Viper: model updates memory to memory, from training to inference"};
  app.name("viper");
  app.set_version_flag("--version", std::string("viper ") + viper::kVersionString);
  app.require_subcommand(1);

  auto& commands = registry();
  std::sort(commands.begin(), commands.end(),
            [](const CommandInfo& a, const CommandInfo& b) { return a.order != b.order ? a.order < b.order : a.name < b.name; });
  std::vector<std::pair<CLI::App*, RunFn>> subcommands;
  for (const auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    subcommands.emplace_back(sub, command.setup(*sub));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, to stderr, non-zero.
    std::fprintf(stderr, "viper: %s (see viper --help)\n", e.what());
    return 2;
  }
  for (auto& [sub, run] : subcommands) {
    if (sub->parsed()) return run();
  }
  return 2;
}
