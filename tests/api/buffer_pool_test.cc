// BufferPool (src/api/buffer_pool.h): receive buffers are pre-faulted when mapped, reused after
// their last reader lets go, and KeepSpare() maps the second buffer of double buffering ahead.
// Residency is checked with mincore(), i.e. what the kernel has actually faulted in. VectorPool
// (src/api/vector_pool.h): delta parts' vectors come back with their capacity, within a budget.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <thread>
#include <vector>

#include "buffer_pool.h"
#include "vector_pool.h"

namespace viper::internal {
namespace {

constexpr size_t kSize = 64u << 20;

// Fraction of the pages of [p, p + n) that are resident.
double Resident(const void* p, size_t n) {
  size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((n + page - 1) / page);
  EXPECT_EQ(::mincore(const_cast<void*>(p), n, vec.data()), 0) << std::strerror(errno);
  size_t in = 0;
  for (unsigned char v : vec) in += v & 1;
  return static_cast<double>(in) / static_cast<double>(vec.size());
}

BufferPool::Lease Take(BufferPool& pool, size_t size) {
  auto r = pool.Acquire(size);
  if (!r.ok()) {
    ADD_FAILURE() << r.status().ToString();
    return {};
  }
  return std::move(r).value();
}

TEST(BufferPool, NewBuffersArePrefaultedAndReusedAfterTheLastReader) {
  auto pool = std::make_shared<BufferPool>(3);
  BufferPool::Lease first = Take(*pool, kSize);
  ASSERT_NE(first.data.data(), nullptr);
  EXPECT_EQ(first.data.size(), kSize);
  EXPECT_EQ(Resident(first.data.data(), kSize), 1.0);  // before anything was written to it
  std::byte* address = first.data.data();
  auto reader = first.owner;  // a reader still holds the version
  first = BufferPool::Lease{};
  BufferPool::Lease second = Take(*pool, kSize);
  EXPECT_NE(second.data.data(), address) << "handed out while a reader held it";
  EXPECT_EQ(pool->mapped(), 2u);
  reader.reset();
  BufferPool::Lease third = Take(*pool, kSize - 4096);  // fits the returned one
  EXPECT_EQ(third.data.data(), address);
  EXPECT_EQ(pool->mapped(), 2u);
}

TEST(BufferPool, KeepSpareMapsTheSecondBufferOnceAndNoMore) {
  auto pool = std::make_shared<BufferPool>(3);
  BufferPool::Lease live = Take(*pool, kSize);
  ASSERT_TRUE(pool->KeepSpare(kSize).ok());
  EXPECT_EQ(pool->mapped(), 2u);
  ASSERT_TRUE(pool->KeepSpare(kSize).ok());  // a free one fits: nothing new
  EXPECT_EQ(pool->mapped(), 2u);
  BufferPool::Lease next = Take(*pool, kSize);  // the spare, already resident
  ASSERT_NE(next.data.data(), nullptr);
  EXPECT_NE(next.data.data(), live.data.data());
  EXPECT_EQ(Resident(next.data.data(), kSize), 1.0);
  EXPECT_EQ(pool->mapped(), 2u);
  ASSERT_TRUE(pool->KeepSpare(kSize).ok());  // two made, both leased: double buffering is the limit
  EXPECT_EQ(pool->mapped(), 2u);
}

TEST(BufferPool, KeepsAtMostMaxFreeAndBuffersOutliveThePool) {
  auto pool = std::make_shared<BufferPool>(1);
  BufferPool::Lease a = Take(*pool, 1u << 20);
  BufferPool::Lease b = Take(*pool, 1u << 20);
  EXPECT_EQ(pool->mapped(), 2u);
  a = BufferPool::Lease{};
  b = BufferPool::Lease{};  // the second free one is unmapped
  EXPECT_EQ(pool->mapped(), 1u);
  BufferPool::Lease held = Take(*pool, 1u << 20);
  ASSERT_NE(held.data.data(), nullptr);
  pool.reset();
  std::memset(held.data.data(), 1, held.data.size());  // still mapped; unmapped by its last owner
  held = BufferPool::Lease{};
}

// A version that arrives while the spare is being populated takes the spare at once (no third
// buffer, no wait) and writes into it while the populate goes on: populating keeps its bytes.
TEST(BufferPool, AcquireDuringKeepSpareTakesTheSpareBeingPopulated) {
  auto pool = std::make_shared<BufferPool>(3);
  BufferPool::Lease live = Take(*pool, kSize);
  std::mutex mu;
  std::condition_variable cv;
  bool populating = false, release = false;
  BufferPool::PopulateHookForTesting() = [&](std::span<std::byte>) {
    std::unique_lock<std::mutex> lock(mu);
    populating = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  std::thread spare([&] { EXPECT_TRUE(pool->KeepSpare(kSize).ok()); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return populating; });
  }
  BufferPool::Lease next = Take(*pool, kSize);  // while the spare's populate is held open
  EXPECT_EQ(pool->mapped(), 2u) << "a third buffer was made instead of taking the spare";
  ASSERT_NE(next.data.data(), nullptr);
  std::memset(next.data.data(), 0xab, kSize / 2);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  spare.join();
  BufferPool::PopulateHookForTesting() = nullptr;
  EXPECT_EQ(Resident(next.data.data(), kSize), 1.0);
  for (size_t i = 0; i < kSize / 2; i += 4096) ASSERT_EQ(next.data[i], std::byte{0xab}) << i;
}

// Readers release buffers on their own threads while the subscriber's thread acquires (TSan).
TEST(BufferPool, ConcurrentAcquireAndRelease) {
  auto pool = std::make_shared<BufferPool>(3);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto lease = pool->Acquire((1u << 20) + 4096u * static_cast<unsigned>(t));
        if (!lease.ok()) {
          failed = true;
          return;
        }
        lease->data[0] = std::byte{1};
        if (i % 50 == 0) (void)pool->KeepSpare(1u << 20);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(failed);
  EXPECT_LE(pool->mapped(), 3u + 4u);
}

TEST(VectorPool, AReturnedVectorComesBackWithItsCapacityAndPages) {
  auto pool = std::make_shared<VectorPool>(8u << 20);
  const std::byte* data = nullptr;
  {
    auto v = pool->Acquire(1u << 20);
    ASSERT_GE(v->capacity(), 1u << 20);
    v->resize(1u << 20, std::byte{7});
    data = v->data();
  }
  EXPECT_GE(pool->free_bytes(), 1u << 20);
  auto again = pool->Acquire(1000);
  EXPECT_EQ(again->data(), data);  // the same memory (its pages faulted), not a fresh allocation
  EXPECT_EQ(again->size(), 0u);    // empty: the caller appends or resizes
  EXPECT_GE(again->capacity(), 1u << 20);
  EXPECT_EQ(pool->free_bytes(), 0u);
}

TEST(VectorPool, AcquireTakesTheSmallestFreeVectorThatFits) {
  auto pool = std::make_shared<VectorPool>(64u << 20);
  const std::byte *small = nullptr, *large = nullptr;
  {
    auto a = pool->Acquire(1u << 20);
    auto b = pool->Acquire(4u << 20);
    small = a->data();
    large = b->data();
  }
  auto mid = pool->Acquire(2u << 20);
  EXPECT_EQ(mid->data(), large);
  auto tiny = pool->Acquire(100);
  EXPECT_EQ(tiny->data(), small);
  auto big = pool->Acquire(8u << 20);  // nothing free fits: a new one
  EXPECT_NE(big->data(), small);
  EXPECT_NE(big->data(), large);
  EXPECT_GE(big->capacity(), 8u << 20);
}

TEST(VectorPool, KeepsFreeVectorsWithinItsBudget) {
  auto pool = std::make_shared<VectorPool>(3u << 20);
  {
    std::vector<std::shared_ptr<VectorPool::Bytes>> held;
    for (int i = 0; i < 5; ++i) held.push_back(pool->Acquire(1u << 20));
  }
  EXPECT_LE(pool->free_bytes(), 3u << 20);  // two of five were freed
  EXPECT_GE(pool->free_bytes(), 2u << 20);
  pool->set_budget(1u << 20);
  EXPECT_LE(pool->free_bytes(), 1u << 20);
  pool->set_budget(0);
  EXPECT_EQ(pool->free_bytes(), 0u);
  { auto v = pool->Acquire(4096); }
  EXPECT_EQ(pool->free_bytes(), 0u);  // budget 0: nothing is kept
}

TEST(VectorPool, VectorsOutliveThePool) {
  auto pool = std::make_shared<VectorPool>(8u << 20);
  auto v = pool->Acquire(4096);
  v->push_back(std::byte{1});
  pool.reset();
  EXPECT_EQ(v->size(), 1u);
  v.reset();  // freed, not returned (ASan: no leak, no use after free)
}

TEST(VectorPool, ConcurrentAcquireAndRelease) {
  auto pool = std::make_shared<VectorPool>(4u << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 2000; ++i) {
        auto v = pool->Acquire(static_cast<size_t>(1024 * (1 + (i + t) % 64)));
        v->resize(v->capacity() / 2 + 1, std::byte{static_cast<unsigned char>(t)});
        if (i % 7 == 0) pool->set_budget(static_cast<size_t>((1 + i % 4)) << 20);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(pool->free_bytes(), 4u << 20);
}

}  // namespace
}  // namespace viper::internal
