// The token file's rule (core/token_file.h).
#include "core/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "core/fd.h"

namespace viper {

std::string TrimToken(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n\v\f";
  size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return "";
  size_t end = text.find_last_not_of(kSpace);
  return std::string(text.substr(begin, end - begin + 1));
}

Result<std::string> ReadTokenFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return Status::FromErrno("--token-file: cannot open " + path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("--token-file: cannot stat " + path);
  auto refuse = [&](const std::string& why) { return Status::InvalidArgument("--token-file " + path + ": " + why); };
  if (S_ISDIR(st.st_mode)) return refuse("is a directory; give the file that holds the token");
  if (!S_ISREG(st.st_mode)) return refuse("is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return refuse(std::string("has mode ") + mode +
                  ": group or others may access it, so the token is not secret; run chmod 600 " + path);
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return refuse("is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " +
                  std::to_string(::geteuid()) + " (or root): its owner chooses the fleet's secret; use a token file "
                  "of your own");
  }
  if (st.st_size > 4096) return refuse("is " + std::to_string(st.st_size) + " bytes; a token file holds at most 4096");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  ssize_t n = ::read(fd.get(), text.data(), text.size());
  if (n < 0) return Status::FromErrno("--token-file: cannot read " + path);
  text.resize(static_cast<size_t>(n));
  std::string token = TrimToken(text);
  if (token.empty()) return Status::InvalidArgument("--token-file " + path + " is empty (or only whitespace)");
  if (token.find_first_of("\r\n") != std::string::npos) {
    return Status::InvalidArgument("--token-file " + path + " holds more than one line; a token is one line");
  }
  return token;
}

Result<std::string> ResolveToken(const std::string& token_file) {
  if (!token_file.empty()) return ReadTokenFile(token_file);
  const char* env = std::getenv("VIPER_TOKEN");
  if (env == nullptr || *env == '\0') return std::string();
  std::string token = TrimToken(env);
  if (token.empty()) return Status::InvalidArgument("VIPER_TOKEN is set but holds only whitespace");
  return token;
}

}  // namespace viper
