// A connection whose last owner lets go inside one of the connection's own handlers: a Subscriber's
// handler holds the subscriber, and with it its connections, so a subscriber closed while the
// handler runs leaves the handler the last owner. The connection must close without aborting the
// process (an engine cannot join its own thread) and its threads must end.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <mutex>

#include "api/client.h"
#include "process.h"
#include "viper/node.h"

namespace viper {
namespace {

using testing::WaitUntil;
using namespace std::chrono_literals;

size_t ThreadCount() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

std::unique_ptr<Node> StartNode() {
  auto node = Node::Start(NodeOptions{});
  EXPECT_TRUE(node.ok()) << node.status().ToString();
  return node.ok() ? std::move(node).value() : nullptr;
}

TEST(ClientLifetime, LastOwnerReleasedInsideItsOwnHandler) {
  // Once a node and a connection have come and gone, UCX's process-wide threads exist: the count
  // after that is what the scenario below must return to.
  {
    auto node = StartNode();
    ASSERT_TRUE(node);
    ClientOptions co;
    co.connect = node->address();
    ASSERT_TRUE(Client::Connect(co).ok());
  }
  const size_t baseline = ThreadCount();

  struct Holder {
    std::mutex mu;
    std::unique_ptr<Client> client;
    std::atomic<bool> released{false};
  };
  auto holder = std::make_shared<Holder>();
  ClientHandlers handlers;
  handlers.on_disconnect = [holder](const Status&) {
    std::unique_ptr<Client> last;
    {
      std::lock_guard<std::mutex> lock(holder->mu);
      last = std::move(holder->client);
    }
    last.reset();  // on the connection's own progress thread
    holder->released = true;
  };
  auto node = StartNode();
  ASSERT_TRUE(node);
  ClientOptions co;
  co.connect = node->address();
  auto client = Client::Connect(co, handlers);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  {
    std::lock_guard<std::mutex> lock(holder->mu);
    holder->client = std::move(client).value();
  }
  node.reset();  // the connection is closed by its peer: its disconnect handler drops the last owner
  ASSERT_TRUE(WaitUntil([&] { return holder->released.load(); }, 10s)) << "the disconnect handler never ran";
  EXPECT_TRUE(WaitUntil([&] { return ThreadCount() <= baseline; }, 10s))
      << ThreadCount() << " threads, " << baseline << " before: the connection's engine thread did not end";
}

}  // namespace
}  // namespace viper
