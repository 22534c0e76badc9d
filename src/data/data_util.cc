#include "data_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

#include <fmt/format.h>

namespace viper::data_internal {

Status PreadAll(int fd, std::span<std::byte> dst, uint64_t offset) {
  uint64_t done = 0;
  while (done < dst.size()) {
    ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(fmt::format("read of {} bytes at offset {} failed", dst.size(), offset));
    if (n == 0) {
      return Status::Corruption(fmt::format("truncated: the file ends {} bytes into the {} bytes expected at offset {}",
                                            done, dst.size(), offset));
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Status PwriteAll(int fd, std::span<const std::byte> bytes, uint64_t offset) {
  uint64_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status::FromErrno(fmt::format("write of {} bytes at offset {} failed after {}", bytes.size(), offset, done),
                               n < 0 ? errno : EIO);
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Status CommitTemp(Fd& fd, const std::filesystem::path& tmp, const std::filesystem::path& path, bool sync) {
  auto fail = [&](Status st) {
    if (fd.get() >= 0) fd.Close();
    ::unlink(tmp.c_str());
    return st;
  };
  if (sync && ::fsync(fd.get()) != 0) return fail(Status::FromErrno(fmt::format("fsync of {}", tmp.string())));
  if (fd.Close() != 0) return fail(Status::FromErrno(fmt::format("close of {}", tmp.string())));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(Status::FromErrno(fmt::format("rename of {} to {}", tmp.string(), path.string())));
  }
  if (!sync) return Status::OK();
  std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0 || ::fsync(dfd.get()) != 0) {
    return Status::FromErrno(fmt::format("fsync of directory {} after renaming {}", dir.string(), path.string()));
  }
  return Status::OK();
}

}  // namespace viper::data_internal
