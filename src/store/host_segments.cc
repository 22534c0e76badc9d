// Host-tier helpers that work on segment names alone: finding a dead process's segments and
// mapping another process's segment read-only (the consumer side).
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include <fmt/format.h>

#include "core/fd.h"
#include "store/host_tier.h"
#include "store_util.h"
#include "viper/log.h"

namespace viper {
namespace {

using store_internal::FormatBytes;

constexpr std::string_view kLog = "host_tier";
constexpr const char* kShmDir = "/dev/shm";

// Segments are owner-only by default: a consumer running as another user is told so.
Status ForeignSegment(const std::string& name) {
  struct stat st {};
  std::string owner = ::stat((std::string(kShmDir) + "/" + name).c_str(), &st) == 0
                          ? fmt::format("uid {} with mode {:04o}", st.st_uid, st.st_mode & 07777)
                          : "another user";
  return Status::PermissionDenied(fmt::format(
      "segment {} belongs to {} and this process runs as uid {}: run the consumer as the node's user, or give the "
      "node a segment_mode its group or others may read (it is owner-only by default)",
      name, owner, ::geteuid()));
}

}  // namespace

std::vector<std::string> HostTier::FindStaleSegments(const std::string& prefix, bool exclusive) {
  std::vector<std::string> stale;
  DIR* dir = ::opendir(kShmDir);
  if (dir == nullptr) {
    log(LogLevel::kWarn, kLog, "cannot scan {} for stale segments: {}", kShmDir, std::strerror(errno));
    return stale;
  }
  const std::string lead = prefix + ".";
  while (const dirent* entry = ::readdir(dir)) {
    std::string_view name(entry->d_name);
    if (!name.starts_with(lead)) continue;
    std::string_view rest = name.substr(lead.size());  // "<pid>.<seq>"
    size_t dot = rest.find('.');
    if (dot == std::string_view::npos) continue;
    auto pid = store_internal::ParseDecimal(rest.substr(0, dot));
    auto seq = store_internal::ParseDecimal(rest.substr(dot + 1));
    if (!pid || !seq) continue;
    if (!exclusive &&
        (static_cast<int64_t>(*pid) == ::getpid() || store_internal::ProcessAlive(static_cast<int64_t>(*pid))))
      continue;
    // Only our own: another local user may create any name in /dev/shm, a dead pid's included.
    // O_PATH | O_NOFOLLOW: a link is looked at, not followed; fstat then tells who owns what.
    Fd fd(::openat(::dirfd(dir), entry->d_name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) continue;  // gone meanwhile
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
      log(LogLevel::kWarn, kLog, "ignoring {}/{}: named like a segment of a dead process but {} (this node runs as uid {})",
          kShmDir, name, S_ISREG(st.st_mode) ? fmt::format("owned by uid {}", st.st_uid) : std::string("not a regular file"),
          ::geteuid());
      continue;
    }
    stale.emplace_back(name);
  }
  ::closedir(dir);
  std::sort(stale.begin(), stale.end());
  return stale;
}

Result<Fd> OpenSegmentReadOnly(const std::string& name, uint64_t size, struct stat* st) {
  if (name.empty() || name.size() > NAME_MAX || name.find('/') != std::string::npos || name.front() == '.') {
    return Status::InvalidArgument(fmt::format("'{}' is not a shared-memory segment name", name));
  }
  if (size == 0) return Status::InvalidArgument(fmt::format("segment {}: cannot map 0 bytes", name));
  Fd fd(::shm_open(("/" + name).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0));
  const int err = errno;
  if (fd.get() < 0 && err == EACCES) return ForeignSegment(name);
  if (fd.get() < 0 && err == ELOOP) {
    return Status::InvalidArgument(fmt::format("segment {}: {}/{} is a symbolic link, not a segment", name, kShmDir, name));
  }
  if (fd.get() < 0) {
    return Status::FromErrno(fmt::format("segment {}: shm_open read-only failed (is its node still running?)", name), err);
  }
  if (::fstat(fd.get(), st) != 0) return Status::FromErrno(fmt::format("segment {}: fstat failed", name));
  if (!S_ISREG(st->st_mode)) {
    return Status::InvalidArgument(fmt::format("segment {}: {}/{} is not a regular file (mode {:o}, owner uid {})", name,
                                               kShmDir, name, st->st_mode, st->st_uid));
  }
  if (static_cast<uint64_t>(st->st_size) < size) {
    return Status::InvalidArgument(fmt::format("segment {} is {}, smaller than the {} expected", name,
                                               FormatBytes(static_cast<uint64_t>(st->st_size)), FormatBytes(size)));
  }
  return fd;
}

Result<MappedSegment> MapSegmentReadOnly(const std::string& name, uint64_t size, bool populate) {
  struct stat st {};
  VIPER_ASSIGN_OR_RETURN(Fd fd, OpenSegmentReadOnly(name, size, &st));
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd.get(), 0);
  const int err = errno;
  if (base == MAP_FAILED) return Status::FromErrno(fmt::format("segment {}: mmap of {} failed", name, FormatBytes(size)), err);
  // The mapping keeps the segment alive; the descriptor closes here.
  MappedSegment out;
  out.owner = std::shared_ptr<const void>(base, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  out.data = std::span<const std::byte>(static_cast<const std::byte*>(base), size);
  return out;
}

}  // namespace viper
