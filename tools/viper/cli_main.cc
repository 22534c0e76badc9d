// The command-line front end of `viper` and `viper-bench`. Commands register themselves (see
// command.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli_checks.h"
#include "command.h"
#include "viper/log.h"
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

int RunCli(int argc, char** argv) {
  CLI::App app{"Viper: model updates memory to memory, from training to inference"};
  app.name("viper");
  app.set_version_flag("--version", std::string("viper ") + viper::kVersionString);
  app.require_subcommand(1);

  auto& commands = registry();
  std::sort(commands.begin(), commands.end(),
            [](const CommandInfo& a, const CommandInfo& b) { return a.order != b.order ? a.order < b.order : a.name < b.name; });
  // A command of another program gets the arguments as they are (its own --help included).
  for (const auto& command : commands)
    if (command.forward && argc >= 2 && command.name == argv[1]) return command.forward(argc, argv);
  // Every command's --help ends with the exit codes; main() and Fail() are the only places that
  // choose them (a command's run function returns 0, or Fail()'s 1 or 2).
  const std::string exit_codes =
      "Exit codes:\n"
      "  0  success (for serve: stopped by SIGINT or SIGTERM)\n"
      "  1  failure: the reason on stderr, one line (unreachable node, missing version, checksum\n"
      "     mismatch, timeout, I/O error)\n"
      "  2  bad arguments: one line on stderr naming the argument, its value and the rule\n";
  app.footer(exit_codes);
  std::vector<std::pair<CLI::App*, RunFn>> subcommands;
  // --log-level on every command (and every command's own subcommands), here rather than in each
  // command: it wins over VIPER_LOG.
  std::string log_level;
  auto add_log_level = [&log_level](auto& self, CLI::App* sub) -> void {
    sub->add_option("--log-level", log_level, "Log level: error, warn, info or debug (default: VIPER_LOG, else warn)")
        ->check(OneOf({"error", "warn", "info", "debug"}));
    for (CLI::App* nested : sub->get_subcommands({})) self(self, nested);
  };
  for (const auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    sub->footer(exit_codes);
    subcommands.emplace_back(sub, command.setup(*sub));
    add_log_level(add_log_level, sub);
    for (CLI::App* nested : sub->get_subcommands([](CLI::App*) { return true; })) nested->footer(exit_codes);
  }

  // A first word that is not an option must name a command (CLI11 would say only "A subcommand is
  // required").
  std::string names;
  for (const auto& command : commands)
    if (!command.description.starts_with("(internal)")) names += (names.empty() ? "" : ", ") + command.name;
  if (argc < 2) {
    std::fprintf(stderr, "viper: a command is required: one of %s (see viper --help)\n", names.c_str());
    return 2;
  }
  auto known = [&](const std::string& word) {
    return std::any_of(commands.begin(), commands.end(), [&](const CommandInfo& c) { return c.name == word; });
  };
  if (argv[1][0] != '-' && !known(argv[1])) {
    std::fprintf(stderr, "viper: %s is not a command: one of %s (see viper --help)\n", Shown(argv[1]).c_str(),
                 names.c_str());
    return 2;
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
    // One line, to stderr, exit code 2, naming the command that refused it.
    std::string who = "viper";
    for (auto& [sub, run] : subcommands)
      if (sub->parsed()) who += " " + sub->get_name();
    std::fprintf(stderr, "%s: %s (see %s --help)\n", who.c_str(), e.what(), who.c_str());
    return 2;
  } catch (const std::exception& e) {  // a conversion that threw past CLI11: still one line, exit 2
    std::fprintf(stderr, "viper: cannot read the arguments: %s (see viper --help)\n", e.what());
    return 2;
  }
  if (!log_level.empty()) {
    viper::set_log_level(log_level == "error"  ? viper::LogLevel::kError
                         : log_level == "info" ? viper::LogLevel::kInfo
                         : log_level == "debug" ? viper::LogLevel::kDebug
                                                : viper::LogLevel::kWarn);
  } else {
    (void)viper::log_level();  // reads VIPER_LOG now: a value it does not know is reported at once
  }
  for (auto& [sub, run] : subcommands) {
    if (sub->parsed()) return run();
  }
  return 2;
}

}  // namespace viper::cli
