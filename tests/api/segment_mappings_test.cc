// SegmentMappings (src/api/segment_mappings.h): a subscriber keeps its read-only mappings of the
// node's segments between versions, knows a segment by its inode (not its name), lets go of
// segments the node unlinked, and keeps at most max_segments. Real /dev/shm segments.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
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

}  // namespace
}  // namespace viper::internal
