// `viper bench` and the hidden `viper bench-peer`: commands of the viper-bench program (the
// benchmark harness is linked there, not here). They exec bin/viper-bench beside this program with
// the same arguments, so its output, messages and exit code are the command's. Built only where
// viper-bench is (UCX and VIPER_BUILD_BENCH; tools/viper/CMakeLists.txt).
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "command.h"

namespace viper::cli {
namespace {

// bin/viper-bench beside this program (/proc/self/exe, so a symlink to viper finds the real one).
std::string BenchProgram() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::filesystem::path self = n > 0 ? std::filesystem::path(std::string(buf, static_cast<size_t>(n))) : "viper";
  return (self.parent_path() / "viper-bench").string();
}

int ExecBench(int argc, char** argv) {
  std::string program = BenchProgram();
  argv[0] = program.data();
  ::execv(program.c_str(), argv);
  int err = errno;
  std::fprintf(stderr,
               "viper %s: cannot run %s: %s (the benchmark program, installed beside viper; builds with "
               "VIPER_BUILD_BENCH=OFF have none)\n",
               argc >= 2 ? argv[1] : "bench", program.c_str(), std::strerror(err));
  return 1;
}

// Listed in `viper --help`; the options are viper-bench's (`viper bench --help`).
RunFn ListOnly(CLI::App&) {
  return [] { return 2; };
}

ViperCommand bench_command("bench", "Benchmark updates against warm memcpy and the file + polling baseline (viper-bench)",
                           ListOnly, 70, ExecBench);
ViperCommand bench_peer_command(
    "bench-peer", "(internal) consumer process of `viper bench`",
    [](CLI::App& app) -> RunFn {
      app.group("");  // hidden from --help
      return [] { return 2; };
    },
    1000, ExecBench);

}  // namespace
}  // namespace viper::cli
