// The subscriber makes its spare receive buffer off the fetch path (issue 14's loose end: a
// version announced while the loader thread populated the spare waited for it, 4.8 s at 1.7 GB).
// The spare's populate is held open here (BufferPool's test hook); the next version must still go
// live. With the spare made on the loader thread this test times out.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "buffer_pool.h"
#include "viper/publisher.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using namespace std::chrono_literals;

TEST(SubscriberSpare, NextVersionDoesNotWaitForTheSparePopulate) {
  std::mutex mu;
  std::condition_variable cv;
  bool populating = false, release = false;
  internal::BufferPool::PopulateHookForTesting() = [&](std::span<std::byte>) {
    std::unique_lock<std::mutex> lock(mu);
    populating = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  auto open_hook = [&] {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  };
  PublisherOptions po;
  po.model = "m";
  po.mode = PublishMode::kSync;
  auto pub = Publisher::Start(po);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  std::vector<float> w(1 << 20);
  auto publish = [&](float value) {
    std::fill(w.begin(), w.end(), value);
    auto r = (*pub)->Publish({{{"w", DType::kF32, {static_cast<int64_t>(w.size())}}, std::as_bytes(std::span(w))}});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->version : 0;
  };
  publish(1.0f);
  SubscriberOptions so;
  so.model = "m";
  so.connect = (*pub)->address();
  so.path = FetchPath::kCopy;  // into the subscriber's own buffers: the spare is made after each version
  auto sub = Subscriber::Start(so);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_TRUE((*sub)->WaitFor(1, 30s).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return populating; })) << "no spare was made after version 1";
  }
  uint64_t v2 = publish(2.0f);
  auto live = (*sub)->WaitFor(v2, 30s);
  bool reached = live.ok();
  open_hook();
  ASSERT_TRUE(reached) << live.status().ToString() << ": version 2 waited for the spare's populate";
  float first;
  std::memcpy(&first, (*live)->snapshot.tensor_data(*(*live)->snapshot.find("w")).data(), 4);
  EXPECT_EQ(first, 2.0f);
  (*sub)->Close();
  internal::BufferPool::PopulateHookForTesting() = nullptr;
}

}  // namespace
}  // namespace viper
