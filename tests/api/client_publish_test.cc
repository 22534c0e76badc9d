// A client's PUBLISH (what `viper publish` and a remote sample cache's put use) lands whole at the
// node whatever chunk size the client asks for: the node posts its receives in the asked size
// clamped to [64 KiB, 256 MiB], and the client cuts its bytes by the same rule.
#include <gtest/gtest.h>

#include <vector>

#include "api/client.h"
#include "viper/node.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

TEST(ClientPublish, AnyAskedChunkSizeLandsWhole) {
  auto node = Node::Start(NodeOptions{});
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  // 3 MiB + 5 bytes of tensor: no chunk size divides it.
  std::vector<std::byte> data((3u << 20) + 5);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 131 % 251);
  auto snap = BuildSnapshot({{{"w", DType::kU8, {static_cast<int64_t>(data.size())}}, data}}, {});
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  uint64_t expected = 0;
  // Below the node's minimum (it used to post 64 KiB receives for 16 KiB sends: never completed),
  // the default (0), a size inside the range, and above the maximum.
  for (uint32_t asked : {16u << 10, 0u, 1u << 20, 512u << 20}) {
    ClientOptions co;
    co.connect = (*node)->address();
    co.chunk_bytes = asked;
    co.timeout = std::chrono::seconds(10);
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto version = (*c)->Publish("m", snap->bytes(), 7, 0);
    ASSERT_TRUE(version.ok()) << "chunk_bytes " << asked << ": " << version.status().ToString();
    EXPECT_EQ(*version, ++expected) << "chunk_bytes " << asked;
    auto listed = (*c)->List();
    ASSERT_TRUE(listed.ok()) << listed.status().ToString();
    ASSERT_FALSE(listed->empty());
    EXPECT_EQ(listed->back().version, expected);
    EXPECT_EQ(listed->back().size, snap->bytes().size()) << "chunk_bytes " << asked;
  }
}

}  // namespace
}  // namespace viper
