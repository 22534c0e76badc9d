// Shared by the node commands: where the node is, how to authenticate, how a command stops.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "cli_checks.h"
#include "net/protocol.h"
#include "viper/status.h"
#include "viper/subscriber.h"
#include "viper/units.h"

namespace viper::cli {

// Leading and trailing whitespace (spaces, tabs, CR, LF) is not part of a token: stripped the
// same way from a token file and from $VIPER_TOKEN.
inline std::string TrimToken(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n\v\f";
  size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return "";
  size_t end = text.find_last_not_of(kSpace);
  return std::string(text.substr(begin, end - begin + 1));
}

// The token held in `path`. Like ssh with a private key, a file that group or others may read or
// write is refused (the secret is only as safe as the file), and so is anything but a regular
// file; the error says what to do.
inline Result<std::string> ReadTokenFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("--token-file: cannot open " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = Status::FromErrno("--token-file: cannot stat " + path);
    ::close(fd);
    return s;
  }
  auto refuse = [&](std::string why) {
    ::close(fd);
    return Status::InvalidArgument("--token-file " + path + ": " + why);
  };
  if (S_ISDIR(st.st_mode)) return refuse("is a directory; give the file that holds the token");
  if (!S_ISREG(st.st_mode)) return refuse("is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return refuse(std::string("has mode ") + mode +
                  ": group or others may access it, so the token is not secret; run chmod 600 " + path);
  }
  if (st.st_size > 4096) return refuse("is " + std::to_string(st.st_size) + " bytes; a token file holds at most 4096");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  ssize_t n = ::read(fd, text.data(), text.size());
  ::close(fd);
  if (n < 0) return Status::FromErrno("--token-file: cannot read " + path);
  text.resize(static_cast<size_t>(n));
  std::string token = TrimToken(text);
  if (token.empty()) return Status::InvalidArgument("--token-file " + path + " is empty (or only whitespace)");
  if (token.find_first_of("\r\n") != std::string::npos) {
    return Status::InvalidArgument("--token-file " + path + " holds more than one line; a token is one line");
  }
  return token;
}

struct AuthFlags {
  std::string token_file;
  // The token from --token-file, else $VIPER_TOKEN, else empty. A named file that cannot be read,
  // is not owner-only, or holds no token is an error (never silently "no token"); so is a
  // VIPER_TOKEN that is set but only whitespace.
  Result<std::string> Resolve() const {
    if (!token_file.empty()) return ReadTokenFile(token_file);
    const char* env = std::getenv("VIPER_TOKEN");
    if (env == nullptr || *env == '\0') return std::string();
    std::string token = TrimToken(env);
    if (token.empty()) return Status::InvalidArgument("VIPER_TOKEN is set but holds only whitespace");
    return token;
  }
  void Add(CLI::App& app) {
    app.add_option("--token-file", token_file,
                   "File holding the shared secret, owner-only (chmod 600) (default: $VIPER_TOKEN)")
        ->check(ReadableFile());
  }
};

// Blocks SIGINT and SIGTERM in this thread (and every thread started after it) and returns them
// as a set for sigwait: call before any thread starts, so that only the command's sigwait sees
// them and it can shut down in order.
inline sigset_t BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

// Where `viper serve` listens and clients connect by default: SubscriberOptions::connect's default.
inline const std::string kDefaultNodeAddress = SubscriberOptions{}.connect;

// --connect, defaulting to SubscriberOptions::connect (the one place that default is written).
inline void AddConnect(CLI::App& app, std::string& connect) {
  connect = kDefaultNodeAddress;
  app.add_option("--connect", connect, "Node address HOST:PORT")->capture_default_str()->check(HostPort());
}

// "shm:NAME", "node:HOST:PORT", "file:PATH", "relay:HOST:PORT", "device:cuda:N"
inline std::string ReplicaText(const proto::Replica& r) {
  switch (r.kind) {
    case proto::ReplicaKind::kHostSegment: return "shm:" + r.locator;
    case proto::ReplicaKind::kNode: return "node:" + r.locator;
    case proto::ReplicaKind::kFile: return "file:" + r.locator;
    case proto::ReplicaKind::kRelay: return "relay:" + r.locator;
    case proto::ReplicaKind::kDevice: return "device:" + r.locator;
  }
  return "?";
}

}  // namespace viper::cli
