// viper-bench: the benchmark program, `viper bench` and its hidden consumer processes
// (`bench-peer`), apart from the shipped `viper` so that it does not link the benchmark harness.
// `viper bench ...` and `viper bench-peer ...` exec this program beside it with the same
// arguments; run directly, `viper-bench ARGS` is `viper bench ARGS`. It presents itself as
// `viper bench` (usage, messages, the exit codes of viper), and spawns its peers as itself.
#include <cstring>
#include <vector>

#include "command.h"

int main(int argc, char** argv) {
  bool named = argc >= 2 && (std::strcmp(argv[1], "bench") == 0 || std::strcmp(argv[1], "bench-peer") == 0 ||
                             std::strcmp(argv[1], "--version") == 0);
  if (named) return viper::cli::RunCli(argc, argv);
  std::vector<char*> args(argv, argv + argc);
  static char bench[] = "bench";
  args.insert(args.begin() + 1, bench);
  args.push_back(nullptr);
  return viper::cli::RunCli(argc + 1, args.data());
}
