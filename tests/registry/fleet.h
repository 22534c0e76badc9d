// Test fleet for the Redis registry: a real redis-server, `viper serve --registry` node processes
// and versions handed to them with Client::Publish (the node assigns the version numbers).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "api/client.h"
#include "api/pattern.h"
#include "redis_server.h"
#include "viper/registry.h"
#include "viper/snapshot.h"

namespace viper::testing {

// A small snapshot whose bytes depend on `seed` (so versions differ), in Viper's layout.
inline Snapshot SeededSnapshot(uint64_t seed, size_t bytes = 64 << 10) {
  std::vector<std::byte> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::byte>(Pattern(seed, i % 251));
  auto snap = BuildSnapshot({{{"w", DType::kU8, {static_cast<int64_t>(bytes)}}, data}}, {});
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  return std::move(snap).value();
}

inline std::unique_ptr<Client> ConnectTo(const std::string& address) {
  ClientOptions co;
  co.connect = address;
  co.name = "fleet-client";
  auto client = Client::Connect(co);
  if (!client.ok()) ADD_FAILURE() << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

// Publishes one version of `model` through `client`'s node; returns its number (0 on error).
inline uint64_t PublishWith(Client& client, const std::string& model, uint64_t seed) {
  Snapshot snap = SeededSnapshot(seed);
  auto version = client.Publish(model, snap.bytes(), seed, 0);
  if (!version.ok()) {
    ADD_FAILURE() << version.status().ToString();
    return 0;
  }
  return *version;
}

// Publishes one version of `model` through the node at `address` (a connection for it).
inline uint64_t PublishTo(const std::string& address, const std::string& model, uint64_t seed) {
  auto client = ConnectTo(address);
  return client ? PublishWith(*client, model, seed) : 0;
}

// Versions of `model` the node holds, from its own catalog (LIST).
inline std::set<uint64_t> HeldBy(Client& client, const std::string& model) {
  std::set<uint64_t> out;
  auto list = client.List();
  if (list.ok())
    for (const auto& v : *list)
      if (v.model == model) out.insert(v.version);
  return out;
}

// Versions of `model` the registry lists for the node at `address`.
inline std::set<uint64_t> RegisteredFor(Registry& registry, const std::string& model, const std::string& address) {
  std::set<uint64_t> out;
  auto found = registry.Lookup(model);
  if (found.ok())
    for (const auto& h : found->holders)
      if (h.node.address == address) out.insert(h.info.version);
  return out;
}

// `viper serve --registry URL` in its own process, with a file tier, until destroyed (SIGKILL).
// By default it listens on a loopback port below the ephemeral range (PickFreePort), so that a
// restart finds its address free of other processes' outgoing connections.
class ServeProcess {
 public:
  ServeProcess(const TempDir& dir, const std::string& name, const std::string& registry, double ttl_s,
               const std::string& listen = "", std::vector<std::string> extra = {})
      : dir_(dir), name_(name), registry_(registry), ttl_s_(ttl_s), extra_(std::move(extra)) {
    Launch(listen.empty() ? "127.0.0.1:" + std::to_string(PickFreePort()) : listen);
  }
  // kill -9 and start again on the same address and store (retrying while the port is busy).
  void Restart() {
    process_->Kill(SIGKILL);
    std::filesystem::remove(dir_ / (name_ + ".addr"));
    const std::string address = address_;  // a failed launch clears address_
    for (int attempt = 0; attempt < 20; ++attempt) {
      Launch(address);
      if (!address_.empty()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  void Kill() { process_->Kill(SIGKILL); }
  const std::string& address() const { return address_; }
  Process& process() { return *process_; }
  std::string log() const { return process_->log(); }
  std::filesystem::path store() const { return dir_ / (name_ + "-store"); }

 private:
  void Launch(std::string listen) {
    auto addr_file = dir_ / (name_ + ".addr");
    std::vector<std::string> argv{ViperBinary(), "serve", "--listen", listen, "--name", name_, "--registry", registry_,
                                  "--registry-ttl", std::to_string(ttl_s_), "--store-dir", store().string(),
                                  "--address-file", addr_file.string()};
    argv.insert(argv.end(), extra_.begin(), extra_.end());
    process_ = std::make_unique<Process>(argv, dir_ / (name_ + ".log"));
    address_ = WaitForFile(addr_file, std::chrono::seconds(30));
    if (address_.empty() && !process_->running()) address_ = "";
  }

  const TempDir& dir_;
  std::string name_, registry_;
  double ttl_s_;
  std::vector<std::string> extra_;  // more `viper serve` arguments
  std::string address_;
  std::unique_ptr<Process> process_;
};

// Counts the lines of `text` that contain `needle`.
inline int CountLines(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace viper::testing
