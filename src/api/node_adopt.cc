// Node start-up after a crash: the versions a killed node left in shared memory are not lost.
//
// A node killed with SIGKILL leaves its segments in /dev/shm (nobody unlinks them), and the ones
// it had committed hold sealed snapshots: the file tier may not have them yet (the flush runs
// after the announce), so without this a version consumers were told about could be gone after a
// restart, and the restarted node would even hand out its number again for other bytes. A node
// with a file tier therefore names its segments after its store directory, and on start writes
// every sealed version it finds in a dead predecessor's segments to the file tier before the
// host tier removes them (docs/RELIABILITY.md, "Kill -9 anywhere").
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "node_impl.h"
#include "viper/log.h"
#include "viper/snapshot.h"

namespace viper::internal {

namespace {

constexpr std::string_view kLog = "node";

// The sealed snapshot in segment `name`, checked like a file (header, checksum, model, version).
Result<Snapshot> ReadSealed(const std::string& name) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size("/dev/shm/" + name, ec);
  if (ec) return Status::NotFound(fmt::format("segment {}: {}", name, ec.message()));
  if (size == 0) return Status::NotFound(fmt::format("segment {} is empty", name));
  VIPER_ASSIGN_OR_RETURN(MappedSegment mapped, MapSegmentReadOnly(name, size));
  VIPER_ASSIGN_OR_RETURN(uint64_t extent, SnapshotExtent(mapped.data));
  ParseOptions parse;
  parse.verify_checksum = true;
  parse.require_checksum = true;
  VIPER_ASSIGN_OR_RETURN(Snapshot snapshot, Snapshot::Parse(mapped.data.first(extent), mapped.owner, parse));
  if (!snapshot.model() || !snapshot.version()) return Status::Corruption("no viper.model or viper.version");
  return snapshot;
}

}  // namespace

std::string SegmentPrefixFor(const NodeOptions& options) {
  if (options.store_dir.empty()) return options.segment_prefix;
  std::error_code ec;
  std::string dir = std::filesystem::weakly_canonical(options.store_dir, ec).string();
  if (ec) dir = std::filesystem::absolute(options.store_dir).lexically_normal().string();
  uint64_t hash = checksum64(std::as_bytes(std::span(dir.data(), dir.size())));
  return fmt::format("{}-{:08x}", options.segment_prefix, static_cast<uint32_t>(hash));
}

size_t AdoptStaleSegments(const std::string& prefix, FileTier& files) {
  size_t adopted = 0;
  for (const std::string& name : HostTier::FindStaleSegments(prefix)) {
    Result<Snapshot> snapshot = ReadSealed(name);
    if (!snapshot.ok()) continue;  // never sealed (a crash mid-write), or a free segment: nothing to keep
    const std::string model = *snapshot->model();
    const uint64_t version = *snapshot->version();
    if (files.Find(model, version)) continue;
    Status written = files.Write(model, version, snapshot->bytes());
    if (!written.ok()) {
      log(LogLevel::kError, kLog, "{} version {} in segment {} of a dead process not recovered: {}", model, version,
          name, written.message());
      continue;
    }
    log(LogLevel::kWarn, kLog, "recovered {} version {} ({} bytes) from segment {} of a dead process", model, version,
        snapshot->bytes().size(), name);
    ++adopted;
  }
  return adopted;
}

}  // namespace viper::internal
