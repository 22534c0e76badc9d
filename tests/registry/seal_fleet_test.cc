// Version seals (docs/PROTOCOL.md "Version seals"): nodes outside the fleet, one without a token
// and one with another token, registered in the same real redis-server, publish the fleet's model
// at higher versions. A Subscriber with the fleet's token and `viper pull --registry
// --token-file` take only the versions a fleet node sealed, and say which holders they skipped.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "fleet.h"
#include "seal.h"
#include "viper/log.h"
#include "viper/node.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;
using testing::WaitUntil;

constexpr const char* kFleetToken = "fleet-secret-7f3a";

class Seals : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = redis.Start();
    ASSERT_TRUE(why.empty()) << why;
    auto opened = OpenRegistry(redis.url());
    ASSERT_TRUE(opened.ok());
    registry = std::move(opened).value();
  }

  std::unique_ptr<Node> StartNode(const std::string& name, const std::string& token) {
    NodeOptions options;
    options.name = name;
    options.token = token;
    options.segment_prefix = "vseal" + std::to_string(::getpid());
    options.registry = redis.url();
    options.registry_heartbeat = {3000ms, 500ms};
    auto node = Node::Start(options);
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    return node.ok() ? std::move(node).value() : nullptr;
  }

  // Publishes through a client of `node` presenting `token`; the version number, 0 on error.
  uint64_t Publish(const Node& node, const std::string& token, uint64_t seed) {
    ClientOptions co;
    co.connect = node.address();
    co.token = token;
    auto client = Client::Connect(co);
    if (!client.ok()) {
      ADD_FAILURE() << client.status().ToString();
      return 0;
    }
    return testing::PublishWith(**client, "sm", seed);
  }

  size_t Holders(const std::string& model) {
    auto found = registry->Lookup(model);
    return found.ok() ? found->holders.size() : 0;
  }

  testing::RedisServer redis;
  std::unique_ptr<Registry> registry;
  TempDir dir;
};

TEST_F(Seals, FleetConsumersTakeOnlySealedVersions) {
  auto fleet = StartNode("fleet", kFleetToken);
  auto open = StartNode("no-token", "");
  auto other = StartNode("other-token", "another-secret");
  ASSERT_TRUE(fleet && open && other);
  ASSERT_EQ(Publish(*fleet, kFleetToken, 1), 1u);
  for (uint64_t seed = 11; seed <= 13; ++seed) ASSERT_NE(Publish(*open, "", seed), 0u);
  for (uint64_t seed = 21; seed <= 25; ++seed) ASSERT_NE(Publish(*other, "another-secret", seed), 0u);
  ASSERT_EQ(open->Latest("sm")->version, 3u);
  ASSERT_EQ(other->Latest("sm")->version, 5u);  // holds 4 and 5; the open node 2 and 3
  ASSERT_TRUE(WaitUntil([&] { return Holders("sm") >= 3; }, 10s)) << Holders("sm");

  // The seal in the registry record: what a fleet node made verifies, the others do not.
  auto found = registry->Lookup("sm");
  ASSERT_TRUE(found.ok());
  for (const auto& h : found->holders) {
    Status sealed = internal::CheckSeal(kFleetToken, h.info, h.node.address);
    EXPECT_EQ(sealed.ok(), h.node.address == fleet->address()) << h.node.address << ": " << sealed.ToString();
  }

  // A Subscriber with the fleet's token: version 1 from the fleet node, never 3 or 5.
  SubscriberOptions so;
  so.model = "sm";
  so.registry = redis.url();
  so.token = kFleetToken;
  so.request_timeout = 10s;
  ::testing::internal::CaptureStderr();
  auto sub = Subscriber::Start(so);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  auto first = (*sub)->WaitFor(1, 20s);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)->version(), 1u);
  EXPECT_EQ((*first)->info.checksum, fleet->Latest("sm")->checksum);
  ASSERT_EQ(Publish(*fleet, kFleetToken, 2), 2u);
  auto second = (*sub)->WaitFor(2, 20s);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ((*second)->info.checksum, fleet->Latest("sm")->checksum);
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ((*sub)->latest()->version(), 2u);
  sub->reset();
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("from node " + open->address() + " is not sealed"), std::string::npos) << log;
  EXPECT_NE(log.find("from node " + other->address() + " carries a seal that does not verify"), std::string::npos)
      << log;

  // `viper pull --registry` with the fleet's token file takes the fleet's version 2, not 5.
  std::ofstream(dir / "token") << kFleetToken << "\n";
  ::chmod((dir / "token").c_str(), 0600);
  Process pull({testing::ViperBinary(), "pull", "sm", "--registry", redis.url(), "--token-file",
                (dir / "token").string(), "-o", (dir / "out").string()},
               dir / "pull.log");
  ASSERT_EQ(pull.Wait(30s), 0) << pull.log();
  EXPECT_NE(pull.log().find("pulled sm version 2"), std::string::npos) << pull.log();
  EXPECT_NE(pull.log().find("holder skipped: sm version 5 from node " + other->address()), std::string::npos)
      << pull.log();
  auto pulled = Snapshot::OpenFile(dir / "out");
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(pulled->declared_checksum(), fleet->Latest("sm")->checksum);

  // `viper ls --registry` with the token lists what pull would take: the fleet's node only. It
  // ignored --token-file and listed every holder.
  Process ls({testing::ViperBinary(), "ls", "--registry", redis.url(), "--token-file", (dir / "token").string()},
             dir / "ls.log");
  ASSERT_EQ(ls.Wait(30s), 0) << ls.log();
  EXPECT_NE(ls.log().find(fleet->address()), std::string::npos) << ls.log();
  EXPECT_EQ(ls.log().find("  " + other->address()), std::string::npos) << ls.log();  // no row of it
  EXPECT_NE(ls.log().find("holder skipped: sm version 5 from node " + other->address()), std::string::npos)
      << ls.log();

  // Without a fleet secret there is nothing to check: a holder outside the fleet serves (what the
  // seal prevents).
  Process open_pull({testing::ViperBinary(), "pull", "sm", "--version", "3", "--registry", redis.url(), "-o",
                     (dir / "open").string()},
                    dir / "open.log");
  ASSERT_EQ(open_pull.Wait(30s), 0) << open_pull.log();
  EXPECT_NE(open_pull.log().find("pulled sm version 3"), std::string::npos) << open_pull.log();

  // Pulled straight from a node outside the fleet with the fleet's token: refused, not written.
  // The handshake refuses it first (a node without the token cannot prove it belongs to the fleet,
  // docs/PROTOCOL.md "Bootstrap"); the seal check behind it would refuse the unsealed version.
  Process direct({testing::ViperBinary(), "pull", "sm", "--connect", open->address(), "--token-file",
                  (dir / "token").string(), "-o", (dir / "direct").string()},
                 dir / "direct.log");
  EXPECT_NE(direct.Wait(30s), 0) << direct.log();
  EXPECT_TRUE(direct.log().find("cannot prove it belongs to this fleet") != std::string::npos ||
              direct.log().find("is not sealed") != std::string::npos)
      << direct.log();
  EXPECT_FALSE(std::filesystem::exists(dir / "direct"));
}

}  // namespace
}  // namespace viper
