// Secure by default: a node does not listen beyond loopback without a token unless told to, and
// its segments and files stay owner-only, so a consumer running as another user gets a clear
// error (or a path that does not need them), never a crash. The other user is real: the consumer
// process runs as `nobody` (setpriv), which needs root (CI runs as root).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "api/process.h"
#include "viper/node.h"

namespace viper::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string Bin(const char* name) { return std::string(VIPER_BINARY_DIR) + "/bin/" + name; }

TEST(Secure, NodeRefusesToListenBeyondLoopbackWithoutAToken) {
  NodeOptions options;
  options.listen = "0.0.0.0:0";  // every interface
  auto refused = Node::Start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("without a token"), std::string::npos) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("--insecure"), std::string::npos) << refused.status().ToString();
  options.token = "s3cret";
  auto with_token = Node::Start(options);
  EXPECT_TRUE(with_token.ok()) << with_token.status().ToString();
  options.token.clear();
  options.insecure = true;
  auto insecure = Node::Start(options);
  EXPECT_TRUE(insecure.ok()) << insecure.status().ToString();
  options.insecure = false;
  for (const char* loopback : {"127.0.0.1:0", "localhost:0", "127.3.2.1:0"}) {
    options.listen = loopback;
    auto local = Node::Start(options);
    EXPECT_TRUE(local.ok()) << loopback << ": " << local.status().ToString();
  }
}

TEST(Secure, ServeSaysWhyItRefusesAndHowToProceed) {
  TempDir dir;
  Process serve({Bin("viper"), "serve", "--listen", "0.0.0.0:0"}, dir / "serve.log");
  EXPECT_EQ(serve.Wait(30s), 1);
  std::string log = serve.log();
  EXPECT_NE(log.find("refusing to listen on 0.0.0.0:0 without a token"), std::string::npos) << log;
  std::printf("viper serve --listen 0.0.0.0:0 says: %s", log.c_str());
  Process insecure({Bin("viper"), "serve", "--listen", "0.0.0.0:0", "--insecure", "--address-file",
                    (dir / "addr").string()},
                   dir / "insecure.log");
  EXPECT_FALSE(WaitForFile(dir / "addr", 30s).empty()) << insecure.log();
}

// A producer (root) with owner-only segments and files; consumers running as nobody.
class OtherUser : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::geteuid(), 0u) << "running a consumer as another user needs root (CI runs as root)";
    ASSERT_EQ(::access("/usr/bin/setpriv", X_OK), 0) << "setpriv (util-linux) is needed";
    ::chmod(dir_.path().c_str(), 0755);  // nobody reaches its own directory below, not the store
    fs::create_directories(dir_ / "nobody");
    ::chmod((dir_ / "nobody").c_str(), 0777);
    producer_ = std::make_unique<Process>(
        std::vector<std::string>{Bin("viper_fault_peer"), "produce", "--model", "fm", "--listen", "127.0.0.1:0",
                                 "--store-dir", (dir_ / "store").string(), "--segment-prefix",
                                 "vsecure" + std::to_string(::getpid()), "--versions", "3", "--address-file",
                                 (dir_ / "addr").string(), "--state-file", (dir_ / "state").string()},
        dir_ / "producer.log");
    address_ = WaitForFile(dir_ / "addr", 30s);
    ASSERT_FALSE(address_.empty()) << producer_->log();
    ASSERT_EQ(WaitForFile(dir_ / "state", 60s), "published 3") << producer_->log();
  }
  void TearDown() override {
    if (producer_) ::kill(producer_->pid(), SIGTERM), producer_->Wait(30s);
  }
  // A consumer as nobody reading with `path`; returns its exit code (its log in `log`).
  int ConsumeAsNobody(const std::string& path, std::string* log) {
    fs::path out = dir_ / "nobody";
    Process consumer({"/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                      Bin("viper_fault_peer"), "consume", "--model", "fm", "--connect", address_, "--path", path,
                      "--file-dir", (dir_ / "store").string(), "--threads", "1", "--until", "3", "--min-reads", "1",
                      "--timeout-s", "5", "--status", (out / (path + ".status")).string()},
                     out / (path + ".log"));
    int code = consumer.Wait(60s);
    *log = consumer.log();
    return code;
  }

  TempDir dir_;
  std::unique_ptr<Process> producer_;
  std::string address_;
};

TEST_F(OtherUser, SegmentsAndFilesAreOwnerOnly) {
  size_t segments = 0;
  for (const auto& entry : fs::directory_iterator("/dev/shm")) {
    if (!entry.path().filename().string().starts_with("vsecure" + std::to_string(::getpid()))) continue;
    EXPECT_EQ(entry.status().permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write)
        << entry.path();
    ++segments;
  }
  EXPECT_GT(segments, 0u);
  size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir_ / "store")) {
    auto perms = entry.status().permissions() & fs::perms::all;
    if (entry.is_directory()) {
      EXPECT_EQ(perms, fs::perms::owner_all) << entry.path();
    }
    if (!entry.is_regular_file()) continue;
    EXPECT_EQ(perms, fs::perms::owner_read | fs::perms::owner_write) << entry.path();
    if (entry.path().extension() == ".safetensors") ++files;  // not the store's .viper.lock
  }
  EXPECT_EQ(files, 3u);
}

// Mapping the node's segment is refused by the kernel; the consumer says whose segment it is and
// what to do, and exits on its own timeout (3), not by a signal.
TEST_F(OtherUser, MapPathGivesAClearErrorNotACrash) {
  std::string log;
  int code = ConsumeAsNobody("map", &log);
  EXPECT_EQ(code, 3) << log;
  EXPECT_NE(log.find("belongs to uid 0 with mode 0600 and this process runs as uid 65534"), std::string::npos) << log;
  std::printf("map as nobody: %s", log.substr(0, log.find('\n') + 1).c_str());
}

TEST_F(OtherUser, FilePathGivesAClearErrorNotACrash) {
  std::string log;
  int code = ConsumeAsNobody("file", &log);
  EXPECT_EQ(code, 3) << log;
  EXPECT_NE(log.find("Permission denied"), std::string::npos) << log;
}

// With the cheapest path chosen automatically, the consumer falls back to the remote path (UCX,
// no shared memory of the node's) and gets every version, whole.
TEST_F(OtherUser, AutoPathFallsBackToRemoteAndGetsTheModel) {
  std::string log;
  int code = ConsumeAsNobody("auto", &log);
  EXPECT_EQ(code, 0) << log;
  std::string status = ReadFile(dir_ / "nobody" / "auto.status");
  EXPECT_NE(status.find("\"errors\":0"), std::string::npos) << status;
  EXPECT_NE(log.find("belongs to uid 0"), std::string::npos) << "the fallback names why: " << log;
}

}  // namespace
}  // namespace viper::testing
