// viper_net_bench: engine bandwidth and latency against a viper_net_test_peer process.
//   viper_net_bench [--bytes N] [--chunk N] [--inflight N] [--spin-us N] [--pings N] [--peer HOST:PORT]
// --peer uses an already running viper_net_test_peer (e.g. in another network namespace)
// instead of starting one on this host.
// Runs over whatever transports UCX picks for a client-server endpoint (run it with UCX_TLS=...
// or other UCX_* settings to compare). Prints the memcpy baseline of the same run and the ratio.
// --bytes 0 skips the bandwidth part.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "net/net_test_util.h"

namespace viper::net::testing {
namespace {

using namespace std::chrono_literals;

struct Config {
  size_t total = 600u << 20;
  size_t chunk = 4u << 20;
  int inflight = 8;
  int pings = 2000;
  std::string peer;  // empty: start a local helper
  EngineOptions options;
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double MemcpyGBps(const Config& c) {
  std::vector<std::byte> src(c.chunk * static_cast<size_t>(c.inflight)), dst(src.size());
  FillPattern(src, 1, 0);
  std::memcpy(dst.data(), src.data(), src.size());  // warm both
  auto t0 = std::chrono::steady_clock::now();
  for (size_t done = 0, i = 0; done < c.total; done += c.chunk, ++i) {
    size_t slot = (i % static_cast<size_t>(c.inflight)) * c.chunk;
    std::memcpy(dst.data() + slot, src.data() + slot, c.chunk);
  }
  return static_cast<double>(c.total) / Seconds(t0) / 1e9;
}

// Runs `start(i, done)` for chunks 0..n-1 with at most `inflight` not yet done; waits for all.
bool Windowed(size_t n, int inflight, const std::function<void(size_t, Completion)>& start) {
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  bool ok = true;
  for (size_t i = 0; i < n; ++i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return i - done < static_cast<size_t>(inflight); });
    }
    start(i, [&](const Status& st) {
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok() && ok) {
        ok = false;
        std::fprintf(stderr, "chunk failed: %s\n", st.ToString().c_str());
      }
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == n; });
  return ok;
}

std::string BulkCommand(const char* verb, uint64_t tag0, const Config& c) {
  return std::string(verb) + " " + std::to_string(tag0) + " " + std::to_string(c.total) + " " +
         std::to_string(c.chunk) + " " + std::to_string(c.inflight) + " 9 1";
}

// The helper sends; this process receives into a reused ring of `inflight` chunks.
double ReceiveGBps(Engine& engine, EventLog& events, PeerId peer, uint64_t tag0, const Config& c,
                   std::vector<std::byte>& ring) {
  auto t0 = std::chrono::steady_clock::now();
  if (!engine.Send(peer, AsBytes(BulkCommand("cmd:send-bulk", tag0, c))).ok()) return -1;
  bool ok = Windowed(c.total / c.chunk, c.inflight, [&](size_t i, Completion done) {
    std::span<std::byte> slot(ring.data() + (i % static_cast<size_t>(c.inflight)) * c.chunk, c.chunk);
    engine.RecvBulk(peer, tag0 + i, slot, std::move(done));
  });
  double gbps = static_cast<double>(c.total) / Seconds(t0) / 1e9;
  auto reply = events.NextMessage(60s);
  return ok && reply && reply->text() == "done:send-bulk ok" ? gbps : -1;
}

// This process sends; the end is the helper's "done" message (its last receive completed).
double SendGBps(Engine& engine, EventLog& events, PeerId peer, uint64_t tag0, const Config& c,
                std::vector<std::byte>& ring) {
  auto t0 = std::chrono::steady_clock::now();
  if (!engine.Send(peer, AsBytes(BulkCommand("cmd:recv-bulk", tag0, c))).ok()) return -1;
  bool ok = Windowed(c.total / c.chunk, c.inflight, [&](size_t i, Completion done) {
    std::span<const std::byte> slot(ring.data() + (i % static_cast<size_t>(c.inflight)) * c.chunk, c.chunk);
    engine.SendBulk(peer, tag0 + i, slot, std::move(done));
  });
  auto reply = events.NextMessage(60s);
  double gbps = static_cast<double>(c.total) / Seconds(t0) / 1e9;
  return ok && reply && reply->text() == "done:recv-bulk ok" ? gbps : -1;
}

void PingPong(Engine& engine, EventLog& events, PeerId peer, int count) {
  std::vector<double> micros;
  std::vector<std::byte> ping(64);
  for (int i = 0; i < count; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (!engine.Send(peer, ping).ok() || !events.NextMessage(10s)) return;
    micros.push_back(Seconds(t0) * 1e6);
  }
  std::sort(micros.begin(), micros.end());
  std::printf("control ping-pong 64 B (%d round trips): p50 %.1f us  p99 %.1f us\n", count,
              micros[micros.size() / 2], micros[micros.size() * 99 / 100]);
}

int Run(const Config& c) {
  std::printf("viper_net_bench: %zu MiB in %zu KiB tagged chunks, %d in flight, spin %ld us\n", c.total >> 20,
              c.chunk >> 10, c.inflight, static_cast<long>(c.options.spin.count()));
  EventLog events;
  auto engine = Engine::Start(c.options, events.Handlers());
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().ToString().c_str()), 1;
  std::optional<ChildProcess> child;
  std::optional<std::string> address = c.peer;
  if (c.peer.empty()) {
    auto started = ChildProcess::Start(
        {HelperPath(), "--listen", "127.0.0.1:0", "--spin-us", std::to_string(c.options.spin.count())});
    if (!started) return std::fprintf(stderr, "cannot start %s\n", HelperPath().c_str()), 1;
    child.emplace(std::move(*started));
    address = child->WaitFor("LISTEN ", 10s);
  }
  if (!address) return std::fprintf(stderr, "helper did not start\n"), 1;
  auto peer = (*engine)->Connect(*address);
  if (!peer.ok()) return std::fprintf(stderr, "%s\n", peer.status().ToString().c_str()), 1;
  if (c.total > 0) {
    std::vector<std::byte> ring(c.chunk * static_cast<size_t>(c.inflight));
    FillPattern(ring, 2, 0);
    double baseline = MemcpyGBps(c);
    // The first round of each direction warms up (page faults, UCX registration caches).
    double recv = ReceiveGBps(**engine, events, *peer, 100000, c, ring);
    recv = ReceiveGBps(**engine, events, *peer, 200000, c, ring);
    double send = SendGBps(**engine, events, *peer, 300000, c, ring);
    send = SendGBps(**engine, events, *peer, 400000, c, ring);
    if (recv < 0 || send < 0) return std::fprintf(stderr, "bulk transfer failed\n"), 1;
    std::printf("receive  %.2f GB/s   send %.2f GB/s   memcpy baseline %.2f GB/s   ratios %.2f %.2f\n", recv, send,
                baseline, recv / baseline, send / baseline);
  }
  if (c.pings > 0) PingPong(**engine, events, *peer, c.pings);
  return 0;
}

}  // namespace
}  // namespace viper::net::testing

int main(int argc, char** argv) {
  viper::net::testing::Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--bytes") c.total = std::stoull(argv[i + 1]);
    else if (flag == "--chunk") c.chunk = std::stoull(argv[i + 1]);
    else if (flag == "--inflight") c.inflight = std::stoi(argv[i + 1]);
    else if (flag == "--spin-us") c.options.spin = std::chrono::microseconds(std::stoll(argv[i + 1]));
    else if (flag == "--pings") c.pings = std::stoi(argv[i + 1]);
    else if (flag == "--peer") c.peer = argv[i + 1];
    else return std::fprintf(stderr, "unknown flag %s\n", flag.c_str()), 2;
  }
  c.total = c.total / c.chunk * c.chunk;
  return viper::net::testing::Run(c);
}
