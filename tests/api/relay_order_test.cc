// Nodes start in any order, and a chain keeps the shape it was given: real `viper serve` processes
// on loopback, relays fetching over UCX (--upstream-remote) so that the producer's egress
// (bytes_sent in its STATS) shows how many copies of each version it sends.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/client.h"
#include "api/pattern.h"
#include "process.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using testing::Process;
using testing::Settled;
using testing::TempDir;
using testing::WaitUntil;
using namespace std::chrono_literals;

constexpr size_t kModelBytes = 4 << 20;

// `viper serve` on a fixed loopback address, optionally relaying "m" from `upstream`.
class Serve {
 public:
  Serve(const TempDir& dir, std::string name, std::string address, std::string upstream = "",
        std::string alternate = "", std::vector<std::string> extra = {})
      : dir_(dir), name_(std::move(name)), address_(std::move(address)), upstream_(std::move(upstream)),
        alternate_(std::move(alternate)), extra_(std::move(extra)) {
    Launch();
  }
  // kill -9 and start again on the same address (retrying while the port is busy).
  bool Restart() {
    process_->Kill(SIGKILL);
    for (int attempt = 0; attempt < 40; ++attempt) {
      if (Launch()) return true;
      std::this_thread::sleep_for(250ms);
    }
    return false;
  }
  void Kill() { process_->Kill(SIGKILL); }
  void Signal(int sig) { ::kill(process_->pid(), sig); }  // e.g. SIGSTOP: alive, connected, silent
  const std::string& address() const { return address_; }
  std::string log() const { return process_->log(); }

 private:
  bool Launch() {
    auto addr_file = dir_ / (name_ + ".addr");
    std::filesystem::remove(addr_file);
    std::vector<std::string> argv = {testing::ViperBinary(), "serve", "--listen", address_, "--name", name_,
                                     "--delta", "off", "--address-file", addr_file.string()};
    if (!upstream_.empty())
      argv.insert(argv.end(), {"--upstream", upstream_, "--relay-model", "m", "--upstream-remote"});
    if (!alternate_.empty()) argv.insert(argv.end(), {"--upstream-alternate", alternate_});
    argv.insert(argv.end(), extra_.begin(), extra_.end());
    process_ = std::make_unique<Process>(argv, dir_ / (name_ + ".log"));
    return !testing::WaitForFile(addr_file, 20s).empty();
  }

  const TempDir& dir_;
  std::string name_, address_, upstream_, alternate_;
  std::vector<std::string> extra_;  // more `viper serve` arguments
  std::unique_ptr<Process> process_;
};

std::string Loopback() { return "127.0.0.1:" + std::to_string(testing::PickFreePort()); }

std::unique_ptr<Client> ConnectTo(const std::string& address) {
  ClientOptions co;
  co.connect = address;
  co.name = "order-test";
  auto c = Client::Connect(co);
  return c.ok() ? std::move(c).value() : nullptr;
}

uint64_t Counter(const std::string& address, const std::string& name) {
  auto c = ConnectTo(address);
  if (!c) return UINT64_MAX;
  auto stats = c->Stats();
  if (!stats.ok() || !stats->contains(name)) return UINT64_MAX;
  return stats->at(name);
}

// The producer's egress once it reached `floor` and its last sends have completed (testing::Settled
// says why).
uint64_t SettledBytesSent(const std::string& address, uint64_t floor = 0) {
  return Settled([&] { return Counter(address, "bytes_sent"); }, floor);
}

uint64_t Newest(const std::string& address) {
  auto c = ConnectTo(address);
  if (!c) return 0;
  auto list = c->List();
  uint64_t newest = 0;
  if (list.ok())
    for (const auto& v : *list)
      if (v.model == "m") newest = std::max(newest, v.version);
  return newest;
}

// Publishes one version of "m" through the node at `address`; returns its number (0 on error).
uint64_t Publish(const std::string& address, uint64_t seed) {
  std::vector<std::byte> data(kModelBytes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(testing::Pattern(seed, i % 251));
  auto snap = BuildSnapshot({{{"w", DType::kU8, {static_cast<int64_t>(data.size())}}, data}}, {});
  if (!snap.ok()) return 0;
  auto c = ConnectTo(address);
  if (!c) return 0;
  auto version = c->Publish("m", snap->bytes(), seed, 0);
  return version.ok() ? *version : 0;
}

// Publishes one version and waits until it reaches the chain's end. A subscriber fetches only the
// newest version it is told of, so versions published back to back may skip a relay; one at a time,
// each version crosses each link exactly once and the producer's egress counts copies.
bool PublishAndAwait(const std::string& producer, uint64_t seed, const std::string& chain_end) {
  uint64_t version = Publish(producer, seed);
  return version != 0 && WaitUntil([&] { return Newest(chain_end) == version; }, 30s);
}

int CountLines(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A chain started all at once, relays first: each relay waits for its upstream instead of
// failing or settling on the alternate, and the producer sends each version once.
TEST(RelayOrder, ChainStartedRelaysFirstKeepsItsShape) {
  TempDir dir;
  std::string producer = Loopback(), first = Loopback();
  Serve r2(dir, "r2", Loopback(), first, producer);  // neither its upstream nor its alternate is up
  std::this_thread::sleep_for(500ms);
  Serve r1(dir, "r1", first, producer);
  EXPECT_TRUE(WaitUntil([&] { return Counter(r1.address(), "upstream_connect_failures") >= 1; }, 10s))
      << "waiting is visible in viper stats\n" << r1.log();
  EXPECT_EQ(Counter(r1.address(), "upstream_connected"), 0u) << r1.log();
  Serve p(dir, "p", producer);
  ASSERT_TRUE(WaitUntil([&] { return Counter(r1.address(), "upstream_on_preferred") == 1; }, 20s)) << r1.log();
  ASSERT_TRUE(WaitUntil([&] { return Counter(r2.address(), "upstream_on_preferred") == 1; }, 20s)) << r2.log();
  const int versions = 3;
  for (int i = 1; i <= versions; ++i) ASSERT_TRUE(PublishAndAwait(p.address(), i, r2.address())) << r2.log() << r1.log();
  double copies = static_cast<double>(SettledBytesSent(p.address(), versions * kModelBytes)) / (versions * kModelBytes);
  EXPECT_GT(copies, 0.9);
  EXPECT_LT(copies, 1.2) << "the producer fed more than one relay: the chain became a star";
  EXPECT_EQ(Counter(r2.address(), "upstream_preferred_returns"), 0u) << "r2 never needed its alternate";
  // Logged once per change, not once per attempt.
  EXPECT_EQ(CountLines(r1.log(), "retrying (backoff"), 1) << r1.log();
  EXPECT_EQ(CountLines(r2.log(), "retrying (backoff"), 1) << r2.log();
}

// A producer p, relay r1 from p, relay r2 from r1 with p as its alternate (r2 probes a silent
// upstream after 2 s and waits 2 s for its answer: --upstream-liveness 2).
struct ChainWithAlternate {
  TempDir dir;
  Serve p{dir, "p", Loopback()};
  Serve r1{dir, "r1", Loopback(), p.address()};
  Serve r2{dir, "r2", Loopback(), r1.address(), p.address(), {"--upstream-liveness", "2"}};
  // r2 on its preferred upstream, and a first version through the chain: that version.
  uint64_t FirstVersionThrough() {
    if (!WaitUntil([&] { return Counter(r2.address(), "upstream_on_preferred") == 1; }, 20s)) return 0;
    uint64_t v = Publish(p.address(), 1);
    return v != 0 && WaitUntil([&] { return Newest(r2.address()) == v; }, 30s) ? v : 0;
  }
};

// A relay whose preferred upstream dies moves to its alternate; when the upstream comes back the
// relay returns to it, and the producer's egress goes back to one copy per version.
TEST(RelayOrder, RelayReturnsToItsPreferredUpstream) {
  ChainWithAlternate chain;
  Serve &p = chain.p, &r1 = chain.r1, &r2 = chain.r2;
  ASSERT_NE(chain.FirstVersionThrough(), 0u) << r2.log();
  uint64_t v = 0;

  r1.Kill();
  ASSERT_TRUE(WaitUntil([&] {
    return Counter(r2.address(), "upstream_connected") == 1 && Counter(r2.address(), "upstream_on_preferred") == 0;
  }, 20s)) << "r2 did not move to its alternate\n" << r2.log();
  v = Publish(p.address(), 2);
  ASSERT_TRUE(WaitUntil([&] { return Newest(r2.address()) == v; }, 30s)) << r2.log();

  ASSERT_TRUE(r1.Restart()) << r1.log();
  ASSERT_TRUE(WaitUntil([&] { return Newest(r1.address()) == v; }, 30s)) << r1.log();  // catches up: one copy
  ASSERT_TRUE(WaitUntil([&] { return Counter(r2.address(), "upstream_on_preferred") == 1; }, 20s))
      << "r2 stayed on its alternate\n" << r2.log();
  EXPECT_EQ(Counter(r2.address(), "upstream_preferred_returns"), 1u);

  uint64_t before = SettledBytesSent(p.address());
  const int versions = 3;
  for (int i = 0; i < versions; ++i) ASSERT_TRUE(PublishAndAwait(p.address(), 10 + i, r2.address())) << r2.log();
  double copies = static_cast<double>(SettledBytesSent(p.address(), before + versions * kModelBytes) - before) /
                  (versions * kModelBytes);
  EXPECT_GT(copies, 0.9);
  EXPECT_LT(copies, 1.2) << "the producer still feeds r2 directly";
}

// A relay whose upstream freezes (SIGSTOP: its connections stay open, nothing answers; as a host
// cut off from the network, which sends no FIN either) finds it silent, gives it up and takes the
// next version from its alternate.
TEST(RelayOrder, RelayLeavesAFrozenUpstream) {
  ChainWithAlternate chain;
  Serve &p = chain.p, &r1 = chain.r1, &r2 = chain.r2;
  const uint64_t first = chain.FirstVersionThrough();
  ASSERT_NE(first, 0u) << r2.log();
  // r2 has told r1 it holds the version (REPLICA, after its commit): frozen any earlier, r1 would
  // hold that announcement back instead of the silence under test.
  ASSERT_TRUE(WaitUntil([&] {
    auto c = ConnectTo(r1.address());
    auto list = c ? c->List() : Result<std::vector<proto::VersionInfo>>(Status::Unavailable("r1"));
    if (!list.ok()) return false;
    for (const auto& v : *list)
      for (const auto& r : v.replicas)
        if (v.version == first && r.locator == r2.address()) return true;
    return false;
  }, 20s)) << r2.log();

  r1.Signal(SIGSTOP);
  const auto frozen_at = std::chrono::steady_clock::now();
  uint64_t v = Publish(p.address(), 2);
  // The probe after 2 s of silence, 2 s without an answer, then p (r1 is tried last: a connect to
  // it would wait out the 5 s connect timeout first).
  EXPECT_TRUE(WaitUntil([&] { return Newest(r2.address()) == v; }, 45s)) << r2.log();
  EXPECT_LT(std::chrono::steady_clock::now() - frozen_at, 9s) << "--upstream-liveness 2 (the default 5 s takes 10 s)";
  EXPECT_EQ(Counter(r2.address(), "upstream_liveness_failures"), 1u) << r2.log();
  EXPECT_NE(r2.log().find("did not answer a probe"), std::string::npos) << r2.log();
  EXPECT_EQ(CountLines(r2.log(), "cannot connect to node " + r1.address()), 0) << r2.log();
  // On its alternate, r2 keeps probing the frozen r1 (each connect waits out the 5 s connect
  // timeout) off its loader thread: the next versions come through p as promptly as ever (when
  // the probe ran on the loader, each waited up to 5 s for it: 1.0-3.9 s measured).
  for (uint64_t seed = 3; seed < 6; ++seed) {
    // Idle 1.5, 2.5, 3.5 s first: a probe starts after 1 s on the alternate with nothing to load.
    std::this_thread::sleep_for(1500ms + (seed - 3) * 1000ms);
    uint64_t next = Publish(p.address(), seed);
    ASSERT_NE(next, 0u);
    auto published = std::chrono::steady_clock::now();
    EXPECT_TRUE(WaitUntil([&] { return Newest(r2.address()) == next; }, 30s)) << r2.log();
    EXPECT_LT(std::chrono::steady_clock::now() - published, 2s) << "version " << next << " waited for a probe";
  }
  r1.Signal(SIGCONT);  // thawed, r1 answers the next probe: r2 goes back to it
  EXPECT_TRUE(WaitUntil([&] { return Counter(r2.address(), "upstream_on_preferred") == 1; }, 20s)) << r2.log();
  EXPECT_EQ(Counter(r2.address(), "upstream_preferred_returns"), 1u) << r2.log();
}

}  // namespace
}  // namespace viper
