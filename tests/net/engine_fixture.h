// The fixture of the engine tests: an Engine whose events land in an EventLog, and helper
// processes (viper_net_test_peer) listening on loopback.
#pragma once

#include <gtest/gtest.h>
#include <time.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "net/engine.h"
#include "net/net_test_util.h"

namespace viper::net::testing {

using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

struct Helper {
  ChildProcess process;
  std::string address;
};

class EngineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> StartEngine(EngineOptions options = {}) {
    auto engine = Engine::Start(options, events_.Handlers());
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    return engine.ok() ? std::move(*engine) : nullptr;
  }
  static std::optional<Helper> StartHelper(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {HelperPath(), "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::optional<ChildProcess> child = ChildProcess::Start(argv);
    if (!child) return std::nullopt;
    std::optional<std::string> address = child->WaitFor("LISTEN ", 10s);
    if (!address) return std::nullopt;
    return Helper{std::move(*child), *address};
  }
  // An engine listening on loopback and a helper process connected to it, whose hello has
  // arrived; nullopt (the test failed) if either did not come up.
  struct Accepted {
    std::unique_ptr<Engine> engine;
    ChildProcess child;
    PeerId peer = 0;
  };
  std::optional<Accepted> StartEngineWithHelper(EngineOptions options = {}) {
    options.listen = "127.0.0.1:0";
    auto engine = StartEngine(options);
    if (!engine) return std::nullopt;
    auto child = ChildProcess::Start({HelperPath(), "--connect", engine->listen_address()});
    EXPECT_TRUE(child) << "the helper did not start";
    if (!child) return std::nullopt;
    auto accepted = events_.WaitAccepted(10s);
    EXPECT_TRUE(accepted) << "the helper never connected";
    if (!accepted) return std::nullopt;
    EXPECT_EQ(NextText(), "hello from helper");
    return Accepted{std::move(engine), std::move(*child), accepted->first};
  }
  std::string NextText(Ms timeout = 10s) {
    auto m = events_.NextMessage(timeout);
    return m ? m->text() : "<no message within timeout>";
  }

  EventLog events_;  // declared first: outlives the engines of each test
};

inline double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Waits until everything queued on the progress thread before this call has run.
inline void Drain(Engine& engine) {
  CompletionLatch latch;
  Completion cb = latch.Callback();
  engine.Post([cb] { cb(Status::OK()); });
  ASSERT_TRUE(latch.Wait(10s).has_value());
}

}  // namespace viper::net::testing
