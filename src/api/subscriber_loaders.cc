// Subscriber: the fetch paths (map, copy, remote, file, another node), ranked by predicted time,
// and the spare receive buffer.
#include "viper/subscriber.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/fd.h"
#include "store/file_tier.h"
#include "store/host_tier.h"
#include "seal.h"
#include "subscriber_impl.h"
#include "viper/log.h"
#include "viper/node.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "subscriber";
}  // namespace

std::vector<internal::PathChoice> Subscriber::Impl::RankPaths(const proto::VersionInfo& info, Client* client) {
  std::vector<FetchPath> candidates;
  bool connected = client != nullptr && client->connected();
  bool same_host = connected && client->same_host();
  if (options.path != FetchPath::kAuto) {
    candidates.push_back(options.path);
  } else {
    // Fallback order (ties keep it): same-node map, same-node copy, remote memory, file.
    if (same_host) candidates.insert(candidates.end(), {FetchPath::kMap, FetchPath::kCopy});
    if (connected) candidates.push_back(FetchPath::kRemote);
  }
  if (!options.file_dir.empty() && options.path != FetchPath::kFile) candidates.push_back(FetchPath::kFile);
  auto ranked = estimator.Rank(candidates, info.size, same_host, connected);
  // A path the user chose comes first even where the file tier is predicted faster: the file tier
  // is its fallback (on a machine whose file tier is memory, tmpfs, it was tried first).
  if (options.path != FetchPath::kAuto)
    std::stable_partition(ranked.begin(), ranked.end(), [&](const auto& c) { return c.path == options.path; });
  return ranked;
}

bool Subscriber::Impl::Replaced(const proto::VersionInfo& info, Client* client) {
  auto known = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return announced && announced->version > info.version;
  };
  if (known()) return true;
  if (!client || !client->connected()) return false;
  auto listed = client->List();
  if (!listed.ok()) return false;
  const proto::VersionInfo* newest = nullptr;
  for (const auto& v : *listed)
    if (v.model == info.model && v.version > info.version && (!newest || v.version > newest->version)) newest = &v;
  if (newest) OnAnnounce(*newest, false, client->address());  // checks its seal, as a NOTIFY's
  return known();
}

Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::Load(const proto::VersionInfo& info) {
  std::shared_ptr<Client> c;
  if (auto ensured = EnsureClient(); ensured.ok()) c = *ensured;
  Status last = Status::Unavailable("no path to " + options.model + " version " + std::to_string(info.version) +
                                    (options.file_dir.empty() ? " (node unreachable and no file_dir)" : ""));
  std::string fallbacks;  // why earlier paths were abandoned, shown in the reason of the one that worked
  DropPartial();  // one left by an earlier version (none normally: Load drops it before returning)
  struct DropAtEnd {  // a partial not finished by any path is dropped when Load returns
    Impl& impl;
    ~DropAtEnd() { impl.DropPartial(); }
  } drop_partial{*this};
  auto ranked = RankPaths(info, c.get());
  AddOtherNodeChoices(info, ranked);
  // The file tier is the last resort: if it was tried before a memory path and had nothing yet
  // (flush still running), it is tried once more after the memory paths failed.
  for (size_t i = 0; i + 1 < ranked.size(); ++i) {
    if (ranked[i].path != FetchPath::kFile) continue;
    ranked.push_back(ranked[i]);
    ranked.back().reason += " (again: the memory paths failed)";
    break;
  }
  for (const auto& choice : ranked) {
    int64_t start = WallClockNs();
    auto mv = choice.node.empty() ? LoadVia(choice.path, info, c) : LoadFromOtherNode(choice.node, info);
    if (mv.ok()) {
      estimator.Record(choice.path, (*mv)->info.size, WallClockNs() - start);
      std::string how = (*mv)->reason.empty() ? choice.reason : choice.reason + "; " + (*mv)->reason;  // e.g. the delta
      (*mv)->reason = fallbacks.empty() ? how : how + "; after " + fallbacks;
      if (!fallbacks.empty())
        log(LogLevel::kWarn, kLog, "{} version {} loaded via {} ({})", options.model, (*mv)->version(),
            fetch_path_name(choice.path), (*mv)->reason);
      return mv;
    }
    last = mv.status();
    if (last.code() == StatusCode::kNotFound && Replaced(info, c.get())) return last;  // skipped: see Replaced
    if (&choice != &ranked.back())  // the last path's failure is the load's: the caller reports it
      log(LogLevel::kWarn, kLog, "{} version {} via {} failed: {}; trying the next path", options.model, info.version,
          fetch_path_name(choice.path), last.message());
    fallbacks += (fallbacks.empty() ? "" : "; ") + std::string(fetch_path_name(choice.path)) +
                 (choice.node.empty() ? "" : " from " + choice.node) + " failed: " + last.message();
    // The node refusing a request (no such version any more) leaves the connection healthy and
    // nothing posted into the buffer: keep it, with its leases and subscription.
    const StatusCode code = last.code();
    const bool refused = code == StatusCode::kNotFound || code == StatusCode::kFailedPrecondition ||
                         code == StatusCode::kInvalidArgument || code == StatusCode::kPermissionDenied;
    if (c && choice.node.empty() && ((choice.path == FetchPath::kRemote && !refused) || !c->connected())) {
      DropClient(c);
      if (poisoned_buffer) retired_buffers.emplace_back(c, std::move(poisoned_buffer));
      c.reset();
    }
    if (!c) poisoned_buffer.reset();  // the engine that posted receives into it is gone (or retired)
    std::erase_if(retired_buffers, [](const auto& r) { return r.first.expired(); });
  }
  return last;
}

Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::LoadVia(FetchPath path, const proto::VersionInfo& info,
                                                                 const std::shared_ptr<Client>& client) {
  if (path == FetchPath::kFile) return LoadFile(info);
  if (client == nullptr) return Status::Unavailable("not connected to node " + CurrentNode());
  if (path == FetchPath::kRemote) return LoadRemote(info, *client, client);
  if (!client->same_host()) return Status::FailedPrecondition("map/copy need the node on this host");
  return LoadLeased(path, info, client);
}

// Remembers the other nodes in `info`'s replica list and, when a remote transfer is a candidate
// (not pinned to map/copy/file), adds one per other node known, right after our node's remote
// path (or before the file tier when our node is unreachable).
void Subscriber::Impl::AddOtherNodeChoices(const proto::VersionInfo& info, std::vector<internal::PathChoice>& ranked) {
  constexpr size_t kMaxOtherNodes = 4;
  for (const auto& r : info.replicas) {
    bool node = r.kind == proto::ReplicaKind::kNode || r.kind == proto::ReplicaKind::kRelay;
    if (!node || r.locator == CurrentNode()) continue;
    std::erase(other_nodes, r.locator);
    other_nodes.insert(other_nodes.begin(), r.locator);
  }
  if (other_nodes.size() > kMaxOtherNodes) other_nodes.resize(kMaxOtherNodes);
  if (options.path != FetchPath::kAuto && options.path != FetchPath::kRemote) return;
  if (other_nodes.empty()) return;
  auto at = std::find_if(ranked.begin(), ranked.end(), [](const auto& c) { return c.path == FetchPath::kRemote; });
  if (at != ranked.end()) {
    ++at;
  } else {
    at = std::find_if(ranked.begin(), ranked.end(), [](const auto& c) { return c.path == FetchPath::kFile; });
  }
  std::vector<internal::PathChoice> extra;
  for (const auto& node : other_nodes)
    extra.push_back({FetchPath::kRemote, 0, "remote from node " + node + " (another replica)", node});
  ranked.insert(at, extra.begin(), extra.end());
}

// A remote transfer from another node, over a connection made for it and closed after it.
Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::LoadFromOtherNode(const std::string& node,
                                                                          const proto::VersionInfo& info) {
  // A buffer an earlier broken transfer poisoned stays aside; one this transfer poisons is safe
  // again once the client below (and its engine) is gone.
  auto earlier_poisoned = std::move(poisoned_buffer);
  Result<std::shared_ptr<ModelVersion>> loaded = Status::Unavailable("not tried");
  {
    auto other = Client::Connect(ClientOptionsFor(node));
    loaded = other.ok() ? LoadRemote(info, **other) : Result<std::shared_ptr<ModelVersion>>(other.status());
  }  // a partial this transfer left is safe to resume into: the engine that posted its receives is gone
  poisoned_buffer = std::move(earlier_poisoned);
  return loaded;
}

// Parses `bytes` into `mv`, tying them to `owner`, and verifies them if asked (with the checksum
// computed during the transfer when there is one, else with one pass now).
Status Subscriber::Impl::Finish(ModelVersion& mv, std::span<const std::byte> bytes, std::shared_ptr<const void> owner,
                                bool verify, std::optional<uint64_t> hashed) {
  if (bytes.size() != mv.info.size)
    return Status::Corruption("received " + std::to_string(bytes.size()) + " bytes, announced " + std::to_string(mv.info.size));
  VIPER_ASSIGN_OR_RETURN(mv.snapshot, Snapshot::Parse(bytes, std::move(owner)));
  if (verify) {
    uint64_t sum = hashed ? *hashed : mv.snapshot.compute_checksum();
    if (sum != mv.info.checksum)
      return Status::Corruption(options.model + " version " + std::to_string(mv.info.version) + ": checksum " +
                                checksum_hex(sum) + " != announced " + checksum_hex(mv.info.checksum));
  }
  mv.timings.verified_ns = WallClockNs();
  return Status::OK();
}

// map: zero copy under a lease held until the version is dropped; copy: into our own buffer.
Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::LoadLeased(FetchPath path, const proto::VersionInfo& info,
                                                                    const std::shared_ptr<Client>& client) {
  VIPER_ASSIGN_OR_RETURN(proto::FetchOk ok, client->FetchLease(info.model, info.version));
  auto release = client->Releaser(ok.info.model, ok.info.version);
  auto mapped = mappings.Map(ok.segment, ok.info.size);  // kept from an earlier version in it, or mapped now
  if (!mapped.ok()) {
    release();
    return mapped.status();
  }
  auto mv = std::make_shared<ModelVersion>();
  mv->info = ok.info;
  mv->path = path;
  if (path == FetchPath::kMap) {
    struct LeaseHold {
      std::shared_ptr<Client> connection;  // the lease lives on it: it must not close first
      std::shared_ptr<const void> mapping;
      std::function<void()> release;
      LeaseHold() = default;
      LeaseHold(const LeaseHold&) = delete;
      LeaseHold& operator=(const LeaseHold&) = delete;
      ~LeaseHold() {
        if (release) release();
      }
    };
    // Built in place: a temporary LeaseHold would release the lease in its own destructor.
    auto hold = std::make_shared<LeaseHold>();
    hold->connection = client;
    hold->mapping = mapped->owner;
    hold->release = std::move(release);
    mv->timings.fetched_ns = WallClockNs();
    VIPER_RETURN_IF_ERROR(Finish(*mv, mapped->data, hold, options.verify_checksum && options.verify_local));
    return mv;
  }
  auto buffer = pool->Acquire(ok.info.size);
  if (!buffer.ok()) {
    release();
    return buffer.status();
  }
  std::memcpy(buffer->data.data(), mapped->data.data(), ok.info.size);
  release();
  mv->timings.fetched_ns = WallClockNs();
  VIPER_RETURN_IF_ERROR(Finish(*mv, buffer->data, buffer->owner, options.verify_checksum && options.verify_local));
  return mv;
}

Result<std::span<std::byte>> Subscriber::Impl::ReceiveBuffer(const proto::VersionInfo& actual,
                                                               internal::BufferPool::Lease* buffer, ProgressFn* landed,
                                                               const DeltaBase* delta_base, DeltaPartFn* delta_part) {
  if (options.landing) {  // e.g. a relay: straight into its node's segment, forwarded as it lands
    VIPER_ASSIGN_OR_RETURN(LandingZone::Landing landing,
                           delta_base ? options.landing->LandDelta(actual, delta_base->version, delta_base->checksum)
                                      : options.landing->Land(actual));
    if (landing.bytes.size() != actual.size) return Status::Internal("landing zone of the wrong size");
    *buffer = {std::move(landing.owner), landing.bytes};
    if (landing.landed) *landed = [fn = std::move(landing.landed)](uint64_t done, uint64_t) { fn(done); };
    if (delta_base && delta_part && landing.delta_part) *delta_part = std::move(landing.delta_part);
    return buffer->data;
  }
  VIPER_ASSIGN_OR_RETURN(*buffer, pool->Acquire(actual.size));
  return buffer->data;
}

Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::LoadRemote(const proto::VersionInfo& info, Client& client,
                                                                   const std::shared_ptr<Client>& shared) {
  if (partial) return LoadResumed(info, client, shared);
  std::string delta_failed;
  if (auto delta = LoadRemoteDelta(info, client, shared)) {
    if (!delta->retry_in_full || !client.connected()) return std::move(delta->result);
    if (delta->result.status().code() == StatusCode::kNotFound && Replaced(info, &client))
      return std::move(delta->result);  // its base (or itself) retired: the newer version is fetched instead
    delta_failed = delta->result.status().message();  // the same connection fetches the full snapshot
    {
      std::lock_guard<std::mutex> lock(mu);
      stats.delta_fallbacks++;
    }
    log(LogLevel::kWarn, kLog, "{}; fetching it in full", delta_failed);
  }
  internal::BufferPool::Lease buffer;
  ProgressFn landed;
  auto provide = [&](const proto::VersionInfo& actual) { return ReceiveBuffer(actual, &buffer, &landed); };
  // The checksum is computed while the chunks arrive (FetchSend), not in a pass after them; so is
  // the copy to this consumer's GPU, if it has one.
  std::shared_ptr<DeviceStaging> staging = gpu ? StageOnDevice(info, client) : nullptr;
  std::optional<uint64_t> received_checksum;
  TransferPrefix prefix;
  auto ok = client.FetchSend(
      info.model, info.version, provide,
      [&](uint64_t done, uint64_t total) {
        if (landed) landed(done, total);
        if (staging) StageReceived(*staging, buffer.data, done, total);
      },
      options.verify_checksum ? &received_checksum : nullptr, &prefix);
  if (!ok.ok()) {
    // What landed is finished by the next holder tried (a FETCH with an offset).
    if (prefix.landed > 0 && buffer.owner) {
      KeepPartial(std::move(prefix), std::move(buffer), std::move(landed), client.address(), shared);
      return ok.status();
    }
    // Receives may still be posted into the buffer: it is only safe to reuse once the client's
    // engine is gone, so Load() keeps it here until it has dropped the client.
    poisoned_buffer = std::move(buffer.owner);
    return ok.status();
  }
  auto mv = std::make_shared<ModelVersion>();
  mv->info = ok->info;
  mv->path = FetchPath::kRemote;
  mv->wire_bytes = ok->info.size;
  if (!delta_failed.empty()) mv->reason = "full after the delta failed: " + delta_failed;
  if (ok->encoding == proto::Encoding::kFullSealedLater) {
    // Received while the node's producer (or upstream) still wrote it: its identity came last.
    VIPER_RETURN_IF_ERROR(internal::CheckSeal(options.token, ok->info, "node " + client.address()));
    mv->reason = std::string(kSealedLaterReason) + (mv->reason.empty() ? "" : "; " + mv->reason);
  }
  mv->timings.fetched_ns = WallClockNs();
  VIPER_RETURN_IF_ERROR(Finish(*mv, buffer.data, buffer.owner, options.verify_checksum, received_checksum));
  if (staging) FinishStaging(*staging, *mv);
  return mv;
}

// The file tier as seen from here: the announced version if its file exists, else the newest
// complete file (a node that died before flushing leaves the previous one).
Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::LoadFile(const proto::VersionInfo& info) {
  namespace fs = std::filesystem;
  fs::path dir = options.file_dir / info.model;
  uint64_t chosen = 0;
  std::error_code ec;
  if (fs::exists(dir / (std::to_string(info.version) + ".safetensors"), ec)) {
    chosen = info.version;
  } else {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      std::string name = entry.path().filename().string();
      if (!name.ends_with(".safetensors")) continue;
      std::string stem = name.substr(0, name.size() - 12);
      if (stem.empty() || stem.find_first_not_of("0123456789") != std::string::npos || stem.size() > 19) continue;
      chosen = std::max<uint64_t>(chosen, std::stoull(stem));
    }
    if (ec) return Status::NotFound("file tier " + dir.string() + ": " + ec.message());
  }
  auto current = live.load();
  if (chosen == 0 || (current && chosen <= current->version()))
    return Status::NotFound("file tier " + dir.string() + " has no version newer than the live one");
  fs::path path = dir / (std::to_string(chosen) + ".safetensors");
  struct stat st{};
  auto fd = OpenRegularFile(path.string(), &st);
  if (!fd.ok()) return fd.status().WithContext(path.string());
  VIPER_ASSIGN_OR_RETURN(auto buffer, pool->Acquire(static_cast<size_t>(st.st_size)));
  size_t done = 0;
  while (done < buffer.data.size()) {
    ssize_t n = ::pread(fd->get(), buffer.data.data() + done, std::min<size_t>(8u << 20, buffer.data.size() - done),
                        static_cast<off_t>(done));
    if (n == 0) return Status::Corruption(path.string() + ": file shrank while reading");
    if (n < 0) return Status::FromErrno("read " + path.string());
    done += static_cast<size_t>(n);
  }
  auto mv = std::make_shared<ModelVersion>();
  mv->path = FetchPath::kFile;
  mv->timings.fetched_ns = WallClockNs();
  ParseOptions parse;
  parse.verify_checksum = true;
  parse.require_checksum = true;  // files are verified against their own declared checksum
  VIPER_ASSIGN_OR_RETURN(mv->snapshot, Snapshot::Parse(buffer.data, buffer.owner, parse));
  mv->info = chosen == info.version ? info : proto::VersionInfo{};
  mv->info.model = info.model;
  mv->info.version = chosen;
  mv->info.size = buffer.data.size();
  mv->info.checksum = mv->snapshot.compute_checksum();
  if (chosen != info.version) mv->info.step = mv->snapshot.step().value_or(0);
  mv->info.replicas = {{proto::ReplicaKind::kFile, "", path.string()}};
  mv->timings.verified_ns = WallClockNs();
  return mv;
}

void Subscriber::Impl::KeepSpareLater(uint64_t size) {
  spare->Post([pool = pool, size, model = options.model] {
    Status st = pool->KeepSpare(size);
    if (!st.ok()) log(LogLevel::kWarn, kLog, "no spare receive buffer for {}: {}", model, st.message());
  });
}

}  // namespace viper
