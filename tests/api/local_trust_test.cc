// Local trust boundaries (docs/RELIABILITY.md "Threat model"): another local user must not stop a
// node or inject a version through /dev/shm, symbolic links must not be written or deleted
// through, token files must be owner-only, and a node's shared memory has a budget. Real
// processes throughout; the other local user is a throwaway account made for the test (root
// only: the tests that need one are skipped with the reason otherwise).
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "core/token_file.h"
#include "node_impl.h"
#include "pattern.h"
#include "process.h"
#include "store/file_tier.h"
#include "store/host_tier.h"
#include "viper/log.h"
#include "viper/node.h"
#include "viper/registry.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::ReadFile;
using testing::TempDir;
using testing::ViperBinary;
using testing::WaitForFile;
using testing::WaitUntil;

// A sealed snapshot of one U8 tensor of `data_bytes` for (model, version), written into `dst`
// (SnapshotBytes(data_bytes) long); the bytes depend on `seed`.
uint64_t SnapshotBytes(uint64_t data_bytes) {
  return SnapshotLayout::Make({{"w", DType::kU8, {static_cast<int64_t>(data_bytes)}}}).value().total_bytes();
}
void WriteSnapshot(std::span<std::byte> dst, const std::string& model, uint64_t version, uint64_t data_bytes,
                   uint64_t seed) {
  auto layout = SnapshotLayout::Make({{"w", DType::kU8, {static_cast<int64_t>(data_bytes)}}});
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(dst.size(), layout->total_bytes());
  std::span<std::byte> data = dst.subspan(layout->data_offset());
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(testing::Pattern(seed, i % 251));
  VersionStamp stamp;
  stamp.model = model;
  stamp.version = version;
  Status st = layout->Seal(dst, &stamp);
  ASSERT_TRUE(st.ok()) << st.ToString();
}
std::vector<std::byte> MakeSnapshot(const std::string& model, uint64_t version, uint64_t data_bytes, uint64_t seed) {
  std::vector<std::byte> buf(SnapshotBytes(data_bytes));
  WriteSnapshot(buf, model, version, data_bytes, seed);
  return buf;
}
std::string UniqueName(const std::string& stem) {
  static int n = 0;
  return stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// A local account that exists for one test: created with useradd, removed with userdel when the
// object goes (also when an assertion ends the test early).
class ThrowawayUser {
 public:
  ThrowawayUser() : name_("vtrust" + std::to_string(::getpid())) {
    if (::geteuid() != 0) {
      why_not_ = "not root: cannot create a throwaway user to play the other local user";
      return;
    }
    std::string cmd = "useradd --system --no-create-home --shell /usr/sbin/nologin " + name_ + " 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      why_not_ = "useradd " + name_ + " failed";
      return;
    }
    created_ = true;
    if (const passwd* pw = ::getpwnam(name_.c_str())) uid_ = pw->pw_uid;
  }
  ~ThrowawayUser() {
    if (created_) std::system(("userdel " + name_ + " 2>&1").c_str());
  }
  ThrowawayUser(const ThrowawayUser&) = delete;

  bool ok() const { return created_ && uid_ != 0; }
  const std::string& why_not() const { return why_not_; }
  const std::string& name() const { return name_; }
  uid_t uid() const { return uid_; }
  // Runs `script` with sh as this user; its exit status. The script must not contain a single quote.
  int Run(const std::string& script, const std::string& stdin_from = "/dev/null") const {
    std::string cmd = "runuser -u " + name_ + " -- sh -c '" + script + "' <" + stdin_from;
    int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }

 private:
  std::string name_;
  std::string why_not_;
  bool created_ = false;
  uid_t uid_ = 0;
};

#define REQUIRE_OTHER_USER(user) \
  ThrowawayUser user;            \
  if (!user.ok()) GTEST_SKIP() << user.why_not()

void WriteBytes(const std::filesystem::path& path, std::span<const std::byte> bytes, mode_t mode) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  ::chmod(path.c_str(), mode);
}

uid_t OwnerOf(const std::filesystem::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
}

pid_t DeadPid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// A `viper ...` started by a shell that waits for `go` to exist: its pid (the shell execs the
// command, so the pid stays) is known before the command runs, as an attacker watching the
// process table would know it.
std::vector<std::string> HeldBack(const std::filesystem::path& go, const std::vector<std::string>& viper_args) {
  std::string cmd = "while [ ! -e " + go.string() + " ]; do sleep 0.02; done; exec " + ViperBinary();
  for (const auto& a : viper_args) cmd += " " + a;
  return {"/bin/sh", "-c", cmd};
}

void Touch(const std::filesystem::path& path) { std::ofstream(path).put('\n'); }

// ---------------------------------------------------------------- 1. segments

// Another user puts a sealed snapshot in /dev/shm under the node's pattern with a dead pid: a
// higher version of the node's own model and a model of its own, as a file and as a symbolic
// link. The restarted node adopts only the segment its own uid left (with its segment mode).
TEST(LocalTrust, NodeAdoptsOnlyItsOwnUsersSegments) {
  REQUIRE_OTHER_USER(other);
  TempDir dir;
  NodeOptions options;
  options.store_dir = dir / "store";
  options.segment_prefix = "vtr" + std::to_string(::getpid());
  const std::string prefix = internal::SegmentPrefixFor(options);
  const pid_t dead = DeadPid();
  auto shm = [&](int seq) { return std::filesystem::path("/dev/shm") / fmt::format("{}.{}.{}", prefix, dead, seq); };

  // Ours: a killed predecessor's sealed version (must be recovered: the test can fail).
  WriteBytes(shm(1), MakeSnapshot("model", 5, 4096, 1), 0600);
  // Ours but with a mode the node does not use: not adopted.
  WriteBytes(shm(2), MakeSnapshot("wide", 1, 4096, 2), 0644);
  // The other user's: a higher version of the same model, and a model of its own.
  WriteBytes(dir / "evil9", MakeSnapshot("model", 9, 4096, 3), 0600);
  WriteBytes(dir / "evil1", MakeSnapshot("evil", 1, 4096, 4), 0600);
  ASSERT_EQ(other.Run("cat > " + shm(3).string() + " && chmod 600 " + shm(3).string(), (dir / "evil9").string()), 0);
  ASSERT_EQ(other.Run("cat > " + shm(4).string() + " && chmod 600 " + shm(4).string(), (dir / "evil1").string()), 0);
  // A link the other user planted, to a sealed file of ours elsewhere.
  WriteBytes(dir / "linked", MakeSnapshot("linked", 1, 4096, 5), 0600);
  ASSERT_EQ(other.Run("ln -s " + (dir / "linked").string() + " " + shm(5).string()), 0);
  ASSERT_EQ(OwnerOf(shm(3)), other.uid());

  ::testing::internal::CaptureStderr();
  auto node = Node::Start(options);
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(node.ok()) << node.status().ToString() << log;
  FileTier* files = (*node)->file_tier();
  EXPECT_TRUE(files->Find("model", 5)) << log;  // ours, adopted
  EXPECT_FALSE(files->Find("model", 9)) << log;
  EXPECT_FALSE(files->Find("evil", 1)) << log;
  EXPECT_FALSE(files->Find("linked", 1)) << log;
  EXPECT_FALSE(files->Find("wide", 1)) << log;
  ASSERT_TRUE((*node)->Latest("model"));
  EXPECT_EQ((*node)->Latest("model")->version, 5u);
  EXPECT_NE(log.find(shm(3).filename().string() + ": named like a segment of a dead process but owned by uid " +
                     std::to_string(other.uid())),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(shm(5).filename().string() + ": named like a segment of a dead process but not a regular file"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("not adopting segment " + shm(2).filename().string()), std::string::npos) << log;
  // The other user's entries are left as they were (not removed, not written).
  EXPECT_EQ(OwnerOf(shm(3)), other.uid());
  EXPECT_EQ(OwnerOf(shm(4)), other.uid());
  EXPECT_EQ(OwnerOf(shm(5)), other.uid());
  EXPECT_FALSE(std::filesystem::exists(shm(1)));  // ours: recovered, then removed
  node->reset();
  for (int i = 1; i <= 5; ++i) ::unlink(shm(i).c_str());
}

// Another user creates the names a node is about to use (and a link among them) before the node
// starts: the node starts, publishes under other names and leaves the squatted entries alone.
TEST(LocalTrust, SquattedSegmentNamesDoNotStopANode) {
  REQUIRE_OTHER_USER(other);
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);  // the other user plants a link to a file in it
  const std::string prefix = "vsq" + std::to_string(::getpid());
  Process serve(HeldBack(dir / "go", {"serve", "--listen", "127.0.0.1:0", "--segment-prefix", prefix,
                                      "--address-file", (dir / "addr").string()}),
                dir / "serve.log");
  ASSERT_GT(serve.pid(), 0);
  WriteBytes(dir / "victim", std::vector<std::byte>(16, std::byte{'v'}), 0644);
  std::string squat = "for i in $(seq 1 64); do : > /dev/shm/" + prefix + "." + std::to_string(serve.pid()) +
                      ".$i; done; ln -s " + (dir / "victim").string() + " /dev/shm/" + prefix + "." +
                      std::to_string(serve.pid()) + ".65";
  ASSERT_EQ(other.Run(squat), 0);
  Touch(dir / "go");
  std::string addr = WaitForFile(dir / "addr", 20s);
  ASSERT_FALSE(addr.empty()) << serve.log();
  auto snapshot = MakeSnapshot("sq", 1, 64 << 10, 7);
  WriteBytes(dir / "in.safetensors", snapshot, 0600);
  for (int i = 0; i < 3; ++i) {
    Process publish({ViperBinary(), "publish", "sq", (dir / "in.safetensors").string(), "--connect", addr},
                    dir / "publish.log");
    ASSERT_EQ(publish.Wait(30s), 0) << publish.log() << serve.log();
  }
  Process pull({ViperBinary(), "pull", "sq", "-o", (dir / "out.safetensors").string(), "--connect", addr},
               dir / "pull.log");
  ASSERT_EQ(pull.Wait(30s), 0) << pull.log();
  ParseOptions strict;
  strict.require_checksum = true;
  strict.verify_checksum = true;
  auto pulled = Snapshot::OpenFile(dir / "out.safetensors", strict);
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(pulled->version(), 3u);
  EXPECT_NE(serve.log().find("the name is taken (by uid " + std::to_string(other.uid())), std::string::npos)
      << serve.log();
  serve.Kill(SIGTERM);
  for (int i = 1; i <= 65; ++i) {
    std::filesystem::path p = fmt::format("/dev/shm/{}.{}.{}", prefix, serve.pid(), i);
    EXPECT_EQ(OwnerOf(p), other.uid()) << p;  // still the other user's
    if (i <= 64) {
      EXPECT_EQ(std::filesystem::file_size(p), 0u) << p;
    }
    ::unlink(p.c_str());
  }
  EXPECT_EQ(ReadFile(dir / "victim"), std::string(16, 'v'));
}

// ---------------------------------------------------------------- 2. symbolic links

// A model directory that is a link to another directory: not served, not written through, and
// retention there deletes nothing; a version file that is a link is not served or deleted.
TEST(LocalTrust, FileTierRefusesLinks) {
  TempDir dir;
  const auto store = dir / "store";
  const auto elsewhere = dir / "elsewhere";
  std::filesystem::create_directories(store);
  std::filesystem::create_directories(elsewhere);
  WriteBytes(elsewhere / "1.safetensors", MakeSnapshot("linked", 1, 1024, 1), 0600);
  std::filesystem::create_directory_symlink(elsewhere, store / "linked");
  std::filesystem::create_directories(store / "real");
  WriteBytes(dir / "outside", MakeSnapshot("real", 2, 1024, 2), 0600);
  std::filesystem::create_symlink(dir / "outside", store / "real" / "2.safetensors");

  FileTierOptions o;
  o.dir = store;
  o.keep_versions = 1;
  o.fsync = false;
  ::testing::internal::CaptureStderr();
  auto tier = FileTier::Open(o);
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_FALSE((*tier)->Find("linked", 1)) << log;
  EXPECT_FALSE((*tier)->Find("real", 2)) << log;
  EXPECT_NE(log.find("a model directory that is a symbolic link is never followed"), std::string::npos) << log;
  EXPECT_NE(log.find("2.safetensors is a symbolic link"), std::string::npos) << log;

  Status written = (*tier)->Write("linked", 2, MakeSnapshot("linked", 2, 1024, 3));
  EXPECT_EQ(written.code(), StatusCode::kInvalidArgument) << written.ToString();
  EXPECT_NE(written.message().find("is a symbolic link"), std::string::npos) << written.ToString();
  EXPECT_FALSE(std::filesystem::exists(elsewhere / "2.safetensors"));
  auto read = (*tier)->Read("linked", 1);
  EXPECT_FALSE(read.ok());

  // Retention in the real directory removes what the tier wrote, never the planted link.
  for (uint64_t v : {3, 4, 5}) {
    Status st = (*tier)->Write("real", v, MakeSnapshot("real", v, 1024, v));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_FALSE(std::filesystem::exists(store / "real" / "3.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(store / "real" / "4.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(store / "real" / "5.safetensors"));
  EXPECT_TRUE(std::filesystem::is_symlink(store / "real" / "2.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir / "outside"));
  EXPECT_TRUE(std::filesystem::exists(elsewhere / "1.safetensors"));
}

// A store another local user owns (the audit's squatted /tmp/viper-store), one group or others
// may write, or a symbolic link another user owns: the node refuses to start, naming the path,
// the owner and the mode. In its own store, another user's model directory and version file are
// not served, are left where they are, and their numbers are not handed out again.
TEST(LocalTrust, StoreMustBeTheNodesOwnAndNotWritableByOthers) {
  REQUIRE_OTHER_USER(other);
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);  // the other user reaches pub/ in it
  NodeOptions options;
  options.segment_prefix = UniqueName("vstore");
  auto refused = [&](const std::filesystem::path& store) {
    options.store_dir = store;
    auto node = Node::Start(options);
    EXPECT_FALSE(node.ok()) << store;
    return node.ok() ? std::string() : node.status().message();
  };
  std::filesystem::create_directories(dir / "pub");  // stands for /tmp
  ::chmod((dir / "pub").c_str(), 01777);
  ASSERT_EQ(other.Run("mkdir -m 0777 " + (dir / "pub" / "theirs").string()), 0);
  std::string why = refused(dir / "pub" / "theirs");
  EXPECT_NE(why.find((dir / "pub" / "theirs").string() + " is owned by uid " + std::to_string(other.uid()) +
                     " with mode 0777"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("$HOME/viper-store"), std::string::npos) << why;
  std::filesystem::create_directories(dir / "wide");
  ::chmod((dir / "wide").c_str(), 0777);
  why = refused(dir / "wide");
  EXPECT_NE(why.find("with mode 0777"), std::string::npos) << why;
  std::filesystem::create_directories(dir / "real");
  ASSERT_EQ(other.Run("ln -s " + (dir / "real").string() + " " + (dir / "pub" / "link").string()), 0);
  why = refused(dir / "pub" / "link");  // the other user's link, to a good store of ours
  EXPECT_NE(why.find("is a symbolic link owned by uid " + std::to_string(other.uid())), std::string::npos) << why;
  std::filesystem::create_directory_symlink(dir / "wide", dir / "ourlink");
  why = refused(dir / "ourlink");  // our own link: its target is checked
  EXPECT_NE(why.find((dir / "ourlink").string() + " is owned by uid 0 with mode 0777"), std::string::npos) << why;

  // The node's own store, with the other user's files in it.
  const std::filesystem::path store = dir / "real";
  std::filesystem::create_directories(store / "m");
  std::filesystem::create_directories(store / "x");
  WriteBytes(store / "m" / "1.safetensors", MakeSnapshot("m", 1, 4096, 1), 0600);
  WriteBytes(store / "m" / "2.safetensors", MakeSnapshot("m", 2, 4096, 2), 0600);
  WriteBytes(store / "x" / "1.safetensors", MakeSnapshot("x", 1, 4096, 3), 0600);
  ASSERT_EQ(::chown((store / "m" / "2.safetensors").c_str(), other.uid(), static_cast<gid_t>(-1)), 0);
  ASSERT_EQ(::chown((store / "x").c_str(), other.uid(), static_cast<gid_t>(-1)), 0);
  options.store_dir = store;
  ::testing::internal::CaptureStderr();
  auto node = Node::Start(options);
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(node.ok()) << node.status().ToString() << log;
  ASSERT_TRUE((*node)->Latest("m")) << log;
  EXPECT_EQ((*node)->Latest("m")->version, 1u) << log;
  EXPECT_FALSE((*node)->Latest("x")) << log;
  EXPECT_NE(log.find("2.safetensors is owned by uid " + std::to_string(other.uid())), std::string::npos) << log;
  EXPECT_NE(log.find("model directory " + (store / "x").string() + " is owned by uid " + std::to_string(other.uid())),
            std::string::npos)
      << log;
  auto next = (*node)->ReserveVersion("m");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 3u) << "the number of the other user's file was handed out again";
  node->reset();
  EXPECT_EQ(OwnerOf(store / "m" / "2.safetensors"), other.uid()) << "left where it is";
  EXPECT_EQ(OwnerOf(store / "x"), other.uid());
  EXPECT_TRUE(std::filesystem::exists(store / "x" / "1.safetensors"));
}

// A token file or registry password file another user owns is refused, as ssh refuses such a key:
// its owner chooses the secret (or can replace the file). Root's and the process's own are taken.
TEST(LocalTrust, SecretFilesOfAnotherUserAreRefused) {
  REQUIRE_OTHER_USER(other);
  TempDir dir;
  const std::filesystem::path secret = dir / "secret";
  std::ofstream(secret) << "s3cret\n";
  ::chmod(secret.c_str(), 0600);
  ASSERT_EQ(::chown(secret.c_str(), other.uid(), static_cast<gid_t>(-1)), 0);
  const std::string owned = "is owned by uid " + std::to_string(other.uid());
  auto token = ReadTokenFile(secret.string());
  ASSERT_FALSE(token.ok());
  EXPECT_NE(token.status().message().find(owned), std::string::npos) << token.status().message();
  auto password = ReadRegistryPasswordFile(secret.string());
  ASSERT_FALSE(password.ok());
  EXPECT_NE(password.status().message().find(owned), std::string::npos) << password.status().message();
  ASSERT_EQ(::chown(secret.c_str(), ::geteuid(), static_cast<gid_t>(-1)), 0);
  EXPECT_TRUE(ReadTokenFile(secret.string()).ok());
  EXPECT_TRUE(ReadRegistryPasswordFile(secret.string()).ok());
}

// `viper pull -o OUT` in a directory another user can write to: a link planted at the temporary
// name the old code used (OUT.tmp.<pid>) is not written through; OUT gets the pulled bytes.
TEST(LocalTrust, PullOutputTemporaryIsNotPredictableOrFollowed) {
  TempDir dir;
  std::filesystem::path store = dir / "store";
  Process serve({ViperBinary(), "serve", "--listen", "127.0.0.1:0", "--segment-prefix",
                 "vpl" + std::to_string(::getpid()), "--address-file", (dir / "addr").string()},
                dir / "serve.log");
  std::string addr = WaitForFile(dir / "addr", 20s);
  ASSERT_FALSE(addr.empty()) << serve.log();
  WriteBytes(dir / "in.safetensors", MakeSnapshot("pl", 1, 4096, 9), 0600);
  Process publish({ViperBinary(), "publish", "pl", (dir / "in.safetensors").string(), "--connect", addr},
                  dir / "publish.log");
  ASSERT_EQ(publish.Wait(30s), 0) << publish.log();

  const auto out = dir / "out.safetensors";
  WriteBytes(dir / "victim", std::vector<std::byte>(16, std::byte{'v'}), 0644);
  Process pull(HeldBack(dir / "go", {"pull", "pl", "-o", out.string(), "--connect", addr}), dir / "pull.log");
  ASSERT_GT(pull.pid(), 0);
  std::filesystem::create_symlink(dir / "victim", out.string() + ".tmp." + std::to_string(pull.pid()));
  Touch(dir / "go");
  ASSERT_EQ(pull.Wait(30s), 0) << pull.log();
  EXPECT_EQ(ReadFile(dir / "victim"), std::string(16, 'v'));
  ParseOptions strict;
  strict.require_checksum = true;
  strict.verify_checksum = true;
  auto pulled = Snapshot::OpenFile(out, strict);
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(pulled->model(), "pl");
  // Nothing but the planted link is left next to OUT.
  size_t temps = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    temps += e.path().filename().string().starts_with("out.safetensors.tmp.") ? 1 : 0;
  }
  EXPECT_EQ(temps, 1u);
  serve.Kill(SIGTERM);
}

// ---------------------------------------------------------------- 5. token files, budget

TEST(LocalTrust, TokenFileMustBeOwnerOnlyAndAFile) {
  TempDir dir;
  auto serve_with = [&](const std::filesystem::path& token, const std::string& log) {
    Process serve({ViperBinary(), "serve", "--listen", "127.0.0.1:0", "--token-file", token.string()}, dir / log);
    int rc = serve.Wait(20s);
    return std::make_pair(rc, serve.log());
  };
  std::ofstream(dir / "shared") << "s3cret\n";
  ::chmod((dir / "shared").c_str(), 0640);
  auto [rc1, log1] = serve_with(dir / "shared", "shared.log");
  EXPECT_NE(rc1, 0);
  EXPECT_NE(log1.find("has mode 0640: group or others may access it, so the token is not secret; run chmod 600 " +
                      (dir / "shared").string()),
            std::string::npos)
      << log1;
  std::filesystem::create_directories(dir / "tokdir");
  auto [rc2, log2] = serve_with(dir / "tokdir", "dir.log");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(log2.find("--token-file"), std::string::npos) << log2;
  EXPECT_NE(log2.find("is a directory"), std::string::npos) << log2;
}

// The same token with surrounding whitespace in the file and in VIPER_TOKEN is the same token.
TEST(LocalTrust, TokenWhitespaceIsStrippedTheSameWayFromFileAndEnvironment) {
  TempDir dir;
  std::ofstream(dir / "token") << "\n  s3cret \t\r\n";
  ::chmod((dir / "token").c_str(), 0600);
  Process serve({ViperBinary(), "serve", "--listen", "127.0.0.1:0", "--token-file", (dir / "token").string(),
                 "--address-file", (dir / "addr").string()},
                dir / "serve.log");
  std::string addr = WaitForFile(dir / "addr", 20s);
  ASSERT_FALSE(addr.empty()) << serve.log();
  ::setenv("VIPER_TOKEN", " s3cret\n", 1);
  Process ls({ViperBinary(), "ls", "--connect", addr}, dir / "ls.log");
  int rc = ls.Wait(30s);
  ::setenv("VIPER_TOKEN", "other", 1);
  Process wrong({ViperBinary(), "ls", "--connect", addr}, dir / "wrong.log");
  int wrong_rc = wrong.Wait(30s);
  ::unsetenv("VIPER_TOKEN");
  EXPECT_EQ(rc, 0) << ls.log() << serve.log();
  EXPECT_NE(wrong_rc, 0) << wrong.log();  // the check is real
  serve.Kill(SIGTERM);
}

// `viper serve --host-max-models 2 --host-max-bytes ...`: a third model, or a version beyond the
// bytes, is refused with ResourceExhausted naming the budget; the node keeps serving.
TEST(LocalTrust, HostTierBudgetRefusesPublishesBeyondIt) {
  TempDir dir;
  Process serve({ViperBinary(), "serve", "--listen", "127.0.0.1:0", "--segment-prefix",
                 "vbg" + std::to_string(::getpid()), "--host-max-models", "2", "--host-max-bytes", "4MiB",
                 "--address-file", (dir / "addr").string()},
                dir / "serve.log");
  std::string addr = WaitForFile(dir / "addr", 20s);
  ASSERT_FALSE(addr.empty()) << serve.log();
  auto publish = [&](const std::string& model, uint64_t data_bytes) {
    WriteBytes(dir / "in.safetensors", MakeSnapshot(model, 1, data_bytes, 1), 0600);
    Process p({ViperBinary(), "publish", model, (dir / "in.safetensors").string(), "--connect", addr},
              dir / (model + ".log"));
    int rc = p.Wait(30s);
    return std::make_pair(rc, p.log());
  };
  EXPECT_EQ(publish("a", 64 << 10).first, 0);
  EXPECT_EQ(publish("b", 64 << 10).first, 0);
  auto [rc, log] = publish("c", 64 << 10);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("beyond its budget of 2 models"), std::string::npos) << log << serve.log();
  auto [big_rc, big_log] = publish("a", 8 << 20);
  EXPECT_NE(big_rc, 0);
  EXPECT_NE(big_log.find("beyond its budget of 4 MiB"), std::string::npos) << big_log << serve.log();
  EXPECT_EQ(publish("b", 64 << 10).first, 0);  // still serving within the budget
  serve.Kill(SIGTERM);
}

// The byte budget in the API: retired segments are recycled (or unlinked) before anything is
// refused, and an Allocate that cannot fit fails with ResourceExhausted, not SIGBUS or ENOSPC.
TEST(LocalTrust, HostTierByteBudgetRecyclesFreeSegmentsFirst) {
  HostTierOptions o;
  o.prefix = UniqueName("vbb");
  o.keep_versions = 1;
  const uint64_t data = 200 << 10;
  const uint64_t size = SnapshotBytes(data);
  o.max_bytes = 3 * (size + 8192);  // three segments of this size
  auto tier = HostTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  // keep_versions 1: each commit retires the previous version, which is recycled.
  for (uint64_t v = 1; v <= 20; ++v) {
    auto lease = (*tier)->Allocate(size);
    ASSERT_TRUE(lease.ok()) << v << ": " << lease.status().ToString();
    WriteSnapshot(lease->data(), "m", v, data, v);
    Status st = (*tier)->Commit(*std::move(lease), "m", v);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_LE((*tier)->stats().mapped_bytes, o.max_bytes);
  auto a = (*tier)->Allocate(size);
  auto b = (*tier)->Allocate(size);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  auto c = (*tier)->Allocate(size);  // the committed version and two being written fill the budget
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted) << c.status().ToString();
  EXPECT_NE(c.status().message().find("beyond its budget of"), std::string::npos) << c.status().ToString();
}

}  // namespace
}  // namespace viper
