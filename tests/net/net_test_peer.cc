// viper_net_test_peer: the remote side of the net tests and of viper_net_bench, a real process
// with its own Engine. Usage:
//   viper_net_test_peer (--listen HOST:PORT | --connect HOST:PORT) [--max-message BYTES] [--spin-us N]
// Prints "LISTEN <address>" or "CONNECTED <peer>" on stdout, then serves control messages until
// its stdin reaches EOF:
//   cmd:big <n> <seed>                                   reply with n pattern bytes
//   cmd:send-bulk <tag0> <total> <chunk> <inflight> <seed> <ring>
//                                                        send chunks with tags tag0, tag0+1, ...
//                                                        (ring=1: from a reused window, no pattern)
//                                                        then reply "done:send-bulk <status>"
//   cmd:recv-bulk <tag0> <total> <chunk> <inflight> <seed>
//                                                        receive and verify, reply "done:recv-bulk <status>"
//   cmd:hello                                            reply "hello <peer id>"
//   anything else                                        echoed back unchanged
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "net/engine.h"
#include "net/net_test_util.h"

namespace viper::net::testing {
namespace {

std::atomic<Engine*> g_engine{nullptr};

void Reply(PeerId peer, const std::string& text) {
  Status st = g_engine.load()->Send(peer, AsBytes(text));
  if (!st.ok()) std::fprintf(stderr, "test peer: reply failed: %s\n", st.ToString().c_str());
}

// One bulk transfer, driven by completions on the progress thread (no locking needed).
struct BulkJob : std::enable_shared_from_this<BulkJob> {
  PeerId peer = 0;
  bool sending = true;
  uint64_t tag0 = 0, seed = 0;
  size_t total = 0, chunk = 0;
  int inflight = 0;
  bool ring = false;
  std::vector<std::byte> data;  // whole stream, or a ring of `inflight` chunks
  size_t next = 0;              // next chunk index to start
  size_t finished = 0;
  Status error;

  size_t chunks() const { return (total + chunk - 1) / chunk; }
  std::span<std::byte> Slot(size_t index) {
    size_t len = std::min(chunk, total - index * chunk);
    size_t offset = ring ? (index % static_cast<size_t>(inflight)) * chunk : index * chunk;
    return {data.data() + offset, len};
  }
  void Start() {
    data.resize(ring ? chunk * static_cast<size_t>(inflight) : total);
    if (sending && !ring) FillPattern(data, seed, 0);
    for (int i = 0; i < inflight && next < chunks(); ++i) StartNext();
    if (chunks() == 0) Finish();
  }
  void StartNext() {
    size_t index = next++;
    auto self = shared_from_this();
    auto done = [self, index](const Status& st) { self->OnChunk(index, st); };
    if (sending) {
      g_engine.load()->SendBulk(peer, tag0 + index, Slot(index), done);
    } else {
      g_engine.load()->RecvBulk(peer, tag0 + index, Slot(index), done);
    }
  }
  void OnChunk(size_t index, const Status& st) {
    if (!st.ok() && error.ok()) error = st;
    if (st.ok() && !sending && !ring) {
      int64_t bad = FindPatternMismatch(Slot(index), seed, index * chunk);
      if (bad >= 0 && error.ok()) {
        error = Status::Corruption("chunk " + std::to_string(index) + " differs at byte " + std::to_string(bad));
      }
    }
    if (next < chunks()) StartNext();
    if (++finished == chunks()) Finish();
  }
  void Finish() {
    Reply(peer, std::string(sending ? "done:send-bulk " : "done:recv-bulk ") + (error.ok() ? "ok" : error.ToString()));
    data = {};
  }
};

void HandleCommand(PeerId peer, const std::string& text) {
  std::istringstream in(text);
  std::string verb;
  in >> verb;
  if (verb == "cmd:big") {
    size_t n = 0;
    uint64_t seed = 0;
    in >> n >> seed;
    std::vector<std::byte> big(n);
    FillPattern(big, seed, 0);
    Status st = g_engine.load()->Send(peer, big);
    if (!st.ok()) std::fprintf(stderr, "test peer: big send failed: %s\n", st.ToString().c_str());
  } else if (verb == "cmd:send-bulk" || verb == "cmd:recv-bulk") {
    auto job = std::make_shared<BulkJob>();
    job->peer = peer;
    job->sending = (verb == "cmd:send-bulk");
    int ring = 0;
    in >> job->tag0 >> job->total >> job->chunk >> job->inflight >> job->seed >> ring;
    job->ring = ring != 0;
    job->Start();
  } else if (verb == "cmd:hello") {
    Reply(peer, "hello " + std::to_string(peer));
  } else {
    Reply(peer, "error: unknown command " + verb);
  }
}

int Main(int argc, char** argv) {
  EngineOptions options;
  std::string connect;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--listen") options.listen = argv[i + 1];
    else if (flag == "--connect") connect = argv[i + 1];
    else if (flag == "--max-message") options.max_message_bytes = std::stoull(argv[i + 1]);
    else if (flag == "--spin-us") options.spin = std::chrono::microseconds(std::stoll(argv[i + 1]));
    else {
      std::fprintf(stderr, "test peer: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  EngineHandlers handlers;
  handlers.on_message = [](PeerId peer, std::span<const std::byte> bytes) {
    if (bytes.size() >= 4 && std::memcmp(bytes.data(), "cmd:", 4) == 0) {
      HandleCommand(peer, AsString(bytes));
      return;
    }
    Status st = g_engine.load()->Send(peer, bytes);  // echo
    if (!st.ok()) std::fprintf(stderr, "test peer: echo failed: %s\n", st.ToString().c_str());
  };
  Result<std::unique_ptr<Engine>> engine = Engine::Start(options, std::move(handlers));
  if (!engine.ok()) {
    std::fprintf(stderr, "test peer: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  g_engine.store(engine->get());
  if (!connect.empty()) {
    Result<PeerId> peer = (*engine)->Connect(connect);
    if (!peer.ok()) {
      std::fprintf(stderr, "test peer: %s\n", peer.status().ToString().c_str());
      return 1;
    }
    std::printf("CONNECTED %lu\n", static_cast<unsigned long>(*peer));
    Reply(*peer, "hello from helper");
  } else {
    std::printf("LISTEN %s\n", (*engine)->listen_address().c_str());
  }
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  engine->reset();  // handlers may use g_engine until the engine is gone
  g_engine.store(nullptr);
  return 0;
}

}  // namespace
}  // namespace viper::net::testing

int main(int argc, char** argv) { return viper::net::testing::Main(argc, argv); }
