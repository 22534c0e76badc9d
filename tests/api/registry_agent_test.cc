// RegistryAgent (src/api/registry_agent.h): a node's holdings registered and announced in a shared
// registry, here the embedded one, with a catalog the test controls.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "registry/registry_test_util.h"
#include "registry_agent.h"

namespace viper {
namespace {

using namespace std::chrono_literals;

// What a watcher of the model heard.
struct Heard {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> versions;

  bool WaitFor(uint64_t version, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return std::find(versions.begin(), versions.end(), version) != versions.end(); });
  }
};

// The race the node's commit runs against the agent's thread: the agent reads the catalog, the
// node lists version 2 and calls Announce, and only then does the agent's pass go on. Before the
// fix that pass took the pending announcement after its read, found no version 2 in what it had
// read, and dropped it as no longer held; the next pass registered version 2 but announced nothing,
// and a watcher waited for ever.
TEST(RegistryAgent, AnAnnounceDuringAPassIsNotLost) {
  const std::string model = "agent-race";
  HolderRecord v1 = testing::MakeRecord(model, 1, 1), v2 = testing::MakeRecord(model, 2, 1);
  auto watcher_registry = OpenRegistry("embedded");
  ASSERT_TRUE(watcher_registry.ok());
  Heard heard;
  WatchHandlers handlers;
  handlers.on_announce = [&](const HolderRecord& r) {
    std::lock_guard<std::mutex> lock(heard.mu);
    heard.versions.push_back(r.info.version);
    heard.cv.notify_all();
  };
  auto watch = (*watcher_registry)->Watch(model, std::move(handlers));
  ASSERT_TRUE(watch.ok());

  // The node's catalog. A read can be held after it took its copy, until the test lets it go.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<proto::VersionInfo> catalog = {v1.info};
  bool hold_next_read = false, read_held = false, release = false;
  auto read_catalog = [&] {
    std::unique_lock<std::mutex> lock(mu);
    std::vector<proto::VersionInfo> copy = catalog;
    if (hold_next_read) {
      hold_next_read = false;
      read_held = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    }
    return copy;
  };
  auto registry = OpenRegistry("embedded");
  ASSERT_TRUE(registry.ok());
  auto agent = internal::RegistryAgent::Start(std::move(*registry), v1.node, RegistryHeartbeat{.ttl = 60s, .interval = 20s},
                                              read_catalog);
  agent->Announce(v1.info);
  ASSERT_TRUE(heard.WaitFor(1, 10s)) << "version 1 was not announced";

  {
    std::unique_lock<std::mutex> lock(mu);
    hold_next_read = true;
  }
  agent->CatalogChanged();  // a pass starts and reads the catalog (version 1 only) ...
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return read_held; })) << "the agent did not read the catalog";
    catalog.push_back(v2.info);  // ... the node lists version 2 ...
  }
  agent->Announce(v2.info);  // ... and announces it, while that pass still runs
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  EXPECT_TRUE(heard.WaitFor(2, 10s)) << "version 2 was registered but never announced";
  agent->Stop();
}

}  // namespace
}  // namespace viper
