// SegmentMappings (src/api/segment_mappings.h): a subscriber keeps its read-only mappings of the
// node's segments between versions, knows a segment by its inode (not its name), lets go of
// segments the node unlinked, and keeps at most max_segments. Real /dev/shm segments.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "segment_mappings.h"

namespace viper::internal {
namespace {

// A segment /dev/shm/<name> of `size` bytes, every byte `fill`; unlinked by the destructor.
class Segment {
 public:
  Segment(std::string name, size_t size, char fill) : name_(std::move(name)) { Write(size, fill); }
  ~Segment() { ::shm_unlink(("/" + name_).c_str()); }
  const std::string& name() const { return name_; }
  // Replaces the bytes in place (same inode), as a node recycling the segment does.
  void Write(size_t size, char fill) {
    int fd = ::shm_open(("/" + name_).c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    std::vector<char> bytes(size, fill);
    ASSERT_EQ(::pwrite(fd, bytes.data(), size, 0), static_cast<ssize_t>(size));
    ::close(fd);
  }
  void Unlink() { ::shm_unlink(("/" + name_).c_str()); }

 private:
  std::string name_;
};

std::string Name(const char* what) { return "viper-test-mappings." + std::to_string(::getpid()) + "." + what; }

bool All(const MappedSegment& m, char value) {
  for (std::byte b : m.data)
    if (b != std::byte(value)) return false;
  return true;
}

TEST(SegmentMappings, KeepsTheMappingOfASegmentAndSeesItsNewBytes) {
  Segment seg(Name("a"), 1 << 20, 1);
  SegmentMappings mappings;
  auto first = mappings.Map(seg.name(), 1 << 20);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(All(*first, 1));
  seg.Write(1 << 20, 2);  // the node recycles the segment for a newer version
  auto second = mappings.Map(seg.name(), 4096);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->data.data(), first->data.data()) << "the same mapping, not a fresh one";
  EXPECT_EQ(second->data.size(), 4096u);
  EXPECT_TRUE(All(*second, 2));
  EXPECT_EQ(mappings.stats().mapped, 1u);
  EXPECT_EQ(mappings.stats().reused, 1u);
}

TEST(SegmentMappings, AnUnlinkedSegmentIsLetGoAndANewOneOfTheSameNameIsMappedAnew) {
  auto seg = std::make_unique<Segment>(Name("b"), 1 << 16, 3);
  SegmentMappings mappings;
  auto old = mappings.Map(seg->name(), 1 << 16);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  seg->Unlink();
  mappings.Prune();
  EXPECT_EQ(mappings.kept(), 0u);
  EXPECT_TRUE(All(*old, 3)) << "a version that holds the mapping still reads its bytes";
  seg.reset();
  seg = std::make_unique<Segment>(Name("b"), 1 << 16, 4);  // same name, another inode
  auto fresh = mappings.Map(seg->name(), 1 << 16);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(All(*fresh, 4));
  EXPECT_TRUE(All(*old, 3));
  EXPECT_EQ(mappings.stats().mapped, 2u);
  EXPECT_EQ(mappings.stats().reused, 0u);
}

TEST(SegmentMappings, KeepsAtMostMaxSegmentsDroppingTheLeastRecentlyUsed) {
  Segment a(Name("c1"), 4096, 1), b(Name("c2"), 4096, 2), c(Name("c3"), 4096, 3);
  SegmentMappings mappings(2);
  ASSERT_TRUE(mappings.Map(a.name(), 4096).ok());
  ASSERT_TRUE(mappings.Map(b.name(), 4096).ok());
  ASSERT_TRUE(mappings.Map(a.name(), 4096).ok());  // a is now more recent than b
  ASSERT_TRUE(mappings.Map(c.name(), 4096).ok());  // drops b
  EXPECT_EQ(mappings.kept(), 2u);
  ASSERT_TRUE(mappings.Map(a.name(), 4096).ok());
  ASSERT_TRUE(mappings.Map(b.name(), 4096).ok());
  EXPECT_EQ(mappings.stats().mapped, 4u) << "b was mapped again";
  EXPECT_EQ(mappings.stats().reused, 2u);
}

TEST(SegmentMappings, RefusesWhatMapSegmentReadOnlyRefuses) {
  Segment seg(Name("d"), 4096, 1);
  SegmentMappings mappings;
  auto too_big = mappings.Map(seg.name(), 8192);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument) << too_big.status().ToString();
  EXPECT_NE(too_big.status().message().find("smaller than"), std::string::npos) << too_big.status().ToString();
  auto bad_name = mappings.Map("../etc/passwd", 4096);
  ASSERT_FALSE(bad_name.ok());
  EXPECT_EQ(bad_name.status().code(), StatusCode::kInvalidArgument);
  auto missing = mappings.Map(Name("missing"), 4096);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_EQ(mappings.kept(), 0u);
}

// /dev/shm is every user's: what another user put under a segment's name before the consumer
// opened it is refused at once. A FIFO would block a plain read-only open until a writer came
// (this test comes as the writer after 3 s, so an open that waits fails on time instead of
// hanging), and a symbolic link is not followed.
TEST(SegmentMappings, AFifoOrALinkUnderASegmentsNameIsRefusedAtOnce) {
  const std::string fifo = Name("fifo"), link = Name("link"), path = "/dev/shm/" + fifo;
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  Segment target(Name("target"), 4096, 7);
  ASSERT_EQ(::symlink(("/dev/shm/" + target.name()).c_str(), ("/dev/shm/" + link).c_str()), 0) << std::strerror(errno);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread writer([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::seconds(3), [&] { return done; })) return;
    int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // releases an open waiting for a writer
    if (fd >= 0) ::close(fd);
  });
  SegmentMappings mappings;
  const auto start = std::chrono::steady_clock::now();
  auto from_fifo = mappings.Map(fifo, 4096);
  const auto waited = std::chrono::steady_clock::now() - start;
  auto via_link = mappings.Map(link, 4096);
  auto direct = MapSegmentReadOnly(fifo, 4096);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  writer.join();
  ::unlink(path.c_str());
  ::unlink(("/dev/shm/" + link).c_str());
  EXPECT_LT(waited, std::chrono::seconds(2)) << "the open waited for a writer on the FIFO";
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_EQ(from_fifo.status().code(), StatusCode::kInvalidArgument) << from_fifo.status().ToString();
  EXPECT_NE(from_fifo.status().message().find("not a regular file"), std::string::npos) << from_fifo.status().ToString();
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), StatusCode::kInvalidArgument) << direct.status().ToString();
  ASSERT_FALSE(via_link.ok());
  EXPECT_EQ(via_link.status().code(), StatusCode::kInvalidArgument) << via_link.status().ToString();
  EXPECT_NE(via_link.status().message().find("symbolic link"), std::string::npos) << via_link.status().ToString();
  EXPECT_EQ(mappings.kept(), 0u);
  EXPECT_TRUE(mappings.Map(target.name(), 4096).ok()) << "the segment itself maps";
}

}  // namespace
}  // namespace viper::internal
