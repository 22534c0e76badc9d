// Fd: owns a file descriptor and closes it on scope exit (movable, not copyable); and
// OpenRegularFile, the one way to open a file whose bytes are read (snapshots, samples, records,
// loss logs).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "viper/status.h"

namespace viper {

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now; returns close()'s result (it can report a deferred write error).
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

// Opens `path` read-only and checks on the open descriptor that it is a regular file, with
// O_NONBLOCK: a FIFO is refused at once instead of waited on for a writer (reads of a regular
// file ignore the flag), and nothing can be swapped in between the check and the read. *st gets
// the file's status. Errors, without the path (the caller adds it as context): "cannot open" and
// "cannot stat" with errno; InvalidArgument "not a regular file" (a FIFO, a device, a directory).
inline Result<Fd> OpenRegularFile(const std::string& path, struct stat* st) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return Status::FromErrno("cannot open");
  if (::fstat(fd.get(), st) != 0) return Status::FromErrno("cannot stat");
  if (!S_ISREG(st->st_mode)) return Status::InvalidArgument("not a regular file");
  return fd;
}

}  // namespace viper
