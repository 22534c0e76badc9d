// The node's tiers behind its catalog: flushes to the file tier (and what happens to a version
// while its flush is queued or failing), the catalog's pruning, and leases of versions that only
// the file tier holds any more. The rule they keep: every version the catalog lists (ls, LIST, the
// registry) can be fetched, by every path, and a segment replica names the segment that holds it.
#include <algorithm>
#include <optional>

#include "node_impl.h"
#include "viper/log.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "node";
using Key = std::pair<std::string, uint64_t>;
}  // namespace

// Runs at every commit under the node's lock: one sorted list per tier, then binary searches (with
// ~4,000 versions on file, looking each one up in the file tier made an ASan producer spend most
// of each commit here while the UCX thread waited for the lock).
void Node::Impl::PruneLocked(const std::string& model) {
  auto& versions = models[model].versions;
  const std::vector<uint64_t> in_memory = host->versions(model);
  const std::vector<uint64_t> on_file = files ? files->versions(model) : std::vector<uint64_t>{};
  for (auto it = versions.begin(); it != versions.end();) {
    const uint64_t v = it->first;
    const bool committed = std::binary_search(in_memory.begin(), in_memory.end(), v);
    const bool pinned = flushing.count({model, v}) != 0 || unflushed.count({model, v}) != 0;
    const bool filed = std::binary_search(on_file.begin(), on_file.end(), v);
    if (!committed && !pinned) {  // its segment may be recycled for another version: not listed
      std::erase_if(it->second.replicas,
                    [](const proto::Replica& r) { return r.kind == proto::ReplicaKind::kHostSegment; });
    }
    if (committed || pinned || filed) {
      ++it;
      continue;
    }
    // Held by no tier. File retention retires a version once keep_file_versions newer ones are
    // on file; any other way out is a version lost, said so.
    const size_t newer_files = static_cast<size_t>(on_file.end() - std::upper_bound(on_file.begin(), on_file.end(), v));
    if (files && newer_files < files->options().keep_versions) {
      log(LogLevel::kWarn, kLog,
          "{} version {} de-listed: it is in no tier any more (not on the file tier, and its memory copy was "
          "retired)",
          model, v);
      stats.versions_delisted++;
    }
    it = versions.erase(it);
  }
}

void Node::Impl::DropUnflushedLocked(std::map<Key, ReadLease>::iterator it, const char* why) {
  const Key key = it->first;
  unflushed_bytes -= it->second.data().size();
  unflushed.erase(it);
  retrying.erase(key);
  const auto& in_memory = host->versions(key.first);
  if (std::binary_search(in_memory.begin(), in_memory.end(), key.second)) return;  // still held in memory
  log(LogLevel::kWarn, kLog, "{} version {} de-listed: its flush to the file tier failed and {}; it is lost", key.first,
      key.second, why);
  auto state = models.find(key.first);
  if (state != models.end() && state->second.versions.erase(key.second) != 0) stats.versions_delisted++;
  if (registry_agent) registry_agent->CatalogChanged();
}

void Node::Impl::MakeRoomLocked(uint64_t more) {
  while (!unflushed.empty() && flushing_bytes + unflushed_bytes + more > options.unflushed_budget_bytes) {
    auto oldest = std::min_element(unflushed.begin(), unflushed.end(), [](const auto& a, const auto& b) {
      return a.first.second < b.first.second;
    });
    DropUnflushedLocked(oldest, "the memory budget for unflushed versions (unflushed_budget_bytes) needs its segment");
  }
}

// Writes the version to the file tier in the background, from a read lease on its segment, and
// then lists the file as a replica.
// The lease is taken now, not when the flusher gets to it: a producer publishing faster than the
// file tier writes would otherwise see versions retired from memory before they reach the file
// tier, and an announced version would be in neither. Until its file is written, a FETCH of the
// version is served from this lease (AcquireLocked). Pinned versions (queued and failed flushes)
// keep up to unflushed_budget_bytes of shared memory (always the first two queued); beyond that
// the oldest failed one gives way, and a version retired from memory before its turn is reported
// as not persisted and de-listed.
void Node::Impl::QueueFlush(const proto::VersionInfo& info) {
  if (!files) return;
  const Key key{info.model, info.version};
  {
    std::lock_guard<std::mutex> lock(mu);
    MakeRoomLocked(info.size);
    if (flushing.size() < 2 || flushing_bytes + unflushed_bytes + info.size <= options.unflushed_budget_bytes) {
      if (auto lease = host->Acquire(info.model, info.version); lease.ok()) {
        flushing.emplace(key, std::move(lease).value());
        flushing_bytes += info.size;
      }
    }
  }
  flusher->Post([this, key, size = info.size] { FlushNow(key, size, false); });
}

void Node::Impl::FlushNow(const Key& key, uint64_t size, bool retry) {
  const auto& [model, version] = key;
  std::optional<ReadLease> lease;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = flushing.find(key); it != flushing.end()) lease = it->second;
    if (auto it = unflushed.find(key); it != unflushed.end()) lease = it->second;  // a retry
    if (!lease && retry) return;  // its pin was dropped meanwhile (and the version de-listed)
  }
  if (!lease) {
    auto now = host->Acquire(model, version);
    if (!now.ok()) {  // retired by newer versions while the file tier was behind
      log(LogLevel::kError, kLog, "{} version {} not persisted: the file tier fell behind by more than the {} bytes "
          "of unflushed_budget_bytes ({})", model, version, options.unflushed_budget_bytes, now.status().message());
      std::lock_guard<std::mutex> lock(mu);
      stats.flush_errors++;
      PruneLocked(model);
      if (registry_agent) registry_agent->CatalogChanged();
      return;
    }
    lease = std::move(now).value();
  }
  Status st = files->Write(model, version, lease->data());
  if (st.code() == StatusCode::kAlreadyExists && files->Find(model, version)) st = Status::OK();  // a retry's twin
  std::lock_guard<std::mutex> lock(mu);
  retrying.erase(key);
  const bool was_queued = flushing.erase(key) != 0;
  if (was_queued) flushing_bytes -= size;
  if (!st.ok()) {
    stats.flush_errors++;
    auto& versions = models[model].versions;
    const bool listed = versions.count(version) != 0;
    if (!listed) {
      log(LogLevel::kError, kLog, "flush of {} version {} to the file tier failed: {}", model, version, st.message());
      return;
    }
    // Its only copy may be this lease: keep it (the version stays listed and fetchable) until a
    // retry writes it or the budget needs its memory.
    if (unflushed.emplace(key, *lease).second) unflushed_bytes += size;
    log(LogLevel::kError, kLog,
        "flush of {} version {} to the file tier failed: {}; kept in memory until a later flush succeeds ({} "
        "version(s), {} bytes kept so)",
        model, version, st.message(), unflushed.size(), unflushed_bytes);
    MakeRoomLocked(0);
    return;
  }
  stats.files_flushed++;
  if (auto it = unflushed.find(key); it != unflushed.end()) {
    unflushed_bytes -= it->second.data().size();
    unflushed.erase(it);
    log(LogLevel::kInfo, kLog, "{} version {} written to the file tier on a retry", model, version);
  }
  auto& versions = models[model].versions;
  if (auto it = versions.find(version); it != versions.end()) {
    const proto::Replica file{proto::ReplicaKind::kFile, host_key, files->PathFor(model, version).string()};
    if (std::find(it->second.replicas.begin(), it->second.replicas.end(), file) == it->second.replicas.end())
      it->second.replicas.push_back(file);
  }
  // The file tier takes writes again: retry the failed flushes that retention still keeps (the
  // others just let go of their memory: newer files replace them).
  const std::vector<uint64_t> on_file = files->versions(model);
  for (auto it = unflushed.begin(); it != unflushed.end();) {
    const auto& [m, v] = it->first;
    const std::vector<uint64_t> files_of = m == model ? on_file : files->versions(m);
    const size_t newer = static_cast<size_t>(files_of.end() - std::upper_bound(files_of.begin(), files_of.end(), v));
    if (newer >= files->options().keep_versions) {
      unflushed_bytes -= it->second.data().size();
      retrying.erase(it->first);
      it = unflushed.erase(it);
      continue;
    }
    if (retrying.insert(it->first).second)
      flusher->Post([this, k = it->first, n = it->second.data().size()] { FlushNow(k, n, true); });
    ++it;
  }
  PruneLocked(model);
  if (registry_agent) registry_agent->CatalogChanged();
}

void Node::Impl::LeaseFromFile(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info) {
  loader->Post([this, peer, request_id = m.request_id, info] {
    auto fail = [&](proto::ErrorCode code, const Status& why) {
      SendError(peer, request_id, code,
                info.model + " version " + std::to_string(info.version) +
                    " is no longer in memory and loading it from the file tier failed: " + why.message());
    };
    auto entry = files->Find(info.model, info.version);
    if (!entry) return fail(proto::ErrorCode::kNotFound, Status::NotFound("not on the file tier any more"));
    if (entry->size != info.size)
      return fail(proto::ErrorCode::kInternal, Status::Corruption("its file has " + std::to_string(entry->size) +
                                                                  " bytes, the catalog " + std::to_string(info.size)));
    auto lease = host->Allocate(info.size);
    if (!lease.ok()) return fail(OwnFailureCode(lease.status()), lease.status());
    auto read = files->ReadInto(info.model, info.version, lease->data());  // checksum verified
    if (!read.ok()) return fail(proto::ErrorCode::kNotFound, read.status());
    auto held = host->CommitDetached(std::move(lease).value(), info.model, info.version);
    if (!held.ok()) return fail(OwnFailureCode(held.status()), held.status());
    std::lock_guard<std::mutex> lock(mu);
    auto p = peers.find(peer);
    if (p == peers.end()) return;  // gone meanwhile: the segment goes back to the pool with `held`
    proto::FetchOk ok{request_id, proto::FetchMode::kLease, info, held->segment_name(), 0, 0, proto::Encoding::kFull, 0, ""};
    p->second.leases.emplace(std::make_pair(info.model, info.version), std::move(held).value());
    stats.leases_granted++;
    stats.leases_from_file++;
    log(LogLevel::kInfo, kLog, "lease of {} version {} for peer {}: loaded from the file tier into {}", info.model,
        info.version, peer, ok.segment);
    Send(peer, ok);
  });
}

}  // namespace viper
