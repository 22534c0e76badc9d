// FileTier: the persistent copy of every version, <dir>/<model>/<version>.safetensors.
//
// Writes are atomic: write <version>.safetensors.tmp.<pid>, fsync, rename, fsync the directory. A
// crash leaves at most a temporary file, which Open() skips (with a warning) and removes. Open()
// scans and indexes the directory; a file whose checksum fails is skipped with a warning and
// never served. Retention keeps the latest `keep_versions` files per model.
//
// Thread-safety: all methods are thread-safe; writes of different versions may run concurrently.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "viper/snapshot.h"
#include "viper/status.h"

namespace viper {

struct FileTierOptions {
  std::filesystem::path dir;     // created if missing (mode 0700)
  size_t keep_versions = 3;      // files kept per model (>= 1)
  mode_t file_mode = 0600;       // owner-only unless configured
  bool fsync = true;             // fsync file and directory on every write
  bool verify_on_open = true;    // checksum every file during Open()'s scan
};

struct FileEntry {
  std::string model;
  uint64_t version = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::filesystem::path path;
};

class FileTier {
 public:
  static Result<std::unique_ptr<FileTier>> Open(const FileTierOptions& options);

  // Atomically writes `bytes` (a complete snapshot buffer) as (model, version); applies retention.
  Status Write(const std::string& model, uint64_t version, std::span<const std::byte> bytes);
  // Opens (model, version) as a Snapshot over a read-only mapping; checksum verified.
  Result<Snapshot> Read(const std::string& model, uint64_t version) const;
  // Reads (model, version) into `dst` with large sequential reads; returns bytes read.
  // REQUIRES: dst.size() >= the entry's size. Checksum verified.
  Result<uint64_t> ReadInto(const std::string& model, uint64_t version, std::span<std::byte> dst) const;

  std::optional<FileEntry> Find(const std::string& model, uint64_t version) const;
  std::optional<FileEntry> Latest(const std::string& model) const;
  std::vector<FileEntry> List() const;  // every indexed entry, by model then version
  const FileTierOptions& options() const { return options_; }
  std::filesystem::path PathFor(const std::string& model, uint64_t version) const;

 private:
  struct Impl;
  explicit FileTier(const FileTierOptions& options);
  FileTierOptions options_;
  std::shared_ptr<Impl> impl_;
};

// Model names are path and segment components: 1-128 chars of [A-Za-z0-9._-], not starting with '.'.
Status ValidateModelName(const std::string& model);

}  // namespace viper
