// viper_delta_codec_bench: the delta codec alone, in memory (docs/BENCHMARKS.md "Delta codec").
// Encodes a target snapshot against a base the way a node does (parts of 4 blocks of 1 MiB taken
// by --threads threads), decodes it on one thread, checks the round trip bit-exact and prints the
// rates next to the physical baselines measured in the same run on the same bytes: a warm memcpy
// of the snapshot and a read of base + target (what any encoder must at least do).
//
//   viper_delta_codec_bench --bf16 256Mi                       case (a) of viper bench --only delta
//   viper_delta_codec_bench --base A.safetensors --target B.safetensors [--threads 2] [--level 1]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include <time.h>

#include "viper/delta.h"
#include "viper/snapshot.h"
#include "viper/units.h"

namespace viper {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// CPU seconds of this process: on a shared machine the wall time includes waiting for a core.
double Cpu() {
  timespec ts;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Case (a) of the delta bench: 8 bf16 tensors; the target moves ~1% of the base's elements by 1 ulp.
std::pair<Snapshot, Snapshot> Bf16Pair(uint64_t bytes) {
  std::vector<uint16_t> words(bytes / 2);
  std::mt19937_64 rng(42);
  std::normal_distribution<float> init(0.0f, 0.02f);
  for (auto& w : words) {
    float f = init(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    w = static_cast<uint16_t>(u >> 16);
  }
  auto build = [&](uint64_t version) {
    std::vector<TensorData> t;
    const size_t per = words.size() / 8;
    for (size_t l = 0; l < 8; ++l)
      t.push_back({{"layer" + std::to_string(l) + ".weight", DType::kBF16, {static_cast<int64_t>(per)}},
                   std::as_bytes(std::span<const uint16_t>(words.data() + l * per, per))});
    VersionStamp stamp;
    stamp.model = "m";
    stamp.version = version;
    return BuildSnapshot(t, stamp, {}, 64).value();
  };
  Snapshot base = build(1);
  std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
  for (size_t k = 0; k < words.size() / 100; ++k) {
    uint16_t& w = words[pick(rng)];
    w = static_cast<uint16_t>((rng() & 1) ? w + 1 : w - 1);
  }
  return {std::move(base), build(2)};
}

struct Args {
  std::string base, target, bf16;
  int threads = 2, reps = 5, level = 1;
  double raw_bits = DeltaOptions{}.raw_plane_entropy_bits;
  uint32_t block = 1u << 20;
};

int Main(const Args& a) {
  std::pair<Snapshot, Snapshot> pair;
  if (!a.bf16.empty()) {
    auto bytes = ParseBytes(a.bf16, "--bf16");
    if (!bytes.ok()) return std::fprintf(stderr, "%s\n", bytes.status().ToString().c_str()), 2;
    pair = Bf16Pair(*bytes);
  } else {
    auto b = Snapshot::OpenFile(a.base);
    auto t = Snapshot::OpenFile(a.target);
    if (!b.ok() || !t.ok()) return std::fprintf(stderr, "cannot open --base/--target\n"), 2;
    pair = {std::move(b).value(), std::move(t).value()};
  }
  const Snapshot& base = pair.first;
  const Snapshot& target = pair.second;
  const uint64_t size = target.bytes().size();
  const uint64_t bck = base.compute_checksum(), tck = target.compute_checksum();
  DeltaOptions o;
  o.block_bytes = a.block;
  o.zstd_level = a.level;
  o.raw_plane_entropy_bits = a.raw_bits;
  auto enc = DeltaEncoder::Make(base, bck, target, tck, o);
  if (!enc.ok()) return std::fprintf(stderr, "%s\n", enc.status().ToString().c_str()), 2;

  // Baselines: a warm memcpy of the target; one read of base + target.
  std::vector<std::byte> dst(size);
  std::memcpy(dst.data(), target.bytes().data(), size);
  double memcpy_s = 1e9, read_s = 1e9;
  uint64_t sink = 0;
  for (int r = 0; r < a.reps; ++r) {
    double t0 = Now();
    std::memcpy(dst.data(), target.bytes().data(), size);
    memcpy_s = std::min(memcpy_s, Now() - t0);
    t0 = Now();
    const auto* x = reinterpret_cast<const uint64_t*>(target.bytes().data());
    const auto* y = reinterpret_cast<const uint64_t*>(base.bytes().data());
    uint64_t acc = 0;
    for (size_t i = 0; i < std::min(base.bytes().size(), size) / 8; ++i) acc |= x[i] ^ y[i];
    sink += acc;
    read_s = std::min(read_s, Now() - t0);
  }

  // Encode as the node does: parts of 4 blocks, taken in turn by the threads.
  constexpr size_t kBlocksPerPart = 4;
  const size_t parts = (enc->blocks() + kBlocksPerPart - 1) / kBlocksPerPart;
  std::vector<std::vector<std::byte>> out(parts);
  double encode_s = 1e9, encode_cpu = 1e9;
  DeltaBlockStats stats;
  for (int r = 0; r < a.reps; ++r) {
    std::atomic<size_t> next{0};
    std::vector<DeltaBlockStats> per(static_cast<size_t>(a.threads));
    double t0 = Now(), c0 = Cpu();
    std::vector<std::thread> pool;
    for (int k = 0; k < a.threads; ++k)
      pool.emplace_back([&, k] {
        DeltaScratch scratch;
        for (size_t p; (p = next++) < parts;) {
          out[p] = {};  // a fresh vector per part, as the node's parts
          if (p == 0) enc->AppendHeader(&out[p]);
          for (size_t i = p * kBlocksPerPart; i < std::min(enc->blocks(), (p + 1) * kBlocksPerPart); ++i)
            enc->EncodeBlock(i, scratch, &out[p], &per[static_cast<size_t>(k)]);
        }
      });
    for (auto& t : pool) t.join();
    encode_s = std::min(encode_s, Now() - t0);
    encode_cpu = std::min(encode_cpu, Cpu() - c0);
    if (r == 0)
      for (auto& s : per) stats.Add(s);
  }
  uint64_t encoded = 0;
  for (auto& p : out) encoded += p.size();

  // Decode on one thread, part by part, into a warm buffer; bit-exact check.
  double decode_s = 1e9, decode_cpu = 1e9;
  bool exact = true;
  for (int r = 0; r < a.reps; ++r) {
    std::memset(dst.data(), 0, size);
    double t0 = Now(), c0 = Cpu();
    DeltaDecoder dec(base.bytes(), bck, dst);
    for (auto& p : out)
      if (Status st = dec.Feed(p); !st.ok()) return std::fprintf(stderr, "decode: %s\n", st.ToString().c_str()), 1;
    decode_s = std::min(decode_s, Now() - t0);
    decode_cpu = std::min(decode_cpu, Cpu() - c0);
    exact &= dec.complete() && std::memcmp(dst.data(), target.bytes().data(), size) == 0;
  }
  auto gbps = [&](double s) { return static_cast<double>(size) / s / 1e9; };
  std::printf("snapshot %s, delta %s (%.1fx), %d encoder threads, zstd level %d, best of %d%s\n",
              HumanBytes(static_cast<double>(size)).c_str(), HumanBytes(static_cast<double>(encoded)).c_str(),
              static_cast<double>(size) / static_cast<double>(encoded), a.threads, a.level, a.reps,
              exact ? "" : "  NOT BIT-EXACT");
  for (int m = 0; m < 4; ++m)
    if (stats.blocks[m] != 0)
      std::printf("  %-6s %6llu blocks, %s -> %s\n", std::string(delta_method_name(static_cast<DeltaMethod>(m))).c_str(),
                  static_cast<unsigned long long>(stats.blocks[m]), HumanBytes(static_cast<double>(stats.target_bytes[m])).c_str(),
                  HumanBytes(static_cast<double>(stats.encoded_bytes[m])).c_str());
  std::printf("  encode %7.1f ms (%5.2f GB/s of target), CPU %7.1f ms (%5.2f GB/s a core)   decode %7.1f ms (%5.2f GB/s), "
              "CPU %7.1f ms (%5.2f GB/s)\n",
              encode_s * 1e3, gbps(encode_s), encode_cpu * 1e3, gbps(encode_cpu), decode_s * 1e3, gbps(decode_s),
              decode_cpu * 1e3, gbps(decode_cpu));
  std::printf("  baselines, same run: memcpy %7.1f ms (%5.2f GB/s); read base + target %7.1f ms (%5.2f GB/s), 1 thread%s\n",
              memcpy_s * 1e3, gbps(memcpy_s), read_s * 1e3, gbps(read_s), sink == 42 ? " " : "");
  std::printf("  encode CPU = %.2fx memcpy, %.2fx read; decode CPU = %.2fx memcpy\n", encode_cpu / memcpy_s,
              encode_cpu / read_s, decode_cpu / memcpy_s);
  return exact ? 0 : 1;
}

}  // namespace
}  // namespace viper

int main(int argc, char** argv) {
  CLI::App app{"viper_delta_codec_bench: the delta codec's encode and decode rates against memcpy"};
  viper::Args a;
  app.add_option("--base", a.base, "base snapshot file");
  app.add_option("--target", a.target, "target snapshot file");
  app.add_option("--bf16", a.bf16, "instead: a synthetic bf16 model of this size, ~1% changed (e.g. 256Mi)");
  app.add_option("--threads", a.threads, "encoder threads")->capture_default_str();
  app.add_option("--reps", a.reps, "repetitions (best kept)")->capture_default_str();
  app.add_option("--level", a.level, "zstd level")->capture_default_str();
  app.add_option("--block", a.block, "block bytes")->capture_default_str();
  app.add_option("--raw-bits", a.raw_bits, "planes above this sampled entropy (bits/byte) are stored raw")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (a.bf16.empty() == (a.base.empty() || a.target.empty())) {
    std::fprintf(stderr, "give --bf16 SIZE or --base FILE --target FILE\n");
    return 2;
  }
  return viper::Main(a);
}
