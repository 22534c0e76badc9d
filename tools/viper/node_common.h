// Shared by the node commands: where the node is, how to authenticate, how a command stops.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>

#include "viper/protocol.h"
#include "viper/status.h"
#include "viper/units.h"
#include "cli_checks.h"

namespace viper::cli {

struct AuthFlags {
  std::string token_file;
  // The token from --token-file, else $VIPER_TOKEN, else empty. A named file that cannot be read,
  // or an empty token file, is an error (never silently "no token").
  Result<std::string> Resolve() const {
    if (!token_file.empty()) {
      std::ifstream in(token_file);
      if (!in) return Status::InvalidArgument("cannot read token file " + token_file);
      std::string token;
      std::getline(in, token);
      while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
      if (token.empty()) return Status::InvalidArgument("token file " + token_file + " is empty");
      return token;
    }
    const char* env = std::getenv("VIPER_TOKEN");
    return std::string(env ? env : "");
  }
  void Add(CLI::App& app) {
    app.add_option("--token-file", token_file, "File holding the shared secret (default: $VIPER_TOKEN)")
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

inline void AddConnect(CLI::App& app, std::string& connect) {
  app.add_option("--connect", connect, "Node address HOST:PORT")->default_val("127.0.0.1:7300")->check(HostPort());
}

// "shm:NAME", "node:HOST:PORT", "file:PATH", "relay:HOST:PORT"
inline std::string ReplicaText(const proto::Replica& r) {
  switch (r.kind) {
    case proto::ReplicaKind::kHostSegment: return "shm:" + r.locator;
    case proto::ReplicaKind::kNode: return "node:" + r.locator;
    case proto::ReplicaKind::kFile: return "file:" + r.locator;
    case proto::ReplicaKind::kRelay: return "relay:" + r.locator;
  }
  return "?";
}

}  // namespace viper::cli
