// ReadRegistryPasswordFile: the Redis password from a file, with a secret file's hygiene.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/fd.h"
#include "viper/registry.h"

namespace viper {

Result<std::string> ReadRegistryPasswordFile(const std::string& path) {
  constexpr size_t kMax = 4096;
  const std::string what = "registry password file " + path;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ELOOP) return Status::InvalidArgument(what + ": is a symbolic link (name the file itself)");
    return Status::InvalidArgument(fmt::format("{}: cannot open: {}", what, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::InvalidArgument(fmt::format("{}: fstat: {}", what, std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) return Status::InvalidArgument(what + ": is a directory, not a file");
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(what + ": is not a regular file");
  if ((st.st_mode & 077) != 0)
    return Status::InvalidArgument(fmt::format(
        "{}: mode {:04o} lets group or others access it; a secret file must be owner-only (chmod 600 {})", what,
        st.st_mode & 07777, path));
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return Status::InvalidArgument(fmt::format(
        "{}: is owned by uid {}, not by this process's uid {} (or root): its owner chooses the password; use a "
        "password file of your own",
        what, st.st_uid, ::geteuid()));
  if (static_cast<size_t>(st.st_size) > kMax)
    return Status::InvalidArgument(fmt::format("{}: {} bytes, over the {}-byte limit for a password", what, st.st_size, kMax));
  std::string text(kMax + 1, '\0');
  size_t have = 0;
  while (have < text.size()) {
    ssize_t n = ::read(fd.get(), text.data() + have, text.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::InvalidArgument(fmt::format("{}: read: {}", what, std::strerror(errno)));
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (have > kMax) return Status::InvalidArgument(fmt::format("{}: over the {}-byte limit for a password", what, kMax));
  text.resize(have);
  const char* space = " \t\r\n\v\f";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return Status::InvalidArgument(what + ": is empty (or only whitespace)");
  text = text.substr(first, text.find_last_not_of(space) - first + 1);
  if (text.find_first_of("\r\n") != std::string::npos)
    return Status::InvalidArgument(what + ": holds more than one line (a password is one line)");
  return text;
}

}  // namespace viper
