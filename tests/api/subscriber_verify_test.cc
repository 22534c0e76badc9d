// What a subscriber verifies (SubscriberOptions::verify_checksum / verify_local), in one process
// with a real Publisher (embedded node, UCX on loopback, shared memory): bytes on this host are
// trusted by default, and verify_local catches a segment changed after its seal.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "process.h"
#include "viper/publisher.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Publisher> StartSyncPublisher() {
  PublisherOptions options;
  options.model = "m";
  options.mode = PublishMode::kSync;
  options.node.segment_prefix = "viper-verify-test";
  auto pub = Publisher::Start(options);
  EXPECT_TRUE(pub.ok()) << pub.status().ToString();
  return pub.ok() ? std::move(pub).value() : nullptr;
}

std::unique_ptr<Subscriber> StartSubscriber(const Publisher& pub, FetchPath path, bool verify_local) {
  SubscriberOptions options;
  options.model = "m";
  options.connect = pub.address();
  options.path = path;
  options.verify_local = verify_local;
  auto sub = Subscriber::Start(options);
  EXPECT_TRUE(sub.ok()) << sub.status().ToString();
  return sub.ok() ? std::move(sub).value() : nullptr;
}

// Publishes version 1 in place, then flips one byte of the sealed segment (a producer bug the
// checksum exists to catch).
void PublishThenCorrupt(Publisher& pub) {
  auto draft = pub.Begin({{"w", DType::kU8, {4096}}});
  ASSERT_TRUE(draft.ok()) << draft.status().ToString();
  std::span<std::byte> w = draft->tensor("w");
  std::memset(w.data(), 7, w.size());
  auto committed = pub.Commit(std::move(draft).value());
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  w[100] = std::byte{8};
}

class SubscriberVerify : public ::testing::TestWithParam<FetchPath> {};

TEST_P(SubscriberVerify, LocalBytesAreTrustedByDefaultAndCheckedWithVerifyLocal) {
  auto pub = StartSyncPublisher();
  ASSERT_NE(pub, nullptr);
  PublishThenCorrupt(*pub);

  auto strict = StartSubscriber(*pub, GetParam(), /*verify_local=*/true);
  ASSERT_NE(strict, nullptr);
  auto refused = strict->WaitFor(1, 3s);
  EXPECT_EQ(refused.status().code(), StatusCode::kTimeout);
  // The refusal itself may come later than 3 s on a loaded machine: waited for, not sampled.
  EXPECT_TRUE(testing::WaitUntil([&] { return strict->last_error().code() == StatusCode::kCorruption; }, 30s))
      << strict->last_error().ToString();
  EXPECT_NE(strict->last_error().message().find("checksum"), std::string::npos) << strict->last_error().ToString();
  EXPECT_EQ(strict->latest(), nullptr);

  auto trusting = StartSubscriber(*pub, GetParam(), /*verify_local=*/false);
  ASSERT_NE(trusting, nullptr);
  auto loaded = trusting->WaitFor(1, 10s);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->path, GetParam());
  EXPECT_EQ((*loaded)->snapshot.tensor_data((*loaded)->snapshot.tensors()[0])[100], std::byte{8});
}

// Bytes that crossed the network are verified by default, and here the checksum is computed while
// the chunks arrive (Client::FetchSend): a segment changed after its seal must still be caught.
TEST(SubscriberVerifyRemote, TransferredBytesAreVerifiedByDefault) {
  auto pub = StartSyncPublisher();
  ASSERT_NE(pub, nullptr);
  PublishThenCorrupt(*pub);

  auto checking = StartSubscriber(*pub, FetchPath::kRemote, /*verify_local=*/false);
  ASSERT_NE(checking, nullptr);
  EXPECT_EQ(checking->WaitFor(1, 3s).status().code(), StatusCode::kTimeout);
  EXPECT_TRUE(testing::WaitUntil([&] { return checking->last_error().code() == StatusCode::kCorruption; }, 30s))
      << checking->last_error().ToString();

  SubscriberOptions options;
  options.model = "m";
  options.connect = pub->address();
  options.path = FetchPath::kRemote;
  options.verify_checksum = false;
  auto unchecked = Subscriber::Start(options);
  ASSERT_TRUE(unchecked.ok()) << unchecked.status().ToString();
  auto loaded = (*unchecked)->WaitFor(1, 10s);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->snapshot.tensor_data((*loaded)->snapshot.tensors()[0])[100], std::byte{8});
}

// A clean multi-chunk transfer (chunks smaller than the header + data, so the data region starts
// inside the first chunk and spans many) verifies and goes live.
TEST(SubscriberVerifyRemote, ManyChunkTransferVerifies) {
  auto pub = StartSyncPublisher();
  ASSERT_NE(pub, nullptr);
  std::vector<uint8_t> bytes(3 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<TensorData> tensors = {{{"a", DType::kU8, {1000}}, std::as_bytes(std::span(bytes).first(1000))},
                                     {{"b", DType::kU8, {static_cast<int64_t>(bytes.size() - 1000)}},
                                      std::as_bytes(std::span(bytes).subspan(1000))}};
  ASSERT_TRUE(pub->Publish(tensors).ok());
  SubscriberOptions options;
  options.model = "m";
  options.connect = pub->address();
  options.path = FetchPath::kRemote;
  options.chunk_bytes = 64 << 10;
  auto sub = Subscriber::Start(options);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  auto loaded = (*sub)->WaitFor(1, 10s);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString() << " " << (*sub)->last_error().ToString();
  EXPECT_EQ((*loaded)->path, FetchPath::kRemote);
  EXPECT_EQ((*loaded)->snapshot.compute_checksum(), (*loaded)->info.checksum);
}

INSTANTIATE_TEST_SUITE_P(SameHostPaths, SubscriberVerify, ::testing::Values(FetchPath::kMap, FetchPath::kCopy),
                         [](const auto& info) { return std::string(fetch_path_name(info.param)); });

}  // namespace
}  // namespace viper
