// Node start-up after a crash: the versions a killed node left in shared memory are not lost.
//
// A node killed with SIGKILL leaves its segments in /dev/shm (nobody unlinks them), and the ones
// it had committed hold sealed snapshots: the file tier may not have them yet (the flush runs
// after the announce), so without this a version consumers were told about could be gone after a
// restart, and the restarted node would even hand out its number again for other bytes. A node
// with a file tier therefore names its segments after its store directory, and on start writes
// every sealed version it finds in a dead predecessor's segments to the file tier before the
// host tier removes them (docs/RELIABILITY.md, "Kill -9 anywhere").
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "core/fd.h"
#include "node_impl.h"
#include "viper/log.h"
#include "viper/snapshot.h"

namespace viper::internal {

namespace {

constexpr std::string_view kLog = "node";

// The sealed snapshot in segment `name`, checked like a file (header, checksum, model, version).
// Only a segment this uid owns, a regular file with exactly the node's segment mode, is read: the
// checks are made with fstat on the descriptor that is then mapped (opened O_NOFOLLOW), so that
// nothing another local user puts in /dev/shm becomes a version. PermissionDenied otherwise.
Result<Snapshot> ReadSealed(const std::string& name, mode_t mode) {
  const std::string path = "/dev/shm/" + name;
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0 && errno == ELOOP) return Status::PermissionDenied(fmt::format("{} is a symbolic link", path));
  if (fd.get() < 0) return Status::FromErrno(fmt::format("segment {}: open failed", name));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(fmt::format("segment {}: fstat failed", name));
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 07777) != mode) {
    return Status::PermissionDenied(fmt::format(
        "{} is {} with mode {:04o}; a node adopts only regular files of its own uid {} with its segment mode {:04o}",
        path, S_ISREG(st.st_mode) ? "a file" : "not a regular file", st.st_mode & 07777, ::geteuid(), mode)
        + (st.st_uid != ::geteuid() ? fmt::format(" (owner uid {})", st.st_uid) : ""));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return Status::NotFound(fmt::format("segment {} is empty", name));
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return Status::FromErrno(fmt::format("segment {}: mmap failed", name));
  std::shared_ptr<const void> owner(base, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  std::span<const std::byte> data(static_cast<const std::byte*>(base), size);
  VIPER_ASSIGN_OR_RETURN(uint64_t extent, SnapshotExtent(data));
  ParseOptions parse;
  parse.verify_checksum = true;
  parse.require_checksum = true;
  VIPER_ASSIGN_OR_RETURN(Snapshot snapshot, Snapshot::Parse(data.first(extent), owner, parse));
  if (!snapshot.model() || !snapshot.version()) return Status::Corruption("no viper.model or viper.version");
  return snapshot;
}

}  // namespace

std::string SegmentPrefixFor(const NodeOptions& options) {
  if (options.store_dir.empty()) return options.segment_prefix;
  std::error_code ec;
  std::string dir = std::filesystem::weakly_canonical(options.store_dir, ec).string();
  if (ec) dir = std::filesystem::absolute(options.store_dir).lexically_normal().string();
  uint64_t hash = checksum64(std::as_bytes(std::span(dir.data(), dir.size())));
  return fmt::format("{}-{:08x}", options.segment_prefix, static_cast<uint32_t>(hash));
}

Adoption AdoptStaleSegments(const std::string& prefix, mode_t mode, FileTier& files) {
  Adoption out;
  // The caller holds the store's lock and the prefix names the store: every segment with it is a
  // predecessor's, whatever the pid in its name (HostTierOptions::prefix_is_exclusive).
  for (const std::string& name : HostTier::FindStaleSegments(prefix, /*exclusive=*/true)) {
    Result<Snapshot> snapshot = ReadSealed(name, mode);
    if (!snapshot.ok() && snapshot.status().code() == StatusCode::kPermissionDenied) {
      log(LogLevel::kWarn, kLog, "not adopting segment {}: {}", name, snapshot.status().message());
      continue;
    }
    if (!snapshot.ok()) continue;  // never sealed (a crash mid-write), or a free segment: nothing to keep
    const std::string model = *snapshot->model();
    const uint64_t version = *snapshot->version();
    if (files.Find(model, version)) continue;
    Status written = files.Write(model, version, snapshot->bytes());
    if (!written.ok()) {
      // Its segment may be the version's only copy: kept, and tried again at the next start.
      log(LogLevel::kError, kLog,
          "{} version {} in segment /dev/shm/{} of a dead process could not be written to the file tier: {}; the "
          "segment is kept (not served; version {} is not reused) and written at the next start that can",
          model, version, name, written.message(), version);
      out.kept.insert(name);
      out.kept_versions[model] = std::max(out.kept_versions[model], version);
      continue;
    }
    log(LogLevel::kWarn, kLog, "recovered {} version {} ({} bytes) from segment {} of a dead process", model, version,
        snapshot->bytes().size(), name);
    ++out.adopted;
  }
  return out;
}

}  // namespace viper::internal
