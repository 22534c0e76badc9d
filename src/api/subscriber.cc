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

#include "subscriber_impl.h"
#include "viper/file_tier.h"
#include "viper/host_tier.h"
#include "viper/log.h"
#include "viper/node.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "subscriber";
}  // namespace

Result<FetchPath> ParseFetchPath(std::string_view name) {
  if (name == "auto") return FetchPath::kAuto;
  if (name == "map") return FetchPath::kMap;
  if (name == "copy") return FetchPath::kCopy;
  if (name == "remote") return FetchPath::kRemote;
  if (name == "file") return FetchPath::kFile;
  return Status::InvalidArgument("fetch path '" + std::string(name) + "' is not one of auto|map|copy|remote|file");
}

std::string_view fetch_path_name(FetchPath path) {
  switch (path) {
    case FetchPath::kAuto: return "auto";
    case FetchPath::kMap: return "map";
    case FetchPath::kCopy: return "copy";
    case FetchPath::kRemote: return "remote";
    case FetchPath::kFile: return "file";
  }
  return "?";
}

void Subscriber::Impl::OnAnnounce(const proto::VersionInfo& info, bool incoming) {
  std::lock_guard<std::mutex> lock(mu);
  stats.notifies++;
  if (info.model != options.model) return;
  // A version whose pipelined load failed is loaded again once its node has it complete.
  bool retry = !incoming && announced_incoming && announced && announced->version == info.version &&
               failed_version == info.version;
  if (announced && announced->version >= info.version && !retry) return;
  auto current = live.load();
  if (announced && announced->version < info.version && (!current || announced->version > current->version()))
    stats.skipped++;  // superseded before load
  if (retry) failed_version = 0;
  announced = info;
  announced_incoming = incoming;
  announced_ns = WallClockNs();
  cv.notify_all();
}

ClientOptions Subscriber::Impl::ClientOptionsFor(const std::string& node) const {
  ClientOptions co;
  co.connect = node;
  co.token = options.token;
  co.name = options.name;
  co.timeout = options.request_timeout;
  co.chunk_bytes = options.chunk_bytes;
  return co;
}

Result<std::shared_ptr<Client>> Subscriber::Impl::EnsureClient() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (client && client->connected()) return client;
  }
  ClientHandlers handlers;
  // A connection may outlive this subscriber (a mapped version handed out holds it, with its
  // lease): its handlers reach the subscriber only while it exists.
  std::weak_ptr<Impl> self = weak_from_this();
  handlers.on_notify = [self](const proto::VersionInfo& info) {
    if (auto impl = self.lock()) impl->OnAnnounce(info, false);
  };
  handlers.on_incoming = [self](const proto::VersionInfo& info) {
    if (auto impl = self.lock()) impl->OnAnnounce(info, true);
  };
  handlers.on_disconnect = [self](const Status& why) {
    auto impl = self.lock();
    if (!impl) return;
    log(LogLevel::kWarn, kLog, "{}", why.message());
    std::lock_guard<std::mutex> lock(impl->mu);
    impl->cv.notify_all();
  };
  // The configured node first, then the alternates, in order (with a registry: the node it
  // named, then the nearest other holders).
  Result<std::unique_ptr<Client>> fresh = Status::Unavailable("no node to connect to");
  std::string address;
  if (registry) fresh = ConnectViaRegistry(handlers, &address);
  for (size_t i = 0; !registry && i <= options.alternates.size(); ++i) {
    address = i == 0 ? options.connect : options.alternates[i - 1];
    fresh = Client::Connect(ClientOptionsFor(address), handlers);
    if (fresh.ok()) break;
    if (i < options.alternates.size())
      log(LogLevel::kWarn, kLog, "{}; trying {}", fresh.status().message(), options.alternates[i]);
  }
  if (!fresh.ok()) return fresh.status();
  std::shared_ptr<Client> shared(std::move(fresh).value());
  // Versions still arriving at the node are worth fetching only over the network (a consumer on
  // the node's host maps complete versions).
  bool pipelined = options.pipelined && (!shared->same_host() || options.path == FetchPath::kRemote);
  VIPER_RETURN_IF_ERROR(shared->Subscribe(options.model, pipelined ? proto::kSubscribeIncoming : 0));
  std::lock_guard<std::mutex> lock(mu);
  client = shared;
  node_address = address;
  return shared;
}

void Subscriber::Impl::DropClient(const std::shared_ptr<Client>& broken) {
  std::lock_guard<std::mutex> lock(mu);
  if (client == broken) client.reset();
}

// Predicted time of each usable path, cheapest first (DESIGN.md §7).
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
  return estimator.Rank(candidates, info.size, same_host, connected);
}

Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::Load(const proto::VersionInfo& info) {
  std::shared_ptr<Client> c;
  if (auto ensured = EnsureClient(); ensured.ok()) c = *ensured;
  Status last = Status::Unavailable("no path to " + options.model + " version " + std::to_string(info.version) +
                                    (options.file_dir.empty() ? " (node unreachable and no file_dir)" : ""));
  std::string fallbacks;  // why earlier paths were abandoned, shown in the reason of the one that worked
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
  if (path == FetchPath::kRemote) return LoadRemote(info, *client);
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
  }
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
  auto mapped = MapSegmentReadOnly(ok.segment, ok.info.size, /*populate=*/path == FetchPath::kCopy);
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
                                                               internal::BufferPool::Lease* buffer, ProgressFn* landed) {
  if (options.landing) {  // e.g. a relay: straight into its node's segment, forwarded as it lands
    VIPER_ASSIGN_OR_RETURN(LandingZone::Landing landing, options.landing->Land(actual));
    if (landing.bytes.size() != actual.size) return Status::Internal("landing zone of the wrong size");
    *buffer = {std::move(landing.owner), landing.bytes};
    if (landing.landed) *landed = [fn = std::move(landing.landed)](uint64_t done, uint64_t) { fn(done); };
    return buffer->data;
  }
  VIPER_ASSIGN_OR_RETURN(*buffer, pool->Acquire(actual.size));
  return buffer->data;
}

Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::LoadRemote(const proto::VersionInfo& info, Client& client) {
  std::string delta_failed;
  if (auto delta = LoadRemoteDelta(info, client)) {
    if (!delta->retry_in_full || !client.connected()) return std::move(delta->result);
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
  // The checksum is computed while the chunks arrive (FetchSend), not in a pass after them.
  std::optional<uint64_t> received_checksum;
  auto ok = client.FetchSend(
      info.model, info.version, provide, [&](uint64_t done, uint64_t total) { if (landed) landed(done, total); },
      options.verify_checksum ? &received_checksum : nullptr);
  if (!ok.ok()) {
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
  mv->timings.fetched_ns = WallClockNs();
  VIPER_RETURN_IF_ERROR(Finish(*mv, buffer.data, buffer.owner, options.verify_checksum, received_checksum));
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
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("open " + path.string());
  struct stat st{};
  ::fstat(fd, &st);
  auto buffer = pool->Acquire(static_cast<size_t>(st.st_size));
  if (!buffer.ok()) return ::close(fd), buffer.status();
  size_t done = 0;
  while (done < buffer->data.size()) {
    ssize_t n = ::pread(fd, buffer->data.data() + done, std::min<size_t>(8u << 20, buffer->data.size() - done),
                        static_cast<off_t>(done));
    if (n <= 0) {
      Status err = n == 0 ? Status::Corruption(path.string() + ": file shrank while reading")
                          : Status::FromErrno("read " + path.string());
      ::close(fd);
      return err;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  auto mv = std::make_shared<ModelVersion>();
  mv->path = FetchPath::kFile;
  mv->timings.fetched_ns = WallClockNs();
  ParseOptions parse;
  parse.verify_checksum = true;
  parse.require_checksum = true;  // files are verified against their own declared checksum
  VIPER_ASSIGN_OR_RETURN(mv->snapshot, Snapshot::Parse(buffer->data, buffer->owner, parse));
  mv->info = chosen == info.version ? info : proto::VersionInfo{};
  mv->info.model = info.model;
  mv->info.version = chosen;
  mv->info.size = buffer->data.size();
  mv->info.checksum = mv->snapshot.compute_checksum();
  if (chosen != info.version) mv->info.step = mv->snapshot.step().value_or(0);
  mv->info.replicas = {{proto::ReplicaKind::kFile, "", path.string()}};
  mv->timings.verified_ns = WallClockNs();
  return mv;
}

void Subscriber::Impl::Run() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    auto current = live.load();
    uint64_t live_version = current ? current->version() : 0;
    auto ready = [&] {
      return closing || (announced && announced->version > live_version && announced->version != failed_version);
    };
    WaitConnected(lock, ready);
    if (closing) return;
    proto::VersionInfo info = *announced;
    int64_t notified = announced_ns;
    lock.unlock();

    auto loaded = Load(info);
    lock.lock();
    if (!loaded.ok()) {
      stats.fetch_failures++;
      last_error = loaded.status();
      failed_version = info.version;  // wait for a newer NOTIFY (or a reconnect) before retrying
      log(LogLevel::kError, kLog, "could not load {} version {}: {}", options.model, info.version, last_error.message());
      continue;
    }
    std::shared_ptr<ModelVersion> mv = std::move(loaded).value();
    mv->timings.publish_ns = mv->info.publish_ns;
    mv->timings.completed_ns = mv->info.completed_ns;
    mv->timings.notified_ns = notified;
    mv->timings.live_ns = WallClockNs();
    if (mv->version() <= live_version) continue;  // e.g. the file path found nothing newer
    std::shared_ptr<const ModelVersion> frozen = mv;
    live.store(frozen);
    stats.updates++;
    if (mv->delta_base != 0) stats.deltas++;
    auto listeners = callbacks;
    auto c = client;
    cv.notify_all();
    lock.unlock();
    if (c && options.ack_on_live) c->Ack(frozen->info.model, frozen->version());
    for (auto& cb : listeners) cb(frozen);
    // The next version needs a second buffer while readers hold this one: map and fault it in
    // now, between versions, on the spare thread: a version announced meanwhile is fetched at
    // once, into the spare as it is being populated (BufferPool::KeepSpare). A remote version
    // received into a landing zone needs none.
    if (frozen->path != FetchPath::kMap && !(frozen->path == FetchPath::kRemote && options.landing))
      KeepSpareLater(frozen->info.size);
    lock.lock();
  }
}

std::string Subscriber::Impl::CurrentNode() {
  std::lock_guard<std::mutex> lock(mu);
  if (!node_address.empty()) return node_address;
  return registry ? registry_node : options.connect;
}

// Waits until `ready`; while the connection to the node is down (the node restarted, died, or a
// broken transfer dropped it) reconnects, to the node or an alternate, every kReconnectInterval,
// so that announcements resume.
void Subscriber::Impl::WaitConnected(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready) {
  constexpr auto kReconnectInterval = std::chrono::seconds(1);
  while (!ready()) {
    if (client && client->connected()) {
      cv.wait(lock, [&] { return ready() || !(client && client->connected()); });
      continue;
    }
    lock.unlock();
    bool connected = EnsureClient().ok();
    lock.lock();
    if (connected) failed_version = 0;  // a version whose load failed while the node was away: try again
    if (!connected) cv.wait_for(lock, kReconnectInterval, ready);
  }
}

void Subscriber::Impl::KeepSpareLater(uint64_t size) {
  spare->Post([pool = pool, size, model = options.model] {
    Status st = pool->KeepSpare(size);
    if (!st.ok()) log(LogLevel::kWarn, kLog, "no spare receive buffer for {}: {}", model, st.message());
  });
}

Subscriber::Subscriber(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Subscriber::~Subscriber() { Close(); }

Result<std::unique_ptr<Subscriber>> Subscriber::Start(const SubscriberOptions& options) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(options.model));
  if (options.chunk_bytes < (64u << 10)) return Status::InvalidArgument("chunk_bytes must be >= 64 KiB");
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->pool = std::make_shared<internal::BufferPool>(std::max<size_t>(options.buffers, 1));
  VIPER_RETURN_IF_ERROR(impl->StartRegistry());
  auto client = impl->EnsureClient();
  if (!client.ok() && options.file_dir.empty() && !impl->registry) return client.status();
  if (!client.ok())
    log(LogLevel::kWarn, kLog, "{}; {}", client.status().message(),
        impl->registry ? "waiting for a node to announce it" : "serving from the file tier only");
  impl->spare = std::make_unique<internal::TaskQueue>("subscriber-spare");
  impl->loader = std::thread([raw = impl.get()] { raw->Run(); });
  return std::unique_ptr<Subscriber>(new Subscriber(std::move(impl)));
}

std::shared_ptr<const ModelVersion> Subscriber::latest() const { return impl_->live.load(); }

Result<std::shared_ptr<const ModelVersion>> Subscriber::WaitFor(uint64_t min_version, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  bool reached = impl_->cv.wait_for(lock, timeout, [&] {
    auto v = impl_->live.load();
    return impl_->closing || (v && v->version() >= min_version);
  });
  auto v = impl_->live.load();
  if (reached && v && v->version() >= min_version) return v;
  if (impl_->closing) return Status::Cancelled("subscriber closed");
  return Status::Timeout("version " + std::to_string(min_version) + " of " + impl_->options.model + " not live within " +
                         std::to_string(timeout.count()) + " ms (live: " + (v ? std::to_string(v->version()) : "none") + ")");
}

void Subscriber::OnUpdate(std::function<void(const std::shared_ptr<const ModelVersion>&)> callback) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->callbacks.push_back(std::move(callback));
}

SubscriberStats Subscriber::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

Status Subscriber::last_error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_error;
}

Status Subscriber::Ack(uint64_t version) {
  std::shared_ptr<Client> c;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    c = impl_->client;
  }
  if (!c || !c->connected()) return Status::FailedPrecondition("ack of " + impl_->options.model + " version " + std::to_string(version) + ": not connected to a node");
  c->Ack(impl_->options.model, version);
  return Status::OK();
}

void Subscriber::Close() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->closing && !impl_->loader.joinable()) return;
    impl_->closing = true;
    impl_->cv.notify_all();
  }
  impl_->registry_watch.reset();  // no registry handler runs after this
  if (impl_->loader.joinable()) impl_->loader.join();
  if (impl_->spare) impl_->spare->Close();  // a spare being made is finished, not abandoned
  std::shared_ptr<Client> c;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    c = std::move(impl_->client);
  }
  c.reset();  // disconnects; the node drops our leases, versions handed out keep their mappings
}

}  // namespace viper
