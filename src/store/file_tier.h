// FileTier: the persistent copy of every version, <dir>/<model>/<version>.safetensors.
//
// Writes are atomic: write <version>.safetensors.tmp.<pid>.<n>.<host>, fsync, rename, fsync the
// directory. A crash leaves at most a temporary file, which Open() skips (with a warning) and
// removes once its writer is known dead (same host, pid gone) or it has not changed for
// `stale_temp_age` (a writer on another host of a shared file system). Open() scans and indexes
// the directory; a file that does not parse, has no viper.checksum, whose checksum fails, or whose
// viper.model / viper.version disagree with its path is skipped with a warning, never served (and
// left in place for the operator; its number is never written again, see HighestVersionNamed).
// Retention keeps the latest `keep_versions` files per model.
//
// One instance per directory: Open() takes an exclusive flock on <dir>/.viper.lock (holding its
// pid and host) for the tier's life and fails with FailedPrecondition, naming the directory and
// the holder, while another instance (in any process) holds it. Two writers would number versions
// independently and replace each other's files. The index is what Open()/Rescan() saw plus this
// instance's writes; Read/ReadInto of a version not in the index (a file an operator put back, or
// written from another host of a file system whose locks do not reach it) look on disk.
//
// Thread-safety: all methods are thread-safe; writes of different versions may run concurrently.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/names.h"
#include "viper/snapshot.h"
#include "viper/status.h"

namespace viper {

struct FileTierOptions {
  std::filesystem::path dir;     // created if missing (mode 0700)
  size_t keep_versions = 3;      // files kept per model (>= 1)
  mode_t file_mode = 0600;       // owner-only unless configured
  bool fsync = true;             // fsync file and directory on every write
  bool verify_on_open = true;    // checksum every file during Open()'s scan
  // A temporary file untouched this long is a crashed writer's leftover even if its pid cannot be
  // checked (written on another host).
  std::chrono::seconds stale_temp_age{600};
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

  // Atomically writes `bytes` (a complete, sealed snapshot buffer: it must parse and declare
  // viper.checksum; its viper.model / viper.version, if present, must match) as (model, version),
  // straight from `bytes` (no copy); applies retention. AlreadyExists if the version is already
  // in the tier or being written, or if a file of its name exists on disk though not indexed (one
  // skipped at the scan): the final rename never replaces a file (RENAME_NOREPLACE).
  Status Write(const std::string& model, uint64_t version, std::span<const std::byte> bytes);
  // Opens (model, version) as a Snapshot over a read-only mapping; checksum verified.
  Result<Snapshot> Read(const std::string& model, uint64_t version) const;
  // Reads (model, version) into `dst` with large sequential reads; returns bytes read.
  // REQUIRES: dst.size() >= the entry's size. Checksum verified.
  Result<uint64_t> ReadInto(const std::string& model, uint64_t version, std::span<std::byte> dst) const;

  std::optional<FileEntry> Find(const std::string& model, uint64_t version) const;
  std::optional<FileEntry> Latest(const std::string& model) const;
  std::vector<FileEntry> List() const;  // every indexed entry, by model then version
  std::vector<uint64_t> versions(const std::string& model) const;  // indexed versions, ascending
  // The highest version of `model` whose <version>.safetensors this instance has seen in a scan
  // (a file skipped as unreadable or corrupt included) or written; 0 if none. A new version must
  // be numbered above it: Write never replaces an existing file.
  uint64_t HighestVersionNamed(const std::string& model) const;
  // Scans the directory again (as Open() does) and replaces the index.
  Status Rescan();
  const FileTierOptions& options() const { return options_; }
  std::filesystem::path PathFor(const std::string& model, uint64_t version) const;

 private:
  struct Impl;
  explicit FileTier(const FileTierOptions& options);
  FileTierOptions options_;
  std::shared_ptr<Impl> impl_;
};

// ValidateModelName, ValidateVersion: core/names.h.

}  // namespace viper
