// The churn test: a producer publishes version after version while 8 readers in 4 processes read
// the live version as fast as they can, each read checked by the reader itself: every byte of a
// version follows from its number (tests/fault/content.h with --nonce version), and the xxh3 of
// the data region is recomputed and compared with the header's seal. docs/RELIABILITY.md records
// the figures.
//
//   VIPER_CHURN_VERSIONS=N  versions every reader must see (default 200)
//   VIPER_CHURN_READS=R     reads in total across the readers (default 100000)
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/process.h"
#include "fault/cluster.h"

namespace viper::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string FaultPeer() { return std::string(VIPER_BINARY_DIR) + "/bin/viper_fault_peer"; }

size_t CountLines(const fs::path& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

size_t SegmentsWithPrefix(const std::string& prefix) {
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator("/dev/shm")) n += entry.path().filename().string().starts_with(prefix);
  return n;
}

TEST(Churn, ReadersInSeveralProcessesNeverSeeATornVersion) {
  const uint64_t versions = EnvOr("VIPER_CHURN_VERSIONS", 200), total_reads = EnvOr("VIPER_CHURN_READS", 100000);
  // Two threads in each process; the fetch paths a consumer on the producer's host can take.
  const std::vector<std::string> paths = {"map", "map", "copy", "remote"};
  const uint64_t threads = 2, readers = paths.size() * threads;
  const uint64_t reads_per_reader = (total_reads + readers - 1) / readers;
  TempDir dir;
  const std::string prefix = "vchurn" + std::to_string(::getpid());
  // Publishes until the test stops it (after every reader is done): every read happens while
  // versions keep coming. Small versions (16-128 KiB) so reads are many.
  Process producer({FaultPeer(), "produce", "--model", "cm", "--listen", "127.0.0.1:0", "--segment-prefix", prefix,
                    "--interval-ms", "20", "--min-bytes", "16384", "--max-bytes", "131072", "--nonce", "version",
                    "--address-file", (dir / "addr").string(), "--log", (dir / "published").string()},
                   dir / "producer.log");
  std::string addr = WaitForFile(dir / "addr", 60s);
  ASSERT_FALSE(addr.empty()) << producer.log();
  std::vector<std::unique_ptr<Process>> consumers;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::string name = "consumer" + std::to_string(i) + "-" + paths[i];
    consumers.push_back(std::make_unique<Process>(
        std::vector<std::string>{FaultPeer(), "consume", "--model", "cm", "--connect", addr, "--path", paths[i],
                                 "--threads", std::to_string(threads), "--until", std::to_string(versions),
                                 "--min-reads", std::to_string(reads_per_reader), "--nonce", "version", "--timeout-s",
                                 "600", "--status", (dir / (name + ".status")).string()},
        dir / (name + ".log")));
  }
  uint64_t reads = 0, errors = 0, regressions = 0, fewest_versions = UINT64_MAX;
  for (size_t i = 0; i < consumers.size(); ++i) {
    std::string name = "consumer" + std::to_string(i) + "-" + paths[i];
    ASSERT_EQ(consumers[i]->Wait(660s), 0) << name << ": " << consumers[i]->log() << "\nproducer: " << producer.log();
    auto status = nlohmann::json::parse(ReadFile(dir / (name + ".status")), nullptr, false);
    ASSERT_FALSE(status.is_discarded()) << name << " left no status";
    EXPECT_EQ(status.value("errors", 1), 0) << name << ": " << status.value("first_error", "");
    EXPECT_EQ(status.value("regressions", 1), 0) << name << " went back to an older version";
    EXPECT_GE(status.value("newest_read", 0ull), versions) << name;
    reads += status.value("reads", 0ull);
    errors += status.value("errors", 0ull);
    regressions += status.value("regressions", 0ull);
    fewest_versions = std::min<uint64_t>(fewest_versions, status.value("fewest_versions_per_reader", 0ull));
  }
  const size_t published = CountLines(dir / "published");  // still publishing: every read above was under churn
  ::kill(producer.pid(), SIGTERM);
  ASSERT_EQ(producer.Wait(60s), 0) << producer.log();
  EXPECT_GE(published, versions);
  EXPECT_GE(reads, total_reads);
  // Each reader saw the version change under it, not one version read over and over. How many it
  // saw depends on the machine: a subscriber whose fetches the busy readers slow down skips to the
  // newest version (7 to 44 of 200+ for the slowest reader on a loaded 2-core machine).
  EXPECT_GE(fewest_versions, 2u) << "a reader saw too few versions to count as reading under churn";
  EXPECT_EQ(SegmentsWithPrefix(prefix), 0u) << "segments left after the producer's clean stop";
  std::printf("churn: %zu versions published while %llu readers in %zu processes (map, map, copy, remote) read "
              "%llu times, each read checked byte by byte and by its checksum; torn %llu, regressions %llu; every "
              "reader read >= %llu distinct versions; segments left 0\n",
              published, static_cast<unsigned long long>(readers), paths.size(), static_cast<unsigned long long>(reads),
              static_cast<unsigned long long>(errors), static_cast<unsigned long long>(regressions),
              static_cast<unsigned long long>(fewest_versions));
}

}  // namespace
}  // namespace viper::testing
