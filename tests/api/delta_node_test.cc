// Delta transfers end to end: a node in this process (embedded in a Publisher), consumers in
// another process (tests/api/delta_peer.cc) over real UCX, every version checked bit for bit
// against the model both sides compute (tests/api/delta_model.h: every dtype, NaN payloads,
// signed zeros, tensors that appear, disappear, change shape and size, changing metadata). The
// node is set to always send deltas (DeltaMode::kAlways) so that what is tested does not depend
// on the timing prediction, which the benchmark measures (docs/BENCHMARKS.md).
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <mutex>

#include <nlohmann/json.hpp>

#include "api/client.h"
#include "delta_model.h"
#include "api/test_hooks.h"
#include "process.h"
#include "viper/publisher.h"

namespace viper {
namespace {

using testing::Process;
using testing::ReadFile;
using testing::TempDir;
using testing::WaitUntil;
using namespace std::chrono_literals;

std::string DeltaPeerBinary() { return std::string(VIPER_BINARY_DIR) + "/bin/viper_delta_peer"; }

std::unique_ptr<Publisher> StartPublisher(size_t bases, std::function<void(const DeltaPartEvent&)> hook = {}) {
  PublisherOptions options;
  options.model = "m";
  options.mode = PublishMode::kSync;
  options.node.delta = DeltaMode::kAlways;
  options.node.delta_bases = bases;
  if (hook) {
    auto hooks = std::make_shared<NodeTestHooks>();
    hooks->delta_part = std::move(hook);
    options.node.test_hooks = std::move(hooks);
  }
  auto pub = Publisher::Start(options);
  EXPECT_TRUE(pub.ok()) << pub.status().ToString();
  return pub.ok() ? std::move(pub).value() : nullptr;
}

// Publishes version v of the test model (the publisher numbers versions 1, 2, ...).
void PublishVersion(Publisher& pub, uint64_t v) {
  auto tensors = testing::DeltaModel(v);
  std::vector<TensorData> data;
  for (const auto& t : tensors) data.push_back({{t.name, t.dtype, t.shape}, t.bytes});
  PublishInfo info;
  info.step = v;
  info.metadata = testing::DeltaModelMetadata(v);
  auto r = pub.Publish(data, info);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->version, v);
}

uint64_t Progress(const TempDir& dir) {
  std::string text = ReadFile(dir / "progress");
  return text.empty() ? 0 : std::stoull(text);
}

nlohmann::json Update(const nlohmann::json& result, uint64_t version) {
  for (const auto& u : result["updates"])
    if (u["version"] == version) return u;
  return nlohmann::json::object();
}

struct Consumer {
  TempDir& dir;
  Process process;
  Consumer(TempDir& d, const std::string& address, uint64_t until)
      : dir(d),
        process({DeltaPeerBinary(), "consume", "--model", "m", "--connect", address, "--until", std::to_string(until),
                 "--result", (d / "result.json").string(), "--progress", (d / "progress").string()},
                d / "consumer.log") {}
  bool WaitLive(uint64_t v) { return WaitUntil([&] { return Progress(dir) >= v; }, 60s); }
  nlohmann::json Finish() {
    EXPECT_EQ(process.Wait(60s), 0) << process.log();
    std::string text = ReadFile(dir / "result.json");
    return text.empty() ? nlohmann::json::object() : nlohmann::json::parse(text);
  }
};

// Versions 2..6 each arrive as a delta against the one before, bit for bit, and far smaller.
TEST(DeltaTransfer, EveryDtypeRoundTripsBitExactAcrossProcesses) {
  TempDir dir;
  auto pub = StartPublisher(1);
  ASSERT_TRUE(pub);
  PublishVersion(*pub, 1);
  Consumer consumer(dir, pub->address(), 6);
  ASSERT_TRUE(consumer.WaitLive(1)) << consumer.process.log();
  for (uint64_t v = 2; v <= 6; ++v) {
    PublishVersion(*pub, v);
    ASSERT_TRUE(consumer.WaitLive(v)) << "version " << v << "\n" << consumer.process.log();
  }
  auto result = consumer.Finish();
  SCOPED_TRACE(result.dump(1));
  ASSERT_EQ(result["updates"].size(), 6u);
  for (const auto& u : result["updates"]) EXPECT_EQ(u["error"], "") << u["version"];
  for (uint64_t v = 2; v <= 6; ++v) {
    auto u = Update(result, v);
    EXPECT_EQ(u["delta_base"], v - 1) << u["reason"];
    EXPECT_LT(u["wire_bytes"].get<uint64_t>(), u["bytes"].get<uint64_t>() / 5) << "version " << v;
    EXPECT_NE(u["reason"].get<std::string>().find("delta against version " + std::to_string(v - 1)), std::string::npos);
  }
  EXPECT_EQ(result["delta_fallbacks"], 0);
  EXPECT_GE(pub->node().stats().delta.sent, 5u);
}

// The node evicts the base while it is still encoding the delta a consumer is receiving: the
// stream ends with an ERROR, after the NOTIFY of the version whose commit evicted the base. The
// consumer skips the version it was receiving (no fetch of it in full: the newer one replaces it),
// loads the newer one (in full: its base is gone), and the next comes as a delta again; nothing
// partial or wrong goes live.
TEST(DeltaTransfer, BaseEvictedMidTransferSkipsToTheVersionThatEvictedIt) {
  TempDir dir;
  std::mutex mu;
  std::condition_variable cv;
  bool in_hook = false, release = false;
  auto pub = StartPublisher(1, [&](const DeltaPartEvent& e) {
    if (e.base != 1 || e.target != 2 || e.index != 1) return;  // part 0 is out, part 1 waits
    std::unique_lock<std::mutex> lock(mu);
    in_hook = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  ASSERT_TRUE(pub);
  PublishVersion(*pub, 1);
  Consumer consumer(dir, pub->address(), 4);
  ASSERT_TRUE(consumer.WaitLive(1)) << consumer.process.log();
  PublishVersion(*pub, 2);  // the delta 1 -> 2 is encoded at once and stops in the hook at part 1
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 60s, [&] { return in_hook; }));
  }
  // The consumer's FETCH of 2 is being answered with that delta...
  ASSERT_TRUE(WaitUntil([&] { return pub->node().stats().delta.sent >= 1; }, 60s)) << consumer.process.log();
  const uint64_t sent_before = pub->node().stats().bytes_sent;
  PublishVersion(*pub, 3);  // ...when version 3 evicts base 1 (delta_bases 1)
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  ASSERT_TRUE(consumer.WaitLive(3)) << consumer.process.log();
  const uint64_t sent_for_3 = pub->node().stats().bytes_sent - sent_before;
  // The stopped encode is counted when its worker leaves the hook, and the eager 2 -> 3 encode is
  // queued behind it: both settle before version 4 (else its commit would stop 2 -> 3 as well).
  ASSERT_TRUE(WaitUntil([&] {
    DeltaStats d = pub->node().stats().delta;
    return d.cancelled == 1 && d.encoded >= 1;
  }, 30s));
  PublishVersion(*pub, 4);
  ASSERT_TRUE(consumer.WaitLive(4)) << consumer.process.log();
  auto result = consumer.Finish();
  SCOPED_TRACE(result.dump(1));
  for (const auto& u : result["updates"]) EXPECT_EQ(u["error"], "") << u["version"];
  EXPECT_TRUE(Update(result, 2).empty()) << "version 2 went live after version 3 was announced";
  auto v3 = Update(result, 3);
  ASSERT_FALSE(v3.empty());
  EXPECT_EQ(v3["delta_base"], 0) << v3["reason"];
  // One full copy of version 3 went out, not version 2 in full as well.
  EXPECT_LT(sent_for_3, 2 * v3["bytes"].get<uint64_t>());
  EXPECT_EQ(Update(result, 4)["delta_base"], 3);
  EXPECT_EQ(result["skipped"], 1);
  EXPECT_EQ(result["fetch_failures"], 0);
  EXPECT_EQ(result["delta_fallbacks"], 0);
  EXPECT_EQ(pub->node().stats().delta.cancelled, 1u);
}

// Corrupted delta bytes: a flipped last byte (a wrong value or a bad payload) and a flipped magic
// (a bad stream). Neither version goes live from its delta: each is fetched in full.
TEST(DeltaTransfer, CorruptedDeltaBytesNeverGoLive) {
  TempDir dir;
  auto pub = StartPublisher(1, [](const DeltaPartEvent& e) {
    if (e.target == 2 && e.index == 0) e.bytes->back() ^= std::byte{0x5a};  // a flip inside part 0
    if (e.target == 3 && e.index == 0) (*e.bytes)[0] ^= std::byte{0x01};    // the magic
  });
  ASSERT_TRUE(pub);
  PublishVersion(*pub, 1);
  Consumer consumer(dir, pub->address(), 4);
  ASSERT_TRUE(consumer.WaitLive(1)) << consumer.process.log();
  for (uint64_t v = 2; v <= 4; ++v) {
    PublishVersion(*pub, v);
    ASSERT_TRUE(consumer.WaitLive(v)) << consumer.process.log();
  }
  auto result = consumer.Finish();
  SCOPED_TRACE(result.dump(1));
  for (const auto& u : result["updates"]) EXPECT_EQ(u["error"], "") << u["version"];
  for (uint64_t v : {2, 3}) {
    auto u = Update(result, v);
    EXPECT_EQ(u["delta_base"], 0) << v;
    EXPECT_NE(u["reason"].get<std::string>().find("full after the delta failed"), std::string::npos) << v;
  }
  EXPECT_NE(Update(result, 2)["reason"].get<std::string>().find("checksum"), std::string::npos);  // decoded, but wrong
  EXPECT_NE(Update(result, 3)["reason"].get<std::string>().find("bad magic"), std::string::npos);
  EXPECT_EQ(Update(result, 4)["delta_base"], 3);  // an intact delta is used again
  EXPECT_EQ(result["delta_fallbacks"], 2);
}

// The protocol level, from a client in this process: a base the node no longer keeps, or keeps
// with another checksum, gets the full snapshot and says why; a kept base gets a delta.
TEST(DeltaTransfer, ConsumerWhoseBaseIsGoneGetsTheFullSnapshot) {
  auto pub = StartPublisher(1);
  ASSERT_TRUE(pub);
  ClientOptions co;
  co.connect = pub->address();
  auto client = Client::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  struct Held {
    std::vector<std::byte> bytes;
    proto::FetchOk ok;
  };
  auto fetch_full = [&](uint64_t v) {
    Held h;
    auto ok = (*client)->FetchSend("m", v, [&](const proto::VersionInfo& info) -> Result<std::span<std::byte>> {
      h.bytes.resize(info.size);
      return std::span<std::byte>(h.bytes);
    });
    EXPECT_TRUE(ok.ok()) << ok.status().ToString();
    if (ok.ok()) h.ok = *ok;
    return h;
  };
  auto fetch_with_base = [&](uint64_t v, const Held& base, uint64_t checksum, std::vector<std::byte>* out) {
    return (*client)->FetchSendWithBase(
        "m", v, DeltaBase{base.ok.info.version, checksum, base.bytes},
        [&](const proto::VersionInfo& info) -> Result<std::span<std::byte>> {
          out->assign(info.size, std::byte{0});
          return std::span<std::byte>(*out);
        });
  };
  auto check = [](const std::vector<std::byte>& bytes, uint64_t v) {
    auto snap = Snapshot::Parse(bytes, nullptr);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    EXPECT_EQ(testing::CompareWithDeltaModel(*snap, v), "");
  };
  PublishVersion(*pub, 1);
  Held v1 = fetch_full(1);
  PublishVersion(*pub, 2);
  PublishVersion(*pub, 3);  // the node keeps bases 2 and 3 now
  Held v2 = fetch_full(2);
  std::vector<std::byte> out;

  auto gone = fetch_with_base(3, v1, v1.ok.info.checksum, &out);
  ASSERT_TRUE(gone.ok()) << gone.status().ToString();
  EXPECT_EQ(gone->ok.encoding, proto::Encoding::kFull);
  EXPECT_NE(gone->ok.detail.find("base version 1 is not among the bases kept here"), std::string::npos) << gone->ok.detail;
  EXPECT_EQ(gone->wire_bytes, gone->ok.info.size);
  check(out, 3);

  auto other = fetch_with_base(3, v2, v2.ok.info.checksum ^ 1, &out);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(other->ok.encoding, proto::Encoding::kFull);
  EXPECT_NE(other->ok.detail.find("differs"), std::string::npos) << other->ok.detail;
  check(out, 3);

  auto kept = fetch_with_base(3, v2, v2.ok.info.checksum, &out);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->ok.encoding, proto::Encoding::kDelta);
  EXPECT_EQ(kept->ok.base_version, 2u);
  EXPECT_LT(kept->wire_bytes, kept->ok.info.size / 5);
  ASSERT_TRUE(kept->data_checksum.has_value());
  EXPECT_EQ(*kept->data_checksum, kept->ok.info.checksum);
  check(out, 3);
  EXPECT_EQ(pub->node().stats().delta.declined, 2u);
}

}  // namespace
}  // namespace viper
