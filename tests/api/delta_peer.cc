// viper_delta_peer: the consumer process of tests/api/delta_node_test.cc.
//
//   consume --model M --connect A --until V --result F [--progress P] [--timeout-s T]
//       Subscribes over the remote path (deltas allowed) until version >= V is live. Every update
//       is compared with the test model (tests/api/delta_model.h) bit for bit; after each one the
//       live version is written to P. Writes a JSON result to F: one entry per update (version,
//       delta_base, wire_bytes, reason, error) and the subscriber's counters.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "delta_model.h"
#include "viper/subscriber.h"

using namespace viper;

namespace {

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 2; i + 1 < argc; i += 2) flags[argv[i] + 2] = argv[i + 1];
  return flags;
}

void WriteFileAtomic(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::rename(tmp.c_str(), path.c_str());
}

int Consume(std::map<std::string, std::string> f) {
  SubscriberOptions options;
  options.model = f["model"];
  options.connect = f["connect"];
  options.path = FetchPath::kRemote;
  options.buffers = 2;
  const uint64_t until = std::stoull(f["until"]);
  const int timeout_s = f.count("timeout-s") ? std::stoi(f["timeout-s"]) : 120;
  auto sub = Subscriber::Start(options);
  if (!sub.ok()) {
    std::fprintf(stderr, "delta_peer: %s\n", sub.status().ToString().c_str());
    return 1;
  }
  std::mutex mu;
  nlohmann::json updates = nlohmann::json::array();
  auto record = [&](const std::shared_ptr<const ModelVersion>& mv) {
    std::string error = testing::CompareWithDeltaModel(mv->snapshot, mv->version());
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& u : updates)
      if (u["version"] == mv->version()) return;  // the first version can be seen twice
    updates.push_back({{"version", mv->version()}, {"delta_base", mv->delta_base}, {"wire_bytes", mv->wire_bytes},
                       {"bytes", mv->info.size}, {"reason", mv->reason}, {"error", error}});
    WriteFileAtomic(f["progress"], std::to_string(mv->version()) + "\n");
  };
  (*sub)->OnUpdate(record);
  if (auto first = (*sub)->latest()) record(first);  // live before the callback was set
  auto reached = (*sub)->WaitFor(until, std::chrono::seconds(timeout_s));
  auto stats = (*sub)->stats();
  (*sub)->Close();
  std::lock_guard<std::mutex> lock(mu);
  nlohmann::json result = {{"updates", updates},
                           {"reached", reached.ok()},
                           {"last_error", (*sub)->last_error().message()},
                           {"deltas", stats.deltas},
                           {"delta_fallbacks", stats.delta_fallbacks},
                           {"skipped", stats.skipped},
                           {"fetch_failures", stats.fetch_failures}};
  WriteFileAtomic(f["result"], result.dump(1));
  return reached.ok() ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "consume") != 0) {
    std::fprintf(stderr, "usage: viper_delta_peer consume --model M --connect A --until V --result F\n");
    return 2;
  }
  return Consume(ParseFlags(argc, argv));
}
