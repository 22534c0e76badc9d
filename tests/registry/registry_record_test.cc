// The registry record codec: round trip, and one clear message per kind of malformed record.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "registry_internal.h"
#include "registry_test_util.h"

namespace viper {
namespace {

using testing::MakeRecord;
using json = nlohmann::json;

TEST(RegistryRecord, RoundTrips) {
  HolderRecord r = MakeRecord("nt3", 42, 1);
  r.info.replicas.push_back({proto::ReplicaKind::kRelay, "", "[::1]:7301"});
  auto parsed = ParseHolderRecord(EncodeHolderRecord(r));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, r);
}

TEST(RegistryRecord, NodeIdIsStablePerHostAndAddress) {
  auto a = NodeRecordFor("x", "127.0.0.1:7300", "host", 1);
  auto b = NodeRecordFor("y", "127.0.0.1:7300", "host", 2);
  auto c = NodeRecordFor("x", "127.0.0.1:7301", "host", 1);
  auto d = NodeRecordFor("x", "127.0.0.1:7300", "other-host", 1);
  EXPECT_EQ(a.id, b.id);
  EXPECT_NE(a.id, c.id);
  EXPECT_NE(a.id, d.id);
  EXPECT_EQ(a.id.size(), 16u);
}

// Each case edits a valid record's JSON; the message must name the fault.
struct Case {
  const char* name;
  std::function<void(json&)> edit;
  const char* expect;
};

TEST(RegistryRecord, MalformedRecordsNameTheirFault) {
  const std::vector<Case> cases = {
      {"unknown field", [](json& j) { j["extra"] = 1; }, "record: unknown field \"extra\""},
      {"missing field", [](json& j) { j.erase("size"); }, "record.size is missing"},
      {"negative version", [](json& j) { j["version"] = -1; }, "record.version is number -1, not an unsigned integer"},
      {"version 0", [](json& j) { j["version"] = 0; }, "record.version = 0 is outside 1.."},
      {"float size", [](json& j) { j["size"] = 1.5; }, "record.size is number 1.5"},
      {"huge size", [](json& j) { j["size"] = 1ull << 50; }, "record.size = 1125899906842624 is outside"},
      {"bad model", [](json& j) { j["model"] = "../etc"; }, "model: model name '../etc'"},
      {"model with colon", [](json& j) { j["model"] = "a:b"; }, "contains ':'"},
      {"checksum", [](json& j) { j["checksum"] = "xyz"; }, "checksum \"xyz\""},
      {"node id", [](json& j) { j["node"]["id"] = "ABCDEF0123456789"; }, "is not 16 lowercase hex digits"},
      {"node address", [](json& j) { j["node"]["address"] = "no-port"; }, "node.address: address 'no-port': missing ':PORT'"},
      {"node pid", [](json& j) { j["node"]["pid"] = 0; }, "node.pid = 0 is outside"},
      {"control byte", [](json& j) { j["node"]["name"] = "a\x1b[31m"; }, "node.name contains control byte 0x1b"},
      {"replica kind", [](json& j) { j["replicas"][0]["kind"] = "disk"; }, "replicas[0].kind \"disk\" is not one of"},
      {"segment name", [](json& j) { j["replicas"][0]["locator"] = "../x"; }, "is not a shared-memory segment name"},
      {"file path", [](json& j) { j["replicas"][2]["locator"] = "/a/../../etc/passwd"; }, "not an absolute path without '..'"},
      {"relative file", [](json& j) { j["replicas"][2]["locator"] = "x.safetensors"; }, "not an absolute path"},
      {"no replicas", [](json& j) { j["replicas"] = json::array(); }, "replicas is empty"},
      {"not itself", [](json& j) { j["replicas"].erase(1); }, "do not list the holder's own node"},
      {"metadata value", [](json& j) { j["metadata"]["k"] = 3; }, "metadata[\"k\"] is number 3, not a string"},
      {"deep", [](json& j) { j["metadata"]["k"] = json::array({json::array({json::array()})}); }, "nests deeper than"},
      {"not object", [](json& j) { j = json::array(); }, "record is array, not an object"},
  };
  const std::string valid = EncodeHolderRecord(MakeRecord("nt3", 42, 1));
  for (const auto& c : cases) {
    json j = json::parse(valid);
    c.edit(j);
    auto parsed = ParseHolderRecord(j.dump());
    ASSERT_FALSE(parsed.ok()) << c.name;
    EXPECT_EQ(parsed.status().code(), StatusCode::kCorruption) << c.name;
    EXPECT_NE(parsed.status().message().find(c.expect), std::string::npos)
        << c.name << ": " << parsed.status().message();
    EXPECT_TRUE(parsed.status().message().starts_with("registry record: ")) << parsed.status().message();
  }
}

TEST(RegistryRecord, DuplicateKeysAndBadJsonAreRefused) {
  auto dup = ParseHolderRecord(R"({"format":1,"format":1})");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("duplicate key \"format\""), std::string::npos) << dup.status().message();
  auto truncated = ParseHolderRecord(EncodeHolderRecord(MakeRecord("m", 1, 1)).substr(0, 50));
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("not valid JSON"), std::string::npos);
  std::string deep(100000, '[');
  auto nested = ParseHolderRecord(deep);
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("nests deeper"), std::string::npos) << nested.status().message();
}

TEST(RegistryUrl, ParsesAndNamesFaults) {
  using registry_internal::ParseRedisUrl;
  auto ok = ParseRedisUrl("redis://10.0.0.5:6380/3");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->host, "10.0.0.5");
  EXPECT_EQ(ok->port, 6380);
  EXPECT_EQ(ok->db, 3);
  auto bare = ParseRedisUrl("redis://localhost");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->port, 6379);
  EXPECT_EQ(bare->db, 0);
  auto v6 = ParseRedisUrl("redis://[::1]:7000");
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ(v6->host, "::1");
  for (auto [url, expect] : std::vector<std::pair<std::string, std::string>>{
           {"http://x:1", "not a redis:// URL"},
           {"redis://x:1/db", "is not a number"},
           {"redis://x:99999", "larger than 65535"},
           {"redis://:pw@x:1", "credentials"},
           {"redis://x:0", "port 0"},
       }) {
    auto bad = ParseRedisUrl(url);
    ASSERT_FALSE(bad.ok()) << url;
    EXPECT_NE(bad.status().message().find(expect), std::string::npos) << url << ": " << bad.status().message();
  }
  auto none = OpenRegistry("zookeeper://x");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("names no backend"), std::string::npos);
}

}  // namespace
}  // namespace viper
