// SampleSource: where the data layer reads training samples from (the backend of the Prefetcher,
// include/viper/prefetch.h). A source is a fixed list of samples, ids 0..size()-1, each with a
// size and a label known before it is read, so that the prefetcher can account its memory
// exactly before reading.
//
// Two backends: a directory tree of files (one sample per file) and a record file (one large file
// of records, include/viper/record_file.h). Tests and users may add others (e.g. a source that
// decodes, or one that injects faults) by implementing the four virtual methods.
//
// Thread-safety: every method of a source may be called from many threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "viper/record_file.h"
#include "viper/status.h"

namespace viper {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual uint64_t size() const = 0;
  // REQUIRES (all below): id < size().
  virtual uint64_t bytes(uint64_t id) const = 0;
  virtual int64_t label(uint64_t id) const = 0;  // -1: none
  // What a message calls sample `id`: "sample 17 (/data/cat/0017.bin)".
  virtual std::string Describe(uint64_t id) const = 0;
  // Cheap checks made before any memory is allocated for sample `id` (e.g. a file larger than the
  // options allow). Same messages as ReadInto.
  virtual Status Check(uint64_t /*id*/) const { return Status::OK(); }
  // Reads sample `id` into dst. REQUIRES: dst.size() == bytes(id). A failure's message begins with
  // "sample <id>" and says what is wrong (Corruption for bad or truncated data, IOError/NotFound
  // for a failed read).
  virtual Status ReadInto(uint64_t id, std::span<std::byte> dst) const = 0;
  // Names of the classes, by label (a directory source: its subdirectories); may be empty.
  virtual std::vector<std::string> class_names() const { return {}; }
};

struct DirectorySourceOptions {
  std::filesystem::path dir{};
  // Label each file by the top-level subdirectory it is under (ImageFolder style: the sorted
  // subdirectory names are classes 0, 1, ...); files directly in `dir` get -1. Off: every file -1.
  bool labels_from_subdirs = true;
  // Only files whose name ends with one of these (e.g. ".bin"); empty: every regular file.
  std::vector<std::string> extensions{};
  // When non-zero every sample must be exactly this many bytes: a file of another size is a bad
  // sample (Corruption when it is read, so that skip-with-count applies to it).
  uint64_t sample_bytes = 0;
  // A larger file is a bad sample (never allocated).
  uint64_t max_sample_bytes = 1ull << 30;
  // Files starting with '.' (and hidden directories) are left out.
  bool skip_hidden = true;
};

// Scans `options.dir` recursively (regular files; symlinks are not followed) and sorts the paths,
// so that sample ids are stable across runs. Sizes are taken at the scan: a file that changes
// size afterwards is reported when read ("truncated" or "grew"). NotFound if the directory does
// not exist; InvalidArgument if it holds no sample.
Result<std::shared_ptr<const SampleSource>> OpenDirectorySource(const DirectorySourceOptions& options);

// The records of a record file are the samples (ids = record indices; labels from the index).
// The header and index are validated at open; each record's checksum when it is read.
Result<std::shared_ptr<const SampleSource>> OpenRecordSource(const std::filesystem::path& path,
                                                             const RecordFileOptions& options = {});

}  // namespace viper
