// Consumers in containers: `viper watch` run in a pid namespace of its own (as Docker and
// Kubernetes start processes), with and without a mount namespace and /proc of its own, against a
// `viper serve` outside it, all with UCX's default transports (posix shared memory among them,
// whose address differs inside such a namespace). Each gets the version, bit-exact, over the
// network path: a pid from another namespace names no process the node could watch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/process.h"
#include "cli/run_viper.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::Outcome;
using testing::Process;
using testing::RunProgram;

std::string Viper() { return std::string(VIPER_BINARY_DIR) + "/bin/viper"; }

// Starts `viper serve` on loopback; returns its address ("" if it did not come up within 30 s).
std::string StartServe(std::unique_ptr<Process>& serve, const std::filesystem::path& dir) {
  const auto address_file = dir / "serve.address";
  serve = std::make_unique<Process>(std::vector<std::string>{Viper(), "serve", "--listen", "127.0.0.1:0",
                                                             "--segment-prefix", "ctr", "--address-file",
                                                             address_file.string()},
                                    dir / "serve.log");
  std::string address;
  testing::WaitUntil([&] {
    address = testing::ReadFile(address_file);
    while (!address.empty() && (address.back() == '\n' || address.back() == ' ')) address.pop_back();
    return !address.empty() || !serve->running();
  }, 30s);
  return address;
}

TEST(ContainerCli, ConsumersInPidNamespacesOfTheirOwnGetTheVersion) {
  if (::geteuid() != 0) GTEST_SKIP() << "making pid namespaces (unshare --pid) needs root; CI runs as root";
  ASSERT_EQ(::getenv("UCX_TLS"), nullptr) << "the case needs UCX's default transports (posix among them)";
  testing::TempDir dir;
  std::vector<float> w(256 * 1024);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  std::vector<TensorData> tensors = {{{"w", DType::kF32, {static_cast<int64_t>(w.size())}}, std::as_bytes(std::span(w))}};
  auto built = BuildSnapshot(tensors, VersionStamp{.model = "ctr", .step = 1}, {});
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  const std::string file = (dir / "model.safetensors").string();
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(built->bytes().data()), static_cast<std::streamsize>(built->bytes().size()));

  std::unique_ptr<Process> serve;
  const std::string address = StartServe(serve, dir.path());
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

}  // namespace
}  // namespace viper
