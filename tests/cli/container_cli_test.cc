// Viper in containers, as Docker and Kubernetes start processes:
// - `viper watch` run in a pid namespace of its own, with and without a mount namespace and /proc
//   of its own, against a `viper serve` outside it, all with UCX's default transports (posix
//   shared memory and cma among them, whose addresses differ inside such a namespace). Each gets
//   the version, bit-exact, over the network path: a pid from another namespace names no process
//   the node could watch.
// - `viper serve` with a /dev/shm of Docker's default 64 MiB: a version that does not fit is
//   refused with what to grow.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/process.h"
#include "cli/run_viper.h"
#include "cli/serve_process.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::Outcome;
using testing::Process;
using testing::RunProgram;

std::string Viper() { return std::string(VIPER_BINARY_DIR) + "/bin/viper"; }

// Starts `viper serve` on loopback, run by `shell` (a /bin/sh script whose "$@" is the serve
// command) in a mount namespace of its own when given; returns its address ("" if it did not come
// up within 30 s).
std::string StartServe(std::unique_ptr<Process>& serve, const std::filesystem::path& dir, const std::string& tag,
                       const std::vector<std::string>& extra = {}, const std::string& shell = "") {
  std::vector<std::string> wrapper;
  if (!shell.empty()) wrapper = {"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", shell, "sh"};
  return testing::StartServe(serve, dir, tag, "ctr" + tag, extra, wrapper);
}

// A one-tensor model of `bytes` bytes written to `dir`/`name`.safetensors; returns its path.
std::string WriteModel(const std::filesystem::path& dir, const std::string& name, size_t bytes) {
  std::vector<float> w(bytes / sizeof(float));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  std::vector<TensorData> tensors = {{{"w", DType::kF32, {static_cast<int64_t>(w.size())}}, std::as_bytes(std::span(w))}};
  auto built = BuildSnapshot(tensors, VersionStamp{.model = name, .step = 1}, {});
  EXPECT_TRUE(built.ok()) << built.status().ToString();
  const std::string file = (dir / (name + ".safetensors")).string();
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(built->bytes().data()), static_cast<std::streamsize>(built->bytes().size()));
  return file;
}

TEST(ContainerCli, ConsumersInPidNamespacesOfTheirOwnGetTheVersion) {
  if (::geteuid() != 0) GTEST_SKIP() << "making pid namespaces (unshare --pid) needs root; CI runs as root";
  ASSERT_EQ(::getenv("UCX_TLS"), nullptr) << "the case needs UCX's default transports (posix among them)";
  testing::TempDir dir;
  const std::string file = WriteModel(dir.path(), "ctr", 1 << 20);
  std::unique_ptr<Process> serve;
  const std::string address = StartServe(serve, dir.path(), "pid");
  ASSERT_FALSE(address.empty()) << serve->log();
  Outcome published = testing::RunViper({"publish", "ctr", file, "--connect", address}, dir.path(), 60s);
  ASSERT_EQ(published.exit_code, 0) << published.err;

  struct Consumer {
    const char* name;
    std::vector<std::string> prefix;  // what runs `viper watch`
    const char* path;                 // the path the watch reports
  };
  const std::vector<Consumer> consumers = {
      {"outside (same namespaces as the node)", {}, "map"},
      {"own pid namespace", {"/usr/bin/unshare", "--pid", "--fork"}, "remote"},
      {"own pid and mount namespaces, own /proc", {"/usr/bin/unshare", "--pid", "--fork", "--mount-proc"}, "remote"},
  };
  std::string checksum;
  for (const Consumer& c : consumers) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> argv = c.prefix;
    argv.push_back(Viper());
    for (const char* a : {"watch", "ctr", "--connect", address.c_str(), "--json", "--count", "1", "--timeout", "30"})
      argv.push_back(a);
    const std::string exe = argv.front();
    argv.erase(argv.begin());
    Outcome r = RunProgram(exe, argv, dir.path(), 60s);
    ASSERT_EQ(r.exit_code, 0) << r.err << "\nnode log:\n" << serve->log();
    auto line = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(line.is_discarded()) << r.out;
    EXPECT_EQ(line.value("version", 0), 1) << r.out;
    EXPECT_EQ(line.value("path", ""), c.path) << r.out;
    if (checksum.empty()) checksum = line.value("checksum", "");
    EXPECT_EQ(line.value("checksum", ""), checksum) << r.out;
  }
  EXPECT_FALSE(checksum.empty());
  EXPECT_EQ(serve->log().find("refused connection"), std::string::npos) << serve->log();
}

// A node in a container whose /dev/shm is Docker's default 64 MiB: a 100 MB version does not fit,
// and the publisher is told what to grow (the default budget is half of /dev/shm; an explicit one
// beyond it fails when the segment is reserved). The node keeps serving what fits.
TEST(ContainerCli, ANodeWithASmallDevShmSaysWhatToGrow) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small /dev/shm (unshare --mount) needs root; CI runs as root";
  testing::TempDir dir;
  const std::string big = WriteModel(dir.path(), "big", 100 << 20), small = WriteModel(dir.path(), "small", 1 << 20);
  const std::string small_shm = "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec \"$@\"";
  struct Case {
    const char* name;
    std::vector<std::string> serve_args;
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {"default budget", {}, {"beyond its budget of 32 MiB", "half of /dev/shm's 64 MiB", "--shm-size"}},
      {"budget beyond /dev/shm", {"--host-max-bytes", "1G"},
       {"which holds 64 MiB in all", "--shm-size", "No space left on device"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Process> serve;
    const std::string address = StartServe(serve, dir.path(), c.serve_args.empty() ? "shm" : "shm1g", c.serve_args,
                                           small_shm);
    ASSERT_FALSE(address.empty()) << serve->log();
    Outcome refused = testing::RunViper({"publish", "big", big, "--connect", address}, dir.path(), 60s);
    EXPECT_NE(refused.exit_code, 0) << refused.out;
    for (const char* text : c.says) EXPECT_NE(refused.err.find(text), std::string::npos) << text << "\n" << refused.err;
    Outcome fits = testing::RunViper({"publish", "small", small, "--connect", address}, dir.path(), 60s);
    EXPECT_EQ(fits.exit_code, 0) << fits.err << serve->log();
  }
}

}  // namespace
}  // namespace viper
