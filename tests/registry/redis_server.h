// A real redis-server (Debian's /usr/bin/redis-server) for tests: started on a free loopback port
// (another port is tried when the chosen one is taken before the server binds it), stopped when
// this object goes, even when the test fails. Kill() and Restart() on the same port are the
// faults the tests inject. No persistence (--save '' --appendonly no): a restart loses every key,
// which is the harder case for re-registration.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <memory>
#include <string>

#include "api/process.h"
#include "redis_connection.h"

namespace viper::testing {

inline constexpr const char* kRedisServer = "/usr/bin/redis-server";

class RedisServer {
 public:
  RedisServer() = default;
  ~RedisServer() { Stop(); }
  RedisServer(const RedisServer&) = delete;

  // Starts on a free port; returns an error text ("" on success).
  std::string Start() {
    std::string why;
    for (int attempt = 0; attempt < 8; ++attempt) {
      port_ = PickFreePort();
      why = Launch();
      if (why.empty()) return "";
    }
    return why;
  }
  // Starts again on the same port (after Kill or Stop). Retries for a while if the port is busy.
  std::string Restart() {
    std::string why;
    for (int attempt = 0; attempt < 20; ++attempt) {
      why = Launch();
      if (why.empty()) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return why;
  }
  void Kill() {  // kill -9: no goodbye to any client
    if (process_) process_->Kill(SIGKILL);
    process_.reset();
  }
  void Stop() {
    if (process_) process_->Kill(SIGTERM);
    process_.reset();
  }
  bool running() { return process_ && process_->running(); }
  uint16_t port() const { return port_; }
  std::string url(int db = 0) const {
    return "redis://127.0.0.1:" + std::to_string(port_) + (db ? "/" + std::to_string(db) : "");
  }
  std::string log() const { return ReadFile(dir_.path() / "redis.log"); }
  // A raw connection for checks and for writing malformed records.
  std::unique_ptr<registry_internal::RedisConnection> Connect(int db = 0) const {
    auto c = registry_internal::RedisConnection::Connect({"127.0.0.1", port_, db}, {});
    return c.ok() ? std::move(c).value() : nullptr;
  }

 private:
  std::string Launch() {
    auto log = dir_.path() / "redis.log";
    process_ = std::make_unique<Process>(
        std::vector<std::string>{kRedisServer, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", dir_.path().string(), "--daemonize", "no"},
        log);
    bool up = WaitUntil([&] { return !process_->running() || ServedByUs(); }, std::chrono::seconds(20));
    if (up && process_->running()) return "";
    std::string why = "redis-server on port " + std::to_string(port_) + " did not start: " + ReadFile(log);
    process_.reset();
    return why;
  }

  // The server on our port is our process (not another test's server that took the port first).
  bool ServedByUs() const {
    auto c = Connect();
    if (!c) return false;
    auto info = c->Run({"INFO", "server"});
    if (!info.ok() || (*info)->type != REDIS_REPLY_STRING) return false;
    std::string text((*info)->str, (*info)->len);
    return text.find("process_id:" + std::to_string(process_->pid()) + "\r") != std::string::npos;
  }

  TempDir dir_;
  uint16_t port_ = 0;
  std::unique_ptr<Process> process_;
};

}  // namespace viper::testing
