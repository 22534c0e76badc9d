// Shared by the node commands: where the node is, how to authenticate, how a command stops.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "cli_checks.h"
#include "core/token_file.h"
#include "net/protocol.h"
#include "viper/status.h"
#include "viper/subscriber.h"
#include "viper/units.h"

namespace viper::cli {

struct AuthFlags {
  std::string token_file;
  // The token from --token-file, else $VIPER_TOKEN, else empty (ResolveToken: core/token_file.h).
  Result<std::string> Resolve() const { return ResolveToken(token_file); }
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

// --liveness / --upstream-liveness SECONDS: the silence before a liveness probe and the wait for
// its answer, both; 0 turns probes off (the timeout keeps its default: Subscriber::Start wants it > 0).
inline void SetLiveness(double seconds, std::chrono::milliseconds* probe, std::chrono::milliseconds* timeout) {
  *probe = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(seconds));
  if (probe->count() > 0) *timeout = *probe;
}

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
