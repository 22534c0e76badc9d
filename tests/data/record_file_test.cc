// Record files: round trips, and one test per fault of the strict reader (the untrusted-input
// contract in include/viper/record_file.h).
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <gtest/gtest.h>

#include "data_test_util.h"
#include "viper/record_file.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using testing::MakeRecordFile;
using testing::ReadFile;
using testing::SampleBytes;
using testing::TempDir;

uint64_t SizeOf(uint64_t i) { return (i * 37) % 200; }  // includes empty records

void Put64(std::vector<std::byte>& b, size_t at, uint64_t v) { std::memcpy(&b[at], &v, 8); }
uint64_t Get64(const std::vector<std::byte>& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, &b[at], 8);
  return v;
}
// Recomputes both checksums after a test patched a field, so that the field's own check fires.
void Restamp(std::vector<std::byte>& b) {
  uint64_t meta = Get64(b, 24);
  if (meta <= b.size()) Put64(b, 48, checksum64(std::span(b).subspan(meta)));
  Put64(b, 56, checksum64(std::span(b).first(56)));
}

class RecordFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() / "samples.vrec";
    MakeRecordFile(path_, 20, SizeOf, 3, std::as_bytes(std::span("meta-blob", 9)));
    bytes_ = ReadFile(path_);
  }
  // The message of parsing `b` (which must fail), from memory and from a file.
  std::string Fault(const std::vector<std::byte>& b, RecordFileOptions o = {}) {
    auto parsed = RecordFile::Parse(b, o, "mem");
    EXPECT_FALSE(parsed.ok());
    if (parsed.ok()) return "";
    EXPECT_EQ(parsed.status().code(), StatusCode::kCorruption) << parsed.status().ToString();
    std::filesystem::path p = dir_.path() / "bad.vrec";
    testing::WriteFile(p, b);
    auto opened = RecordFile::Open(p, o);
    EXPECT_FALSE(opened.ok());
    if (opened.ok()) return "";
    // Same fault from a file, prefixed with its path.
    std::string file_msg = opened.status().message(), mem_msg = parsed.status().message();
    EXPECT_EQ(file_msg, p.string() + mem_msg.substr(3)) << file_msg << " vs " << mem_msg;
    return mem_msg;
  }
  TempDir dir_;
  std::filesystem::path path_;
  std::vector<std::byte> bytes_;
};

TEST_F(RecordFileTest, RoundTrip) {
  auto f = RecordFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->size(), 20u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->metadata().data()), f->metadata().size()), "meta-blob");
  for (uint64_t i = 0; i < f->size(); ++i) {
    EXPECT_EQ(f->entry(i).length, SizeOf(i));
    EXPECT_EQ(f->entry(i).label, static_cast<int64_t>(i % 3));
    std::vector<std::byte> got(SizeOf(i));
    ASSERT_TRUE(f->ReadInto(i, got).ok());
    EXPECT_EQ(got, SampleBytes(i, SizeOf(i))) << "record " << i;
  }
  auto m = RecordFile::Parse(bytes_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<std::byte> got(SizeOf(7));
  ASSERT_TRUE(m->ReadInto(7, got).ok());
  EXPECT_EQ(got, SampleBytes(7, SizeOf(7)));
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(RecordFileTest, EmptyFile) {
  auto p = dir_.path() / "empty.vrec";
  MakeRecordFile(p, 0, SizeOf);
  auto f = RecordFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->size(), 0u);
  EXPECT_EQ(f->file_bytes(), kRecordHeaderBytes);
}

TEST_F(RecordFileTest, FramingFaults) {
  EXPECT_EQ(Fault(std::vector<std::byte>(bytes_.begin(), bytes_.begin() + 10)),
            "mem: file is 10 bytes, shorter than the 64-byte header");
  auto b = bytes_;
  b[0] = std::byte{'X'};
  EXPECT_EQ(Fault(b), "mem: bad magic: not a Viper record file (expected \"VIPERREC\")");
  b = bytes_;
  b[8] = std::byte{2};
  EXPECT_EQ(Fault(b), "mem: format version 2 is not supported (this reader knows 1)");
  b = bytes_;
  b[12] = std::byte{65};
  EXPECT_EQ(Fault(b), "mem: header length 65 is not 64");
  b = bytes_;
  b[16] = std::byte{21};  // count, without restamping
  EXPECT_NE(Fault(b).find("mem: header checksum mismatch: stored"), std::string::npos);
}

TEST_F(RecordFileTest, HeaderFieldFaults) {
  auto b = bytes_;
  EXPECT_EQ(Fault(b, RecordFileOptions{.max_records = 19}),
            "mem: 20 records exceed the limit of 19 (RecordFileOptions.max_records)");
  EXPECT_EQ(Fault(b, RecordFileOptions{.max_metadata_bytes = 8}),
            "mem: metadata of 9 bytes exceeds the limit of 8 (RecordFileOptions.max_metadata_bytes)");
  Put64(b, 24, 8);
  Restamp(b);
  EXPECT_EQ(Fault(b), "mem: metadata offset 8 is outside [64, " + std::to_string(b.size()) + "] (the file's size)");
  b = bytes_;
  Put64(b, 40, Get64(b, 40) + 1);
  Restamp(b);
  EXPECT_NE(Fault(b).find("is not metadata offset"), std::string::npos);
  b = bytes_;
  Put64(b, 16, 1u << 20);  // more records than the file can index
  Restamp(b);
  EXPECT_NE(Fault(b).find("mem: truncated: the index of 1048576 records ends at byte"), std::string::npos);
}

TEST_F(RecordFileTest, TruncatedAndTrailing) {
  auto b = std::vector<std::byte>(bytes_.begin(), bytes_.end() - 5);
  EXPECT_EQ(Fault(b), "mem: truncated: the index of 20 records ends at byte " + std::to_string(bytes_.size()) +
                          " but the file has " + std::to_string(b.size()) + " bytes");
  b = bytes_;
  b.push_back(std::byte{0});
  EXPECT_EQ(Fault(b), "mem: 1 trailing bytes after the index (it ends at byte " + std::to_string(bytes_.size()) +
                          " of " + std::to_string(b.size()) + ")");
}

TEST_F(RecordFileTest, IndexFaults) {
  size_t index = Get64(bytes_, 40);
  auto entry = [&](uint64_t i, int field) { return index + i * kRecordIndexEntryBytes + 8 * field; };
  auto b = bytes_;
  b[entry(3, 1)] ^= std::byte{1};  // not restamped
  EXPECT_NE(Fault(b).find("mem: metadata and index checksum mismatch"), std::string::npos);
  b = bytes_;
  Put64(b, entry(3, 0), Get64(b, entry(3, 0)) + 1);
  Restamp(b);
  EXPECT_NE(Fault(b).find("mem: record 3: offset"), std::string::npos);
  b = bytes_;
  EXPECT_EQ(Fault(b, RecordFileOptions{.max_record_bytes = 100}),
            "mem: record 3: length 111 exceeds the limit of 100 (RecordFileOptions.max_record_bytes)");
  b = bytes_;
  Put64(b, entry(19, 1), Get64(b, entry(19, 1)) + 1000);
  Restamp(b);
  EXPECT_NE(Fault(b).find("mem: record 19: ["), std::string::npos);
  b = bytes_;
  Put64(b, entry(4, 2), static_cast<uint64_t>(-5));
  Restamp(b);
  EXPECT_EQ(Fault(b), "mem: record 4: label -5 is negative (only -1, 'none', is allowed)");
  b = bytes_;
  Put64(b, entry(19, 1), Get64(b, entry(19, 1)) - 1);  // the last record ends a byte early
  Restamp(b);
  EXPECT_NE(Fault(b).find("1 stray bytes"), std::string::npos);
}

TEST_F(RecordFileTest, RecordChecksumNamesTheRecord) {
  auto b = bytes_;
  auto clean = RecordFile::Parse(bytes_);
  ASSERT_TRUE(clean.ok());
  b[clean->entry(5).offset + 2] ^= std::byte{0x40};
  testing::WriteFile(path_, b);
  auto f = RecordFile::Open(path_);
  ASSERT_TRUE(f.ok()) << "the index is intact: " << f.status().ToString();
  std::vector<std::byte> got(SizeOf(5));
  Status st = f->ReadInto(5, got);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find(path_.string() + " record 5: checksum mismatch"), std::string::npos) << st.ToString();
  std::vector<std::byte> other(SizeOf(6));
  EXPECT_TRUE(f->ReadInto(6, other).ok());
}

TEST_F(RecordFileTest, FileCutAfterOpen) {
  auto f = RecordFile::Open(path_);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(::truncate(path_.c_str(), static_cast<off_t>(f->entry(10).offset + 3)), 0);
  std::vector<std::byte> got(SizeOf(12));
  Status st = f->ReadInto(12, got);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("record 12: truncated"), std::string::npos) << st.ToString();
}

TEST_F(RecordFileTest, OpenErrors) {
  auto missing = RecordFile::Open(dir_.path() / "nope.vrec");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  auto dir = RecordFile::Open(dir_.path());
  EXPECT_EQ(dir.status().ToString(), "InvalidArgument: " + dir_.path().string() + ": not a regular file");
  // A FIFO is refused at once (opening one for reading used to wait for a writer forever).
  const auto fifo = dir_.path() / "open-errors-fifo.vrec";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto pipe = RecordFile::Open(fifo);
  EXPECT_EQ(pipe.status().ToString(), "InvalidArgument: " + fifo.string() + ": not a regular file");
}

TEST_F(RecordFileTest, WriterContract) {
  auto p = dir_.path() / "w.vrec";
  {
    auto w = RecordWriter::Create(p);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ((*w)->Append(SampleBytes(0, 4), -2).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE((*w)->Append(SampleBytes(0, 4)).ok());
    // Destroyed without Finish: nothing is left, not even the temporary file.
  }
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_EQ(e.path().filename().string().find("w.vrec"), std::string::npos) << e.path();
  }
  auto w = RecordWriter::Create(p);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ((*w)->Finish().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->Append(SampleBytes(0, 4)).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(RecordFile::Open(p).ok());
}

}  // namespace
}  // namespace viper
