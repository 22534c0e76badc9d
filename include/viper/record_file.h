// Record files: many small samples (records) in one large file, the second kind of source of the
// data layer (include/viper/prefetch.h) and the format the rehearsal buffer spills to
// (include/viper/rehearsal.h).
//
// Layout (integers little-endian; "xxh3" is xxh3-64, seed 0, as viper::checksum64):
//
//   offset 0   header, 64 bytes
//     0  magic "VIPERREC"
//     8  u32 format version (1)
//    12  u32 header length (64)
//    16  u64 record count N
//    24  u64 metadata offset M (where the metadata blob begins: the end of the records)
//    32  u64 metadata length K
//    40  u64 index offset I (= M + K)
//    48  u64 xxh3 of the tail [M, end of file): metadata blob and index
//    56  u64 xxh3 of header bytes [0, 56)
//   offset 64  the records, back to back in index order (record 0 at 64, each next one where the
//              previous ends, the last ending at M)
//   offset M   the metadata blob (K opaque bytes the writer chose: e.g. the rehearsal state)
//   offset I   the index, N entries of 32 bytes: u64 offset, u64 length, i64 label (-1: none),
//              u64 xxh3 of the record's bytes
//   the file ends at I + 32 * N exactly
//
// The bytes are untrusted input: RecordFile::Open/Parse check every field (framing, header
// checksum, sizes and limits, tail checksum, that the records tile [64, M) exactly) and return
// Corruption with a message naming the file and the fault; ReadInto checks each record's checksum
// and names the record. Fuzzed by fuzz/record_fuzz.cc.
//
// Thread-safety: a RecordFile is immutable after Open; ReadInto may be called from any number of
// threads at once (pread). RecordWriter is not thread-safe.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "viper/status.h"

namespace viper {

class Fd;  // an owned file descriptor (src/core/fd.h, in-tree only)

inline constexpr uint64_t kRecordHeaderBytes = 64;
inline constexpr uint64_t kRecordIndexEntryBytes = 32;
inline constexpr uint32_t kRecordFormatVersion = 1;

struct RecordEntry {
  uint64_t offset = 0;    // of the record's first byte in the file
  uint64_t length = 0;
  int64_t label = -1;     // class label, -1 if none
  uint64_t checksum = 0;  // xxh3 of the record's bytes
};

// Limits a reader applies before it allocates anything the file asks for.
struct RecordFileOptions {
  uint64_t max_records = 1ull << 28;          // index of at most 8 GiB
  uint64_t max_record_bytes = 1ull << 30;     // one record at most 1 GiB
  uint64_t max_metadata_bytes = 64ull << 20;  // metadata blob at most 64 MiB
};

class RecordFile {
 public:
  // Reads and validates the header, metadata and index of `path` (the records are read later,
  // by ReadInto). NotFound/IOError for a file that cannot be opened, Corruption for bad bytes;
  // every message begins with the path.
  static Result<RecordFile> Open(const std::filesystem::path& path, const RecordFileOptions& options = {});
  // The same checks over an in-memory file. The RecordFile keeps a view of `bytes`, so `bytes`
  // must outlive it. Messages begin with `name`.
  static Result<RecordFile> Parse(std::span<const std::byte> bytes, const RecordFileOptions& options = {},
                                  std::string name = "record file");

  uint64_t size() const { return entries_->size(); }  // number of records
  // REQUIRES: i < size()
  const RecordEntry& entry(uint64_t i) const { return (*entries_)[i]; }
  std::span<const std::byte> metadata() const { return *metadata_; }
  const std::string& name() const { return name_; }  // the path, or Parse's name
  uint64_t file_bytes() const { return file_bytes_; }

  // Reads record i into dst and verifies its checksum. REQUIRES: i < size(),
  // dst.size() == entry(i).length. Corruption "<name> record <i>: ..." for a checksum mismatch
  // or a file that was cut short since Open; IOError for a failed read.
  Status ReadInto(uint64_t i, std::span<std::byte> dst) const;

 private:
  RecordFile() = default;
  std::string name_;
  uint64_t file_bytes_ = 0;
  std::shared_ptr<const Fd> fd_;                   // the open file (Open), or null (Parse)
  std::span<const std::byte> memory_;              // the whole file (Parse)
  std::shared_ptr<const std::vector<RecordEntry>> entries_;
  std::shared_ptr<const std::vector<std::byte>> metadata_;
};

struct RecordWriterOptions {
  mode_t file_mode = 0600;  // owner-only unless configured
  bool fsync = true;        // fsync the file before the rename and the directory after it
};

// Writes a record file atomically: records go to "<path>.tmp.<pid>", Finish() appends the
// metadata and index, stamps the header, fsyncs, and renames onto `path` (then fsyncs the
// directory). A writer destroyed before Finish() removes its temporary file; `path` is never seen
// half-written.
class RecordWriter {
 public:
  static Result<std::unique_ptr<RecordWriter>> Create(const std::filesystem::path& path,
                                                      const RecordWriterOptions& options = {});
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  // Appends one record. REQUIRES: Finish() not called yet.
  Status Append(std::span<const std::byte> bytes, int64_t label = -1);
  // Completes the file (see the class comment). REQUIRES: called at most once.
  Status Finish(std::span<const std::byte> metadata = {});
  uint64_t records() const { return index_.size(); }

 private:
  RecordWriter() = default;
  Status WriteAt(std::span<const std::byte> bytes, uint64_t offset);
  std::filesystem::path path_, tmp_;
  RecordWriterOptions options_;
  std::unique_ptr<Fd> fd_;  // the temporary file being written
  uint64_t end_ = kRecordHeaderBytes;
  std::vector<RecordEntry> index_;
  bool finished_ = false;
};

}  // namespace viper
