// FileTier against a real directory on disk and a real writer process killed mid-write.
#include "store/file_tier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

#include "store/store_test_util.h"

namespace viper {
namespace {

namespace fs = std::filesystem;
using testing::MakeSnapshot;
using testing::TempDir;

std::unique_ptr<FileTier> OpenTier(const fs::path& dir, size_t keep = 3) {
  FileTierOptions o;
  o.dir = dir;
  o.keep_versions = keep;
  auto tier = FileTier::Open(o);
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  return tier.ok() ? std::move(*tier) : nullptr;
}

bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

std::vector<uint64_t> Versions(const FileTier& tier, const std::string& model) {
  std::vector<uint64_t> out;
  for (const FileEntry& e : tier.List()) {
    if (e.model == model) out.push_back(e.version);
  }
  return out;
}

void FlipByte(const fs::path& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= 0x01;
  ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A pid that surely belongs to no process: a child that has exited and been reaped.
pid_t DeadPid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

std::string HostName() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

TEST(FileTier, WriteReadRoundTrip) {
  TempDir dir;
  auto tier = OpenTier(dir.path());
  ASSERT_TRUE(tier);
  auto bytes = MakeSnapshot("nt3", 1, 3 << 20, 11);
  ASSERT_TRUE(tier->Write("nt3", 1, bytes).ok());
  EXPECT_TRUE(fs::exists(dir.path() / "nt3" / "1.safetensors"));
  EXPECT_EQ(tier->PathFor("nt3", 1), dir.path() / "nt3" / "1.safetensors");

  auto snap = tier->Read("nt3", 1);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_TRUE(SameBytes(snap->bytes(), bytes));
  EXPECT_EQ(snap->version(), 1u);

  std::vector<std::byte> dst(bytes.size() + 100);
  auto n = tier->ReadInto("nt3", 1, dst);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, bytes.size());
  EXPECT_TRUE(SameBytes(std::span(dst).first(*n), bytes));

  auto entry = tier->Find("nt3", 1);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->size, bytes.size());
  EXPECT_EQ(entry->checksum, snap->declared_checksum());
  EXPECT_EQ(tier->Latest("nt3")->version, 1u);
  EXPECT_FALSE(tier->Latest("other").has_value());
  // Nothing but the file itself is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path() / "nt3"), fs::directory_iterator()), 1);
}

TEST(FileTier, FilesAreOwnerOnlyWhateverTheUmask) {
  TempDir dir;
  mode_t old = ::umask(0);
  auto tier = OpenTier(dir.path() / "new" / "tier");
  ASSERT_TRUE(tier);
  ASSERT_TRUE(tier->Write("m", 1, MakeSnapshot("m", 1, 4096, 1)).ok());
  struct stat st {};
  ASSERT_EQ(::stat(tier->PathFor("m", 1).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir.path() / "new" / "tier").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((dir.path() / "new").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "a parent the tier created takes the umask's 0777";
  ASSERT_EQ(::stat((dir.path() / "new" / "tier" / "m").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  ::umask(0077);
  FileTierOptions o;
  o.dir = dir.path() / "shared";
  o.file_mode = 0640;
  auto shared = FileTier::Open(o);
  ASSERT_TRUE(shared.ok());
  ASSERT_TRUE((*shared)->Write("m", 1, MakeSnapshot("m", 1, 4096, 1)).ok());
  ASSERT_EQ(::stat((*shared)->PathFor("m", 1).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  ::umask(old);
}

TEST(FileTier, RetentionKeepsTheLatestN) {
  TempDir dir;
  auto tier = OpenTier(dir.path(), /*keep=*/2);
  ASSERT_TRUE(tier);
  for (uint64_t v = 1; v <= 5; ++v) ASSERT_TRUE(tier->Write("m", v, MakeSnapshot("m", v, 4096, v)).ok());
  ASSERT_TRUE(tier->Write("other", 9, MakeSnapshot("other", 9, 4096, 9)).ok());
  EXPECT_EQ(Versions(*tier, "m"), (std::vector<uint64_t>{4, 5}));
  EXPECT_EQ(Versions(*tier, "other"), (std::vector<uint64_t>{9}));
  for (uint64_t v = 1; v <= 3; ++v) EXPECT_FALSE(fs::exists(tier->PathFor("m", v))) << v;
  auto gone = tier->Read("m", 2);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("versions: 4, 5"), std::string::npos) << gone.status().message();
}

TEST(FileTier, OpenIndexesWhatIsThereAndSkipsLeftoversAndCorruptFiles) {
  TempDir dir;
  std::vector<std::vector<std::byte>> snaps;
  {
    auto tier = OpenTier(dir.path(), /*keep=*/10);
    ASSERT_TRUE(tier);
    for (uint64_t v = 1; v <= 3; ++v) {
      snaps.push_back(MakeSnapshot("m", v, 1 << 20, v));
      ASSERT_TRUE(tier->Write("m", v, snaps.back()).ok());
    }
  }
  const fs::path mdir = dir.path() / "m";
  // A crashed writer on this host (dead pid), a writer on another host whose file has not moved
  // for an hour, and a write in progress in a live process (this one).
  const fs::path dead_tmp = mdir / ("4.safetensors.tmp." + std::to_string(DeadPid()) + ".1." + HostName());
  const fs::path old_tmp = mdir / "5.safetensors.tmp.123.1.some-other-host";
  const fs::path live_tmp = mdir / ("6.safetensors.tmp." + std::to_string(::getpid()) + ".1." + HostName());
  for (const auto& p : {dead_tmp, old_tmp, live_tmp}) std::ofstream(p) << "partial";
  struct timespec times[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, old_tmp.c_str(), times, 0), 0);
  // Bit rot in version 3's data; version 2 copied under a wrong name; junk names.
  FlipByte(mdir / "3.safetensors", snaps[2].size() - 10);
  fs::copy_file(mdir / "2.safetensors", mdir / "7.safetensors");
  fs::copy_file(mdir / "2.safetensors", mdir / "08.safetensors");
  std::ofstream(mdir / "notes.txt") << "not a snapshot";
  std::ofstream(mdir / "9.safetensors") << "garbage";

  ::testing::internal::CaptureStderr();
  auto tier = OpenTier(dir.path(), /*keep=*/10);
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(tier);
  EXPECT_EQ(Versions(*tier, "m"), (std::vector<uint64_t>{1, 2}));
  EXPECT_FALSE(fs::exists(dead_tmp)) << "leftover of a dead writer is removed";
  EXPECT_FALSE(fs::exists(old_tmp)) << "leftover untouched for an hour is removed";
  EXPECT_TRUE(fs::exists(live_tmp)) << "a live writer's file is left alone";
  for (const std::string& name : {dead_tmp.filename().string(), old_tmp.filename().string(),
                                  live_tmp.filename().string(), std::string("/3.safetensors"),
                                  std::string("/7.safetensors"), std::string("/08.safetensors"),
                                  std::string("/9.safetensors")}) {
    EXPECT_NE(log.find(name), std::string::npos) << "no warning names " << name << "\n" << log;
  }
  EXPECT_NE(log.find("checksum"), std::string::npos) << log;
  EXPECT_NE(log.find("viper.version is 2, not 7"), std::string::npos) << log;

  // The corrupt file is never served, even when asked for directly.
  auto bad = tier->Read("m", 3);
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption) << bad.status().ToString();
  std::vector<std::byte> dst(snaps[2].size());
  EXPECT_EQ(tier->ReadInto("m", 3, dst).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(tier->Find("m", 3).has_value());
  auto good = tier->Read("m", 2);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(SameBytes(good->bytes(), snaps[1]));
}

TEST(FileTier, CorruptionAfterWriteIsCaughtOnRead) {
  TempDir dir;
  auto tier = OpenTier(dir.path());
  ASSERT_TRUE(tier);
  auto bytes = MakeSnapshot("m", 1, 1 << 20, 5);
  ASSERT_TRUE(tier->Write("m", 1, bytes).ok());
  FlipByte(tier->PathFor("m", 1), bytes.size() / 2);
  auto snap = tier->Read("m", 1);
  EXPECT_EQ(snap.status().code(), StatusCode::kCorruption);
  EXPECT_NE(snap.status().message().find("checksum"), std::string::npos) << snap.status().message();
  std::vector<std::byte> dst(bytes.size());
  auto n = tier->ReadInto("m", 1, dst);
  EXPECT_EQ(n.status().code(), StatusCode::kCorruption);
  EXPECT_NE(n.status().message().find(tier->PathFor("m", 1).string()), std::string::npos) << n.status().message();
}

// Writes a version too large to finish between two polls in a child process and SIGKILLs the
// child once the temporary file is past half its final size. Returns true if it was caught
// mid-write (false if the child won the race and finished).
bool KillWriterMidWrite(const fs::path& dir, uint64_t version, const std::vector<std::byte>& big) {
  pid_t pid = ::fork();
  if (pid == 0) {
    FileTierOptions o;
    o.dir = dir;
    auto tier = FileTier::Open(o);
    if (!tier.ok()) ::_exit(3);
    ::_exit((*tier)->Write("m", version, big).ok() ? 0 : 4);
  }
  const std::string marker = std::to_string(version) + ".safetensors.tmp.";
  bool killed = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!killed && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir / "m", ec)) {
      if (e.path().filename().string().starts_with(marker) && fs::file_size(e.path(), ec) > big.size() / 2) {
        killed = ::kill(pid, SIGKILL) == 0;
        break;
      }
    }
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return false;  // finished (or failed) first
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

TEST(FileTier, AWriterKilledMidWriteLeavesNoPartialFileAndTheLastVersionIsServed) {
  TempDir dir;
  auto small = MakeSnapshot("m", 1, 1 << 20, 1);
  {
    auto tier = OpenTier(dir.path());
    ASSERT_TRUE(tier);
    ASSERT_TRUE(tier->Write("m", 1, small).ok());
  }
  // ~400 MB, built once; the child writes it from the copy-on-write image of this buffer.
  const uint64_t kBig = 400ull << 20;
  std::vector<std::byte> big(testing::SnapshotBytes(kBig));
  uint64_t version = 2;
  bool caught = false;
  for (int attempt = 0; attempt < 4 && !caught; ++attempt, ++version) {
    testing::WriteSnapshot(big, "m", version, kBig, version);
    caught = KillWriterMidWrite(dir.path(), version, big);
    if (!caught) {  // the child won: forget its complete version and try again
      std::error_code ec;
      fs::remove(dir.path() / "m" / (std::to_string(version) + ".safetensors"), ec);
    }
  }
  ASSERT_TRUE(caught) << "could not catch the writer mid-write in 4 attempts";
  --version;  // the version that was being written

  ::testing::internal::CaptureStderr();
  auto tier = OpenTier(dir.path());
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(tier);
  EXPECT_NE(log.find("removing"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(tier->PathFor("m", version)));
  EXPECT_EQ(Versions(*tier, "m"), std::vector<uint64_t>{1});
  EXPECT_EQ(tier->Read("m", version).status().code(), StatusCode::kNotFound);
  auto latest = tier->Latest("m");
  ASSERT_TRUE(latest.has_value());
  auto snap = tier->Read("m", latest->version);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_TRUE(SameBytes(snap->bytes(), small));
  // Nothing else is left: no temporary file, no partial file under any name.
  for (const auto& e : fs::directory_iterator(dir.path() / "m")) {
    EXPECT_EQ(e.path().filename(), "1.safetensors") << "left behind: " << e.path();
  }
}

TEST(FileTier, BadNamesVersionsAndBuffersGiveClearErrors) {
  TempDir dir;
  auto tier = OpenTier(dir.path());
  ASSERT_TRUE(tier);
  auto bytes = MakeSnapshot("m", 1, 4096, 1);
  for (const std::string& model : std::vector<std::string>{"", "..", "../evil", "a/b", ".hidden", std::string(129, 'x')}) {
    Status st = tier->Write(model, 1, bytes);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << model;
    EXPECT_NE(st.message().find("model name"), std::string::npos) << st.message();
    EXPECT_EQ(tier->Read(model, 1).status().code(), StatusCode::kInvalidArgument);
  }
  Status st = tier->Write("m", 0, bytes);
  EXPECT_NE(st.message().find("version 0"), std::string::npos) << st.message();
  EXPECT_EQ(tier->Read("m", 0).status().code(), StatusCode::kInvalidArgument);

  st = tier->Write("m", 2, bytes);  // the snapshot says version 1
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("viper.version = 1"), std::string::npos) << st.message();
  st = tier->Write("other", 1, bytes);  // the snapshot says model m
  EXPECT_NE(st.message().find("viper.model = 'm'"), std::string::npos) << st.message();
  std::vector<std::byte> garbage(100, std::byte{0x7f});
  st = tier->Write("m", 1, garbage);
  EXPECT_NE(st.message().find("not a valid snapshot"), std::string::npos) << st.message();

  // A well-formed safetensors buffer without viper.checksum would be refused on restart: refuse it now.
  std::string header = R"({"w":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::vector<std::byte> plain(8 + header.size() + 16, std::byte{1});
  uint64_t n_le = header.size();  // little-endian host
  std::memcpy(plain.data(), &n_le, 8);
  std::memcpy(plain.data() + 8, header.data(), header.size());
  ASSERT_TRUE(Snapshot::Parse(plain, nullptr).ok());
  st = tier->Write("m", 1, plain);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("viper.checksum"), std::string::npos) << st.message();

  ASSERT_TRUE(tier->Write("m", 1, bytes).ok());
  EXPECT_EQ(tier->Write("m", 1, bytes).code(), StatusCode::kAlreadyExists);
  std::vector<std::byte> small(bytes.size() - 1);
  auto n = tier->ReadInto("m", 1, small);
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("destination"), std::string::npos) << n.status().message();
  auto missing = tier->Read("m", 7);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("version 7"), std::string::npos) << missing.status().message();

  FileTierOptions o;
  EXPECT_EQ(FileTier::Open(o).status().code(), StatusCode::kInvalidArgument);
  o.dir = tier->PathFor("m", 1);  // a file, not a directory
  EXPECT_NE(FileTier::Open(o).status().message().find("not a directory"), std::string::npos);
  o.dir = dir.path();
  o.keep_versions = 0;
  EXPECT_EQ(FileTier::Open(o).status().code(), StatusCode::kInvalidArgument);
}

// A version file put in the directory behind the tier's back (an operator restoring a backup) is
// found by a read, verified, and only then indexed.
TEST(FileTier, AFileAddedBehindTheTiersBackIsReadOnceVerified) {
  TempDir dir;
  auto tier = OpenTier(dir.path());
  ASSERT_TRUE(tier);
  auto bytes = MakeSnapshot("m", 1, 1 << 16, 3);
  ASSERT_TRUE(tier->Write("m", 1, bytes).ok());
  auto restored = MakeSnapshot("m", 2, 1 << 16, 4);
  std::ofstream(dir.path() / "m" / "2.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(restored.data()), static_cast<std::streamsize>(restored.size()));
  EXPECT_FALSE(tier->Find("m", 2).has_value()) << "not scanned yet";
  auto snap = tier->Read("m", 2);  // looks on disk
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_TRUE(SameBytes(snap->bytes(), restored));
  EXPECT_TRUE(tier->Find("m", 2).has_value()) << "indexed once verified";
  ASSERT_TRUE(tier->Rescan().ok());
  EXPECT_EQ(Versions(*tier, "m"), (std::vector<uint64_t>{1, 2}));
}

// Two writers on one directory would number versions independently and replace each other's
// files: a second tier on a directory in use is refused, naming the directory and the holder,
// until the first is gone (destroyed, or its process killed).
TEST(FileTier, ASecondInstanceOnTheSameDirectoryIsRefused) {
  TempDir dir;
  {
    auto first = OpenTier(dir.path());
    ASSERT_TRUE(first);
    FileTierOptions o;
    o.dir = dir.path();
    auto second = FileTier::Open(o);
    ASSERT_FALSE(second.ok()) << "two tiers on one directory";
    EXPECT_NE(second.status().message().find(dir.path().string()), std::string::npos) << second.status().message();
    EXPECT_NE(second.status().message().find("pid " + std::to_string(::getpid())), std::string::npos)
        << second.status().message();
  }
  EXPECT_TRUE(OpenTier(dir.path())) << "the lock goes with the tier";

  // Held by another process, which is then killed: the lock goes with it.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    FileTierOptions o;
    o.dir = dir.path();
    auto tier = FileTier::Open(o);
    char c = tier.ok() ? 'y' : 'n';
    (void)::write(ready[1], &c, 1);
    for (;;) ::pause();
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_EQ(c, 'y');
  FileTierOptions o;
  o.dir = dir.path();
  auto refused = FileTier::Open(o);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pid " + std::to_string(child)), std::string::npos)
      << refused.status().message();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(OpenTier(dir.path())) << "a killed holder's lock is released";
}

// A file that is skipped at start-up (corrupt, or unreadable) keeps its version number: a write
// of that number fails with AlreadyExists and never replaces the file.
TEST(FileTier, ASkippedFileIsNeverReplaced) {
  TempDir dir;
  auto v2 = MakeSnapshot("m", 2, 1 << 16, 2);
  {
    auto tier = OpenTier(dir.path());
    ASSERT_TRUE(tier);
    ASSERT_TRUE(tier->Write("m", 1, MakeSnapshot("m", 1, 1 << 16, 1)).ok());
    ASSERT_TRUE(tier->Write("m", 2, v2).ok());
  }
  const fs::path path = dir.path() / "m" / "2.safetensors";
  FlipByte(path, v2.size() - 10);
  const std::string before = ReadAll(path);
  ::testing::internal::CaptureStderr();
  auto tier = OpenTier(dir.path());
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(tier);
  EXPECT_EQ(Versions(*tier, "m"), std::vector<uint64_t>{1}) << log;
  Status st = tier->Write("m", 2, MakeSnapshot("m", 2, 1 << 16, 7));
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists) << st.ToString();
  EXPECT_NE(st.message().find(path.string()), std::string::npos) << st.message();
  EXPECT_TRUE(ReadAll(path) == before) << "the skipped file was replaced";
  EXPECT_FALSE(tier->Find("m", 2).has_value());
  for (const auto& e : fs::directory_iterator(dir.path() / "m")) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
  }
}

TEST(FileTier, ConcurrentWritesOfDifferentVersions) {
  TempDir dir;
  auto tier = OpenTier(dir.path(), /*keep=*/8);
  ASSERT_TRUE(tier);
  std::vector<std::vector<std::byte>> snaps;
  for (uint64_t v = 1; v <= 8; ++v) snaps.push_back(MakeSnapshot("m", v, 1 << 20, v));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (uint64_t v = 1; v <= 8; ++v) {
    threads.emplace_back([&, v] { failures += !tier->Write("m", v, snaps[v - 1]).ok(); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(Versions(*tier, "m").size(), 8u);
  for (uint64_t v = 1; v <= 8; ++v) {
    auto snap = tier->Read("m", v);
    ASSERT_TRUE(snap.ok());
    EXPECT_TRUE(SameBytes(snap->bytes(), snaps[v - 1]));
  }
}

}  // namespace
}  // namespace viper
