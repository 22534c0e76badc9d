// viper_test_peer: the producer and consumer processes of the integration tests.
//
//   produce --model M --address-file F [--listen A] [--versions N] [--tensor-bytes B] [--store-dir D]
//           [--mode sync|async] [--interval-ms T] [--hang-in-version V] [--state-file S] [--wait-peers N]
//       Publishes N versions as fast as it can (or every T ms), each tensor filled with a byte
//       pattern of its version (pattern.h), then stays up until killed. With --wait-peers N it
//       starts publishing once N peers are connected. With --hang-in-version V it writes
//       half of version V in place (zero-copy draft) and hangs there, writing "hanging V" to S.
//       With --copy each version is copied in by Publish() (the path that announces a version to
//       remote readers while it copies: cut-through); --hang-in-copy V then stalls that copy half
//       way through version V, writing "copying V" to S; --pause-in-copy V pauses it there for
//       --pause-ms T (default 2000), so that a remote reader's FETCH surely finds V being copied.
//   consume --model M --connect A --until V [--threads K] [--path map|copy|auto] --result F [--timeout-s T]
//           [--min-reads R]
//       Reads the live model from K threads in a loop until every thread has seen version >= V
//       (and has read at least R times: a producer may finish before a late consumer's first read),
//       verifying each read (checksum of the data region against the header, version pattern of
//       every tensor), and writes a JSON result.
//   hold --model M --connect A --state-file S [--path map]
//       Takes the live version, holds it (and its lease) forever, writes "holding V" to S.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "pattern.h"
#include "viper/log.h"
#include "api/test_hooks.h"
#include "viper/publisher.h"
#include "viper/subscriber.h"

using namespace viper;

namespace {

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strncmp(argv[i], "--", 2) != 0) {
      std::fprintf(stderr, "test_peer: expected --flag, got %s\n", argv[i]);
      std::exit(2);
    }
    flags[argv[i] + 2] = argv[i + 1];
  }
  return flags;
}

std::string Get(const std::map<std::string, std::string>& f, const std::string& k, const std::string& def = "") {
  auto it = f.find(k);
  return it == f.end() ? def : it->second;
}

void WriteFileAtomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::rename(tmp.c_str(), path.c_str());
}

[[noreturn]] void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "test_peer: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

// The test model: a few tensors of several dtypes, one large.
std::vector<TensorSpec> ModelSpecs(uint64_t big_bytes) {
  return {{"conv1.weight", DType::kF32, {16, 1, 20}},
          {"conv1.bias", DType::kF16, {16}},
          {"dense.weight", DType::kF32, {static_cast<int64_t>(big_bytes / 4)}},
          {"dense.bias", DType::kBF16, {200}},
          {"steps", DType::kI64, {}}};
}

using viper::testing::Pattern;

int Produce(const std::map<std::string, std::string>& f) {
  PublisherOptions options;
  options.model = Get(f, "model", "m");
  options.node.listen = Get(f, "listen", "127.0.0.1:0");
  options.node.store_dir = Get(f, "store-dir");
  options.node.insecure = Get(f, "insecure", "0") == "1";  // a namespace address without a token (tests/xnode)
  auto delta = ParseDeltaMode(Get(f, "delta", "auto"));
  if (!delta.ok()) Die("delta", delta.status());
  options.node.delta = *delta;
  auto mode = ParsePublishMode(Get(f, "mode", "async"));
  if (!mode.ok()) Die("mode", mode.status());
  options.mode = *mode;
  const uint64_t versions = std::stoull(Get(f, "versions", "50"));
  const uint64_t tensor_bytes = std::stoull(Get(f, "tensor-bytes", "4194304"));
  const int interval_ms = std::stoi(Get(f, "interval-ms", "0"));
  const uint64_t hang_in = std::stoull(Get(f, "hang-in-version", "0"));
  const std::string state_file = Get(f, "state-file");
  const bool copy = Get(f, "copy", "0") == "1";
  const uint64_t hang_in_copy = std::stoull(Get(f, "hang-in-copy", "0"));
  const uint64_t pause_in_copy = std::stoull(Get(f, "pause-in-copy", "0"));
  const auto pause = std::chrono::milliseconds(std::stoi(Get(f, "pause-ms", "2000")));
  if (hang_in_copy != 0 || pause_in_copy != 0) {
    auto hooks = std::make_shared<NodeTestHooks>();
    auto paused = std::make_shared<std::atomic<bool>>(false);
    hooks->publish_landed = [hang_in_copy, pause_in_copy, pause, paused, state_file](
                                const std::string&, uint64_t version, uint64_t landed, uint64_t size) {
      if (landed < size / 2) return;
      if (version == pause_in_copy && !paused->exchange(true)) std::this_thread::sleep_for(pause);
      if (version != hang_in_copy) return;
      WriteFileAtomic(state_file, "copying " + std::to_string(version) + "\n");
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    };
    options.node.test_hooks = hooks;
  }

  auto pub = Publisher::Start(options);
  if (!pub.ok()) Die("start", pub.status());
  WriteFileAtomic(Get(f, "address-file"), (*pub)->address() + "\n");
  // Consumers that must see the whole run connect first (--wait-peers N).
  const uint64_t wait_peers = std::stoull(Get(f, "wait-peers", "0"));
  while ((*pub)->node().stats().peers < wait_peers) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto specs = ModelSpecs(tensor_bytes);
  std::vector<std::vector<std::byte>> buffers;
  if (copy) {
    for (const auto& spec : specs) {
      uint64_t n = static_cast<uint64_t>(dtype_size(spec.dtype));
      for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
      buffers.emplace_back(n);
    }
  }
  for (uint64_t v = 1; copy && (v <= versions || hang_in_copy != 0); ++v) {
    std::vector<TensorData> tensors;
    for (size_t i = 0; i < specs.size(); ++i) {
      std::memset(buffers[i].data(), Pattern(v, i), buffers[i].size());
      tensors.push_back({specs[i], buffers[i]});
    }
    PublishInfo info;
    info.step = v * 100;
    info.loss = 1.0 / static_cast<double>(v);
    auto r = (*pub)->Publish(tensors, info);
    if (!r.ok()) Die("publish", r.status());
    if (interval_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
  }
  for (uint64_t v = 1; !copy && (v <= versions || hang_in != 0); ++v) {
    auto draft = (*pub)->Begin(specs);
    if (!draft.ok()) Die("begin", draft.status());
    for (size_t i = 0; i < specs.size(); ++i) {
      auto bytes = draft->tensor(specs[i].name);
      if (v == hang_in && i >= specs.size() / 2) {
        // Half written: persist what must be on the file tier, tell the test, and hang here.
        (void)(*pub)->Wait();
        (void)(*pub)->node().WaitFlushed();
        WriteFileAtomic(state_file, "hanging " + std::to_string(v) + "\n");
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }
      std::memset(bytes.data(), Pattern(v, i), bytes.size());
    }
    PublishInfo info;
    info.step = v * 100;
    info.loss = 1.0 / static_cast<double>(v);
    auto r = (*pub)->Commit(std::move(draft).value(), info);
    if (!r.ok()) Die("commit", r.status());
    if (interval_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
  }
  Status st = (*pub)->Wait();
  if (!st.ok()) Die("wait", st);
  (void)(*pub)->node().WaitFlushed();
  if (!state_file.empty()) WriteFileAtomic(state_file, "published " + std::to_string(versions) + "\n");
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// Checks one read: the header's checksum matches the data, the header's version is the one the
// subscriber says, and every tensor carries that version's pattern (first, middle and last byte).
std::string VerifyRead(const ModelVersion& mv) {
  const Snapshot& s = mv.snapshot;
  auto declared = s.declared_checksum();
  if (!declared) return "no checksum in header";
  if (*declared != s.compute_checksum()) return "checksum mismatch (torn read)";
  if (s.version() != mv.version()) return "header version differs from the announced one";
  const auto& tensors = s.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto d = s.tensor_data(tensors[i]);
    if (d.empty()) continue;
    uint8_t want = Pattern(mv.version(), i);
    for (size_t at : {size_t{0}, d.size() / 2, d.size() - 1})
      if (static_cast<uint8_t>(d[at]) != want) return "tensor " + tensors[i].name + " has another version's bytes";
  }
  return "";
}

int Consume(const std::map<std::string, std::string>& f) {
  SubscriberOptions options;
  options.model = Get(f, "model", "m");
  options.connect = Get(f, "connect");
  auto path = ParseFetchPath(Get(f, "path", "auto"));
  if (!path.ok()) Die("path", path.status());
  options.path = *path;
  const uint64_t until = std::stoull(Get(f, "until", "1"));
  const int threads = std::stoi(Get(f, "threads", "3"));
  const uint64_t min_reads = std::stoull(Get(f, "min-reads", "0"));
  const double timeout_s = std::stod(Get(f, "timeout-s", "60"));
  auto sub = Subscriber::Start(options);
  if (!sub.ok()) Die("subscribe", sub.status());
  // --live-file F: F holds the live version, rewritten after every swap (tests wait on it).
  const std::string live_file = Get(f, "live-file");
  if (!live_file.empty()) {
    (*sub)->OnUpdate([live_file](const std::shared_ptr<const ModelVersion>& mv) {
      WriteFileAtomic(live_file, std::to_string(mv->version()) + "\n");
    });
  }

  std::atomic<uint64_t> reads{0}, errors{0}, regressions{0};
  std::atomic<int> finished{0};
  std::mutex mu;
  std::string first_error;
  std::vector<uint64_t> distinct_seen;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      uint64_t last = 0, mine = 0;
      while (std::chrono::steady_clock::now() < deadline) {
        auto mv = (*sub)->latest();  // one reference for the whole "inference"
        if (!mv) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        std::string err = VerifyRead(*mv);
        reads++, mine++;
        if (!err.empty()) {
          errors++;
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.empty()) first_error = "version " + std::to_string(mv->version()) + ": " + err;
        }
        if (mv->version() < last) regressions++;
        if (mv->version() != last) {
          std::lock_guard<std::mutex> lock(mu);
          distinct_seen.push_back(mv->version());
        }
        last = mv->version();
        if (last >= until && mine >= min_reads) break;
      }
      finished++;
    });
  }
  for (auto& t : pool) t.join();
  auto latest = (*sub)->latest();
  auto stats = (*sub)->stats();
  nlohmann::json result = {{"reads", reads.load()},
                           {"errors", errors.load()},
                           {"first_error", first_error},
                           {"regressions", regressions.load()},
                           {"last_version", latest ? latest->version() : 0},
                           {"updates", stats.updates},
                           {"notifies", stats.notifies},
                           {"path", latest ? std::string(fetch_path_name(latest->path)) : ""},
                           {"notify_ms", latest ? (latest->timings.notified_ns - latest->timings.completed_ns) / 1e6 : -1}};
  WriteFileAtomic(Get(f, "result"), result.dump() + "\n");
  return 0;
}

int Hold(const std::map<std::string, std::string>& f) {
  SubscriberOptions options;
  options.model = Get(f, "model", "m");
  options.connect = Get(f, "connect");
  options.path = FetchPath::kMap;
  auto sub = Subscriber::Start(options);
  if (!sub.ok()) Die("subscribe", sub.status());
  auto mv = (*sub)->WaitFor(1, std::chrono::seconds(30));
  if (!mv.ok()) Die("wait", mv.status());
  // Holding the version holds its lease: newer versions go live beside it, this one stays mapped.
  std::shared_ptr<const ModelVersion> held = *mv;
  WriteFileAtomic(Get(f, "state-file"), "holding " + std::to_string(held->version()) + "\n");
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: viper_test_peer produce|consume|hold --flag value ...\n");
    return 2;
  }
  auto flags = ParseFlags(argc, argv);
  std::string cmd = argv[1];
  if (cmd == "produce") return Produce(flags);
  if (cmd == "consume") return Consume(flags);
  if (cmd == "hold") return Hold(flags);
  std::fprintf(stderr, "test_peer: unknown command %s\n", cmd.c_str());
  return 2;
}
