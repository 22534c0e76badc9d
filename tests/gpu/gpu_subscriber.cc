// viper_gpu_subscriber: a consumer process for gpu_test: a Subscriber with gpu_device 0 (and
// --in-place, --early: SubscriberOptions::gpu_early) on the node at --connect, driven over stdin,
// one command per line:
//   W <version>   wait (20 s) until a version >= <version> is live; hold it; check it
//   C <version>   check a held version again
//   D <version>   drop a held version (its device buffer or lease goes)
// A check copies the version's device bytes to host memory and compares them with the version's
// host bytes (the snapshot the subscriber verified); it answers
//   OK <version> <in_place 0|1> <bytes> <publish_to_live_us> <how>      or      ERR <reason>
// A device-only version (no host bytes) answers
//   OK <version> <in_place> <bytes> <publish_to_live_us> device-only <xxh3 of the device bytes> <tensors> <how>
// for the test to compare with the producer's sealed checksum.
// Prints "READY" once subscribed. EOF or "Q" ends it.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "viper/gpu.h"
#include "viper/subscriber.h"

using namespace viper;

namespace {
std::string Check(const ModelVersion& mv) {
  if (!mv.device) return "ERR version " + std::to_string(mv.version()) + " has no device copy";
  const DeviceVersion& d = *mv.device;
  const bool device_only = mv.snapshot.bytes().empty();
  auto host = mv.snapshot.data_region();
  if (!device_only && d.bytes != host.size())
    return "ERR device bytes " + std::to_string(d.bytes) + " != host " + std::to_string(host.size());
  if (d.tensors.empty()) return "ERR version " + std::to_string(mv.version()) + ": no tensors listed with its device copy";
  if (d.tensors.back().end > d.bytes) return "ERR the last tensor ends past the device bytes";
  auto s = gpu::Stream::Create(d.device);
  if (!s.ok()) return "ERR " + s.status().ToString();
  std::vector<std::byte> got(d.bytes);
  if (Status st = gpu::CopyDeviceToHost(got.data(), d.data, d.bytes, *s); !st.ok()) return "ERR " + st.ToString();
  if (Status st = s->Synchronize(); !st.ok()) return "ERR " + st.ToString();
  if (!device_only && std::memcmp(got.data(), host.data(), d.bytes) != 0)
    return "ERR version " + std::to_string(mv.version()) + ": device bytes differ from the verified host bytes (" + d.how + ")";
  const int64_t live_us = (mv.timings.live_ns - mv.timings.publish_ns) / 1000;
  std::string early;
  if (device_only)
    early = "device-only " + checksum_hex(checksum64(got)) + " " + std::to_string(d.tensors.size()) + " ";
  return "OK " + std::to_string(mv.version()) + " " + (d.in_place ? "1" : "0") + " " + std::to_string(d.bytes) + " " +
         std::to_string(live_us) + " " + early + d.how;
}
}  // namespace

int main(int argc, char** argv) {
  SubscriberOptions o;
  o.gpu_device = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--connect" && i + 1 < argc) o.connect = argv[++i];
    else if (a == "--model" && i + 1 < argc) o.model = argv[++i];
    else if (a == "--in-place") o.gpu_in_place = true;
    else if (a == "--early") o.gpu_early = true;
    else if (a == "--path" && i + 1 < argc) o.path = *ParseFetchPath(argv[++i]);
    else {
      std::fprintf(stderr, "viper_gpu_subscriber: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto sub = Subscriber::Start(o);
  if (!sub.ok()) {
    std::printf("ERR %s\n", sub.status().ToString().c_str());
    return 1;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  std::map<uint64_t, std::shared_ptr<const ModelVersion>> held;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    if (line[0] == 'Q') break;
    uint64_t version = std::strtoull(line.c_str() + 1, nullptr, 10);
    std::string reply;
    if (line[0] == 'W') {
      auto mv = (*sub)->WaitFor(version, std::chrono::seconds(20));
      if (!mv.ok()) reply = "ERR " + mv.status().ToString() + " (last error: " + (*sub)->last_error().ToString() + ")";
      else {
        held[(*mv)->version()] = *mv;
        reply = Check(**mv);
      }
    } else if (line[0] == 'C') {
      auto it = held.find(version);
      reply = it == held.end() ? "ERR version " + std::to_string(version) + " not held" : Check(*it->second);
    } else if (line[0] == 'D') {
      held.erase(version);
      reply = "DROPPED " + std::to_string(version);
    } else {
      reply = "ERR unknown command " + line;
    }
    std::printf("%s\n", reply.c_str());
    std::fflush(stdout);
  }
  return 0;
}
