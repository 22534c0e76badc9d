// SampleCache: the collaborative sample cache (contract: include/viper/sample_cache.h).
//
// The node is the machinery that already serves snapshots: a cached sample is a one-tensor
// snapshot, put with Node::Commit (own node) or Client::Publish (another node) and taken with
// HostTier::Acquire (own node) or Client::FetchSend (another node). One Client per other node,
// connected on first use and shared by the reader threads.
#include "viper/sample_cache.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "api/client.h"
#include "store/host_tier.h"
#include "viper/log.h"
#include "viper/node.h"
#include "viper/snapshot.h"

namespace viper {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t MemberKey(const std::string& member) {
  return checksum64(std::as_bytes(std::span(member.data(), member.size())));
}

// Rendezvous hashing over the members whose `live` flag is set (all when live is empty).
size_t Owner(uint64_t id, const std::vector<uint64_t>& keys, const std::vector<bool>& live) {
  size_t best = 0;
  uint64_t best_score = 0;
  bool any = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!live.empty() && !live[i]) continue;
    uint64_t score = Mix(keys[i] ^ Mix(id));
    if (!any || score > best_score || (score == best_score && keys[i] < keys[best])) {
      best = i, best_score = score, any = true;
    }
  }
  return best;
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

}  // namespace

// Mappings left to the rest of a cache node's process (MaxCachedSamples).
constexpr size_t kMapHeadroom = 16384;

size_t MaxCachedSamples() {
  constexpr size_t kDefaultMapCount = 65530;
  size_t map_count = kDefaultMapCount;
  if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    unsigned long long v = 0;
    if (std::fscanf(f, "%llu", &v) == 1 && v > 0) map_count = static_cast<size_t>(v);
    std::fclose(f);
  }
  return map_count > 2 * kMapHeadroom ? map_count - kMapHeadroom : map_count / 2;
}

size_t SampleOwner(uint64_t id, const std::vector<std::string>& members) {
  std::vector<uint64_t> keys;
  keys.reserve(members.size());
  for (const auto& m : members) keys.push_back(MemberKey(m));
  return Owner(id, keys, {});
}

struct SampleCache::Impl {
  std::shared_ptr<const SampleSource> source;
  SampleCacheOptions opt;
  std::vector<uint64_t> keys;  // MemberKey of each node
  std::unique_ptr<Node> node;
  Clock::time_point opened = Clock::now();

  mutable std::mutex mu;  // guards the peers' state below
  struct Peer {
    // Shared with the readers using it: MarkDown or a reconnect replaces it while another reader
    // may still be inside a fetch on the old one, which stays alive until that reader is done.
    std::shared_ptr<Client> client;
    std::optional<Clock::time_point> down_until;
    bool ever_connected = false;
    bool said_full = false;  // RefusedPut warned that this node is full
  };
  mutable std::vector<Peer> peers;

  mutable std::atomic<uint64_t> source_reads{0}, source_bytes{0}, local_hits{0}, local_bytes{0}, remote_hits{0},
      remote_bytes{0}, misses{0}, puts{0}, put_bytes{0}, put_failures{0}, peer_failures{0};

  std::string Model(uint64_t id) const { return fmt::format("{}.s{}", opt.name, id); }
  std::vector<bool> Live() const;
  size_t OwnerOf(uint64_t id) const { return Owner(id, keys, Live()); }
  // The client of node i (connected on first use); nullptr while it is down.
  std::shared_ptr<Client> PeerClient(size_t i) const;
  void MarkDown(size_t i, const Status& why) const;
  // A put into node i refused: counted; a full node (its budget) is said once, at warn level, in
  // the cache's terms (the refusals that follow go to debug), anything else at info.
  void RefusedPut(size_t i, uint64_t id, const Status& why) const;
  bool ReadLocal(uint64_t id, std::span<std::byte> dst) const;
  bool ReadAttached(uint64_t id, std::span<std::byte> dst) const;
  bool ReadRemote(size_t owner, uint64_t id, std::span<std::byte> dst) const;
  void PutLocal(uint64_t id, std::span<const std::byte> bytes) const;
  void PutRemote(size_t owner, uint64_t id, std::span<const std::byte> bytes) const;
  bool CopyOut(const Snapshot& snap, uint64_t id, std::span<std::byte> dst) const;
  Status Read(uint64_t id, std::span<std::byte> dst, SampleCacheJobCounters* job) const;

  // Samples being read from the source for this process's node now (Read merges reads of one).
  mutable std::mutex inflight_mu;
  mutable std::condition_variable inflight_cv;
  mutable std::set<uint64_t> inflight;
};

std::vector<bool> SampleCache::Impl::Live() const {
  std::vector<bool> live(keys.size(), true);
  std::lock_guard<std::mutex> lk(mu);
  Clock::time_point now = Clock::now();
  for (size_t i = 0; i < peers.size(); ++i) {
    if (peers[i].down_until && *peers[i].down_until > now) live[i] = false;
  }
  return live;
}

void SampleCache::Impl::MarkDown(size_t i, const Status& why) const {
  peer_failures++;
  std::shared_ptr<Client> gone;  // destroyed outside the lock, by the last reader holding it
  {
    std::lock_guard<std::mutex> lk(mu);
    Peer& p = peers[i];
    if (p.down_until && *p.down_until > Clock::now()) return;
    p.down_until = Clock::now() + opt.retry_down;
    gone = std::move(p.client);
  }
  log(LogLevel::kWarn, "sample-cache", "cache node {} unreachable ({}): its samples go to the next owner for {} ms",
      opt.nodes[i], why.ToString(), opt.retry_down.count());
}

void SampleCache::Impl::RefusedPut(size_t i, uint64_t id, const Status& why) const {
  put_failures++;
  if (why.code() != StatusCode::kResourceExhausted) {
    log(LogLevel::kInfo, "sample-cache", "{} did not cache {}: {}", opt.nodes[i], source->Describe(id),
        why.ToString());
    return;
  }
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(mu);
    first = !std::exchange(peers[i].said_full, true);
  }
  if (!first) {
    log(LogLevel::kDebug, "sample-cache", "{} is full: not caching {}", opt.nodes[i], source->Describe(id));
    return;
  }
  log(LogLevel::kWarn, "sample-cache",
      "cache '{}' node {} is full: the samples it owns beyond what it holds are read from the source on every "
      "read (counted in put_failures). To cache more, give the node more memory (max_bytes) or samples "
      "(max_samples, at most {} here: one mapping each, bounded by sysctl vm.max_map_count). The node said: {}",
      opt.name, opt.nodes[i], MaxCachedSamples(), why.message());
}

std::shared_ptr<Client> SampleCache::Impl::PeerClient(size_t i) const {
  std::unique_lock<std::mutex> lk(mu);
  Peer& p = peers[i];
  if (p.client && p.client->connected()) return p.client;
  if (p.down_until && *p.down_until > Clock::now()) return nullptr;
  // Connecting holds the lock: it happens once per node, and two readers must not connect twice.
  ClientOptions co;
  co.connect = opt.nodes[i];
  co.token = opt.token;
  co.name = fmt::format("sample-cache-{}", opt.self);
  co.timeout = opt.timeout;
  auto c = Client::Connect(co);
  // A node never reached yet (the ranks start at their own pace) is waited for while this cache
  // is young: up to `timeout` after Open.
  while (!c.ok() && !p.ever_connected && Clock::now() < opened + opt.timeout) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c = Client::Connect(co);
  }
  if (!c.ok()) {
    lk.unlock();
    MarkDown(i, c.status());
    return nullptr;
  }
  p.down_until.reset();
  p.ever_connected = true;
  p.client = std::move(c).value();
  return p.client;
}

bool SampleCache::Impl::CopyOut(const Snapshot& snap, uint64_t id, std::span<std::byte> dst) const {
  const TensorInfo* x = snap.find("x");
  if (x == nullptr || x->nbytes() != dst.size()) {
    log(LogLevel::kWarn, "sample-cache", "cached copy of {} has the wrong shape; reading the source",
        source->Describe(id));
    return false;
  }
  std::span<const std::byte> data = snap.tensor_data(*x);
  std::memcpy(dst.data(), data.data(), dst.size());
  return true;
}

bool SampleCache::Impl::ReadLocal(uint64_t id, std::span<std::byte> dst) const {
  const std::string model = Model(id);
  if (!node) return ReadAttached(id, dst);
  std::optional<uint64_t> v = node->host_tier().latest(model);
  if (!v) return false;
  auto lease = node->host_tier().Acquire(model, *v);
  if (!lease.ok()) return false;  // evicted meanwhile
  auto snap = Snapshot::Parse(lease->data(), lease->hold());
  if (!snap.ok()) return false;
  return CopyOut(*snap, id, dst);
}

// This host's node run by another process: a lease on the sample's segment, mapped read-only
// (same host), copied out, released.
bool SampleCache::Impl::ReadAttached(uint64_t id, std::span<std::byte> dst) const {
  std::shared_ptr<Client> c = PeerClient(opt.self);
  if (c == nullptr) return false;
  const std::string model = Model(id);
  auto ok = c->FetchLease(model, 0);
  if (!ok.ok()) {
    if (ok.status().code() != StatusCode::kNotFound) MarkDown(opt.self, ok.status());
    return false;
  }
  bool copied = false;
  auto mapped = MapSegmentReadOnly(ok->segment, ok->info.size);
  if (mapped.ok()) {
    auto snap = Snapshot::Parse(mapped->data, mapped->owner);
    copied = snap.ok() && CopyOut(*snap, id, dst);
  }
  c->Release(model, ok->info.version);
  return copied;
}

bool SampleCache::Impl::ReadRemote(size_t owner, uint64_t id, std::span<std::byte> dst) const {
  std::shared_ptr<Client> c = PeerClient(owner);
  if (c == nullptr) return false;
  std::vector<std::byte> buf;
  auto provide = [&buf](const proto::VersionInfo& info) -> Result<std::span<std::byte>> {
    if (info.size > (1ull << 32)) return Status::InvalidArgument("cached sample too large");
    buf.resize(info.size);
    return std::span<std::byte>(buf);
  };
  auto ok = c->FetchSend(Model(id), 0, provide);
  if (!ok.ok()) {
    if (ok.status().code() == StatusCode::kNotFound) {
      misses++;
    } else {
      MarkDown(owner, ok.status());
    }
    return false;
  }
  ParseOptions parse;
  parse.verify_checksum = true;
  auto snap = Snapshot::FromBuffer(std::move(buf), parse);
  if (!snap.ok()) {
    log(LogLevel::kWarn, "sample-cache", "cached copy of {} from {} rejected: {}", source->Describe(id),
        opt.nodes[owner], snap.status().ToString());
    return false;
  }
  return CopyOut(*snap, id, dst);
}

namespace {

Result<SnapshotLayout> SampleLayout(uint64_t nbytes) {
  return SnapshotLayout::Make({TensorSpec{"x", DType::kU8, {static_cast<int64_t>(nbytes)}}});
}

}  // namespace

void SampleCache::Impl::PutLocal(uint64_t id, std::span<const std::byte> bytes) const {
  if (!node) return PutRemote(opt.self, id, bytes);  // attached: the node is another process's
  const std::string model = Model(id);
  auto fail = [&](const Status& st) {
    // Two puts of one sample can race (a rank's own read and another rank's put of a sample both
    // read ahead): the later-numbered one commits first and the other is refused as not newer.
    // The sample is cached all the same: not a failure.
    if (node->host_tier().latest(model).has_value()) return;
    RefusedPut(opt.self, id, st);
  };
  auto layout = SampleLayout(bytes.size());
  if (!layout.ok()) return fail(layout.status());
  auto version = node->ReserveVersion(model);
  if (!version.ok()) return fail(version.status());
  auto lease = node->Allocate(layout->total_bytes());
  if (!lease.ok()) return fail(lease.status());
  std::span<std::byte> out = lease->data();
  std::memcpy(out.data() + layout->data_offset() + layout->tensors()[0].begin, bytes.data(), bytes.size());
  VersionStamp stamp{model, *version, 0, static_cast<uint64_t>(WallClockNs()), 0, std::nullopt};
  if (Status st = layout->Seal(out, &stamp); !st.ok()) return fail(st);
  proto::VersionInfo info;
  info.model = model;
  info.version = *version;
  info.size = layout->total_bytes();
  info.checksum = stamp.checksum;
  info.publish_ns = WallClockNs();
  auto committed = node->Commit(std::move(lease).value(), std::move(info));
  if (!committed.ok()) return fail(committed.status());
  puts++;
  put_bytes += bytes.size();
}

void SampleCache::Impl::PutRemote(size_t owner, uint64_t id, std::span<const std::byte> bytes) const {
  std::shared_ptr<Client> c = PeerClient(owner);
  if (c == nullptr) {
    put_failures++;
    return;
  }
  VersionStamp stamp{Model(id), 1, 0, static_cast<uint64_t>(WallClockNs()), 0, std::nullopt};
  auto snap = BuildSnapshot({TensorData{TensorSpec{"x", DType::kU8, {static_cast<int64_t>(bytes.size())}}, bytes}},
                            stamp);
  if (!snap.ok()) {
    put_failures++;
    return;
  }
  auto v = c->Publish(Model(id), snap->bytes(), 0, WallClockNs());
  // A put that raced another put of the same sample into the owner is refused as not newer than
  // the copy the owner now holds (see PutLocal): the sample is cached, not a failure.
  if (!v.ok() && v.status().message().find("is not newer than its latest committed version") != std::string::npos)
    return;
  if (!v.ok()) {
    if (v.status().code() == StatusCode::kUnavailable || v.status().code() == StatusCode::kTimeout) {
      put_failures++;
      MarkDown(owner, v.status());
    } else {
      RefusedPut(owner, id, v.status());
    }
    return;
  }
  puts++;
  put_bytes += bytes.size();
}

SampleCache::SampleCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SampleCache::~SampleCache() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->peers.clear();  // clients before the node
  }
  impl_->node.reset();
}

Result<std::shared_ptr<SampleCache>> SampleCache::Open(std::shared_ptr<const SampleSource> source,
                                                       const SampleCacheOptions& options) {
  auto bad = [](std::string what) { return Status::InvalidArgument("SampleCacheOptions: " + what); };
  if (!source) return bad("no source");
  if (options.nodes.empty()) return bad("nodes is empty: list every cache node's host:port");
  if (options.self >= options.nodes.size()) {
    return bad(fmt::format("self={} is out of range: nodes has {} entries", options.self, options.nodes.size()));
  }
  for (size_t i = 0; i < options.nodes.size(); ++i) {
    const std::string& a = options.nodes[i];
    size_t colon = a.rfind(':');
    if (a.empty() || colon == std::string::npos || colon == 0 || colon + 1 == a.size()) {
      return bad(fmt::format("nodes[{}]='{}' must be HOST:PORT", i, a));
    }
    if (std::count(options.nodes.begin(), options.nodes.end(), a) > 1) {
      return bad(fmt::format("nodes[{}]='{}' is listed twice: each node once", i, a));
    }
  }
  if (!ValidName(options.name)) return bad(fmt::format("name='{}' must be 1-64 characters of [A-Za-z0-9_-]", options.name));
  const size_t most = MaxCachedSamples();
  if (options.max_samples > most) {
    return bad(fmt::format(
        "max_samples={} is more than this host allows a node: {} (one mapping per sample: vm.max_map_count less {} "
        "for the process's other mappings; raise it with sysctl vm.max_map_count, or give 0 for the most)",
        options.max_samples, most, kMapHeadroom));
  }
  if (options.timeout.count() < 1) return bad("timeout must be >= 1 ms");
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(source);
  impl->opt = options;
  for (const auto& n : options.nodes) impl->keys.push_back(MemberKey(n));
  impl->peers.resize(options.nodes.size());
  if (!options.start_node) return std::shared_ptr<SampleCache>(new SampleCache(std::move(impl)));
  NodeOptions no;
  no.listen = options.nodes[options.self];
  no.name = fmt::format("sample-cache-{}-{}", options.name, options.self);
  no.keep_host_versions = 1;
  no.host_max_bytes = options.max_bytes;
  no.host_max_models = options.max_samples != 0 ? options.max_samples : most;
  no.token = options.token;
  no.insecure = options.insecure;
  no.recover = false;
  no.delta = DeltaMode::kOff;
  no.delta_bases = 0;
  no.segment_prefix = "vcache";
  auto node = Node::Start(no);
  if (!node.ok()) {
    return Status(node.status().code(), fmt::format("sample cache node on nodes[{}]='{}': {}", options.self,
                                                    options.nodes[options.self], node.status().message()));
  }
  impl->node = std::move(node).value();
  return std::shared_ptr<SampleCache>(new SampleCache(std::move(impl)));
}

uint64_t SampleCache::size() const { return impl_->source->size(); }
uint64_t SampleCache::bytes(uint64_t id) const { return impl_->source->bytes(id); }
int64_t SampleCache::label(uint64_t id) const { return impl_->source->label(id); }
std::string SampleCache::Describe(uint64_t id) const { return impl_->source->Describe(id); }
Status SampleCache::Check(uint64_t id) const { return impl_->source->Check(id); }
std::vector<std::string> SampleCache::class_names() const { return impl_->source->class_names(); }
size_t SampleCache::OwnerOf(uint64_t id) const { return impl_->OwnerOf(id); }
std::string SampleCache::address() const { return impl_->node ? impl_->node->address() : impl_->opt.nodes[impl_->opt.self]; }
const SampleCacheOptions& SampleCache::options() const { return impl_->opt; }

Status SampleCache::ReadInto(uint64_t id, std::span<std::byte> dst) const {
  return impl_->Read(id, dst, nullptr);
}

Status SampleCache::Impl::Read(uint64_t id, std::span<std::byte> dst, SampleCacheJobCounters* job) const {
  const Impl& m = *this;
  auto hit = [&] {
    if (job != nullptr) job->hits++, job->hit_bytes += dst.size();
    return Status::OK();
  };
  const size_t self = m.opt.self;
  // Own node first: it holds what this rank owns, and may hold more (a sample it owned while
  // another node was down).
  if (m.ReadLocal(id, dst)) {
    m.local_hits++;
    m.local_bytes += dst.size();
    return hit();
  }
  // Then the owner; an owner found unreachable is left out, and the sample's next owner asked.
  size_t owner = m.OwnerOf(id);
  for (size_t tries = 0; owner != self && tries < m.keys.size(); ++tries) {
    if (m.ReadRemote(owner, id, dst)) {
      m.remote_hits++;
      m.remote_bytes += dst.size();
      return hit();
    }
    size_t next = m.OwnerOf(id);
    if (next == owner) break;  // reachable, but it does not hold the sample
    owner = next;
  }
  // A sample this process's node owns that another reader here is reading from the source now
  // (another job's prefetcher in a data service): wait for that read and its put, then take it
  // from the node, so that reads of one sample are merged.
  struct InFlight {
    const Impl* m = nullptr;
    uint64_t id = 0;
    ~InFlight() {
      if (m == nullptr) return;
      {
        std::lock_guard<std::mutex> lk(m->inflight_mu);
        m->inflight.erase(id);
      }
      m->inflight_cv.notify_all();
    }
  } in_flight;
  if (owner == self && m.node) {
    std::unique_lock<std::mutex> lk(m.inflight_mu);
    while (m.inflight.count(id) != 0) {
      m.inflight_cv.wait(lk);
      if (m.inflight.count(id) != 0) continue;
      lk.unlock();
      if (m.ReadLocal(id, dst)) {
        m.local_hits++;
        m.local_bytes += dst.size();
        return hit();
      }
      lk.lock();  // its put was refused: read it here
    }
    m.inflight.insert(id);
    in_flight.m = this, in_flight.id = id;
    lk.unlock();
    if (m.ReadLocal(id, dst)) {  // a read of it finished between the first look and now
      m.local_hits++;
      m.local_bytes += dst.size();
      return hit();
    }
  }
  if (owner == self) m.misses++;
  VIPER_RETURN_IF_ERROR(m.source->ReadInto(id, dst));
  m.source_reads++;
  m.source_bytes += dst.size();
  if (job != nullptr) job->source_reads++, job->source_bytes += dst.size();
  if (owner == self) {
    m.PutLocal(id, dst);
  } else {
    m.PutRemote(owner, id, dst);
  }
  return Status::OK();
}

Result<PinnedSample> SampleCache::Pin(uint64_t id) const {
  const Impl& m = *impl_;
  if (!m.node) return Status::FailedPrecondition("SampleCache::Pin: the node is another process's (start_node=false)");
  const std::string model = m.Model(id);
  std::optional<uint64_t> v = m.node->host_tier().latest(model);
  if (!v) return Status::NotFound(fmt::format("{} is not cached", m.source->Describe(id)));
  VIPER_ASSIGN_OR_RETURN(ReadLease lease, m.node->host_tier().Acquire(model, *v));
  VIPER_ASSIGN_OR_RETURN(Snapshot snap, Snapshot::Parse(lease.data(), lease.hold()));
  const TensorInfo* x = snap.find("x");
  if (x == nullptr || x->nbytes() != m.source->bytes(id)) {
    return Status::NotFound(fmt::format("the cached copy of {} has the wrong shape", m.source->Describe(id)));
  }
  std::span<const std::byte> data = snap.tensor_data(*x);
  PinnedSample p;
  p.segment = lease.segment_name();
  p.offset = static_cast<uint64_t>(data.data() - lease.data().data());
  p.nbytes = data.size();
  p.hold = std::make_shared<ReadLease>(std::move(lease));
  return p;
}

namespace {

class CountedSource : public SampleSource {
 public:
  CountedSource(std::shared_ptr<const SampleCache> cache, std::shared_ptr<SampleCacheJobCounters> counters,
                const SampleCache::Impl* impl)
      : cache_(std::move(cache)), counters_(std::move(counters)), impl_(impl) {}
  uint64_t size() const override { return cache_->size(); }
  uint64_t bytes(uint64_t id) const override { return cache_->bytes(id); }
  int64_t label(uint64_t id) const override { return cache_->label(id); }
  std::string Describe(uint64_t id) const override { return cache_->Describe(id); }
  Status Check(uint64_t id) const override { return cache_->Check(id); }
  Status ReadInto(uint64_t id, std::span<std::byte> dst) const override {
    return impl_->Read(id, dst, counters_.get());
  }
  std::vector<std::string> class_names() const override { return cache_->class_names(); }

 private:
  std::shared_ptr<const SampleCache> cache_;
  std::shared_ptr<SampleCacheJobCounters> counters_;
  const SampleCache::Impl* impl_;
};

}  // namespace

std::shared_ptr<const SampleSource> SampleCache::CountedView(std::shared_ptr<const SampleCache> cache,
                                                             std::shared_ptr<SampleCacheJobCounters> counters) {
  const Impl* impl = cache->impl_.get();
  return std::make_shared<CountedSource>(std::move(cache), std::move(counters), impl);
}

SampleCacheStats SampleCache::stats() const {
  const Impl& m = *impl_;
  SampleCacheStats s;
  s.source_reads = m.source_reads, s.source_bytes = m.source_bytes;
  s.local_hits = m.local_hits, s.local_bytes = m.local_bytes;
  s.remote_hits = m.remote_hits, s.remote_bytes = m.remote_bytes;
  s.misses = m.misses, s.puts = m.puts, s.put_bytes = m.put_bytes;
  s.put_failures = m.put_failures, s.peer_failures = m.peer_failures;
  if (m.node) {
    s.node_samples = m.node->host_tier().models().size();
    s.node_bytes = m.node->stats().host.mapped_bytes;
  }  // attached: the node's process reports them
  std::vector<bool> live = m.Live();
  for (size_t i = 0; i < live.size(); ++i) {
    if (!live[i]) s.down.push_back(m.opt.nodes[i]);
  }
  return s;
}

// Named objects (include/viper/sample_cache.h): the samples' machinery under another model name.
namespace {

bool ValidKey(std::string_view key) {
  if (key.empty() || key.size() > 48) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

Result<std::vector<std::byte>> TensorX(const Snapshot& snap, const std::string& model) {
  const TensorInfo* x = snap.find("x");
  if (x == nullptr) return Status::Corruption(fmt::format("object {}: no tensor 'x'", model));
  std::span<const std::byte> d = snap.tensor_data(*x);
  return std::vector<std::byte>(d.begin(), d.end());
}

}  // namespace

Status SampleCache::PutObject(std::string_view key, std::span<const std::byte> bytes) const {
  const Impl& m = *impl_;
  if (!ValidKey(key)) {
    return Status::InvalidArgument(fmt::format("SampleCache object key='{}' must be 1-48 characters of [A-Za-z0-9_-]", key));
  }
  const std::string model = fmt::format("{}.o.{}", m.opt.name, key);
  VersionStamp stamp{model, 1, 0, static_cast<uint64_t>(WallClockNs()), 0, std::nullopt};
  TensorSpec spec{"x", DType::kU8, {static_cast<int64_t>(bytes.size())}};
  if (m.node) {
    VIPER_ASSIGN_OR_RETURN(SnapshotLayout layout, SnapshotLayout::Make({spec}));
    VIPER_ASSIGN_OR_RETURN(stamp.version, m.node->ReserveVersion(model));
    VIPER_ASSIGN_OR_RETURN(WriteLease lease, m.node->Allocate(layout.total_bytes()));
    std::span<std::byte> out = lease.data();
    std::memcpy(out.data() + layout.data_offset() + layout.tensors()[0].begin, bytes.data(), bytes.size());
    VIPER_RETURN_IF_ERROR(layout.Seal(out, &stamp));
    proto::VersionInfo info;
    info.model = model;
    info.version = stamp.version;
    info.size = layout.total_bytes();
    info.checksum = stamp.checksum;
    info.publish_ns = WallClockNs();
    return m.node->Commit(std::move(lease), std::move(info)).status();
  }
  std::shared_ptr<Client> c = m.PeerClient(m.opt.self);  // attached: the node is another process's
  if (c == nullptr) return Status::Unavailable(fmt::format("cache node {} is unreachable", m.opt.nodes[m.opt.self]));
  VIPER_ASSIGN_OR_RETURN(auto snap, BuildSnapshot({TensorData{spec, bytes}}, stamp));
  return c->Publish(model, snap.bytes(), 0, WallClockNs()).status();
}

Result<std::vector<std::byte>> SampleCache::GetObject(size_t node, std::string_view key) const {
  const Impl& m = *impl_;
  if (!ValidKey(key)) {
    return Status::InvalidArgument(fmt::format("SampleCache object key='{}' must be 1-48 characters of [A-Za-z0-9_-]", key));
  }
  if (node >= m.opt.nodes.size()) {
    return Status::InvalidArgument(fmt::format("SampleCache object node={}: nodes has {} entries", node, m.opt.nodes.size()));
  }
  const std::string model = fmt::format("{}.o.{}", m.opt.name, key);
  if (node == m.opt.self && m.node) {
    std::optional<uint64_t> v = m.node->host_tier().latest(model);
    if (!v) return Status::NotFound(fmt::format("object {} is not in this node", model));
    VIPER_ASSIGN_OR_RETURN(auto lease, m.node->host_tier().Acquire(model, *v));
    VIPER_ASSIGN_OR_RETURN(auto snap, Snapshot::Parse(lease.data(), lease.hold()));
    return TensorX(snap, model);
  }
  std::shared_ptr<Client> c = m.PeerClient(node);
  if (c == nullptr) return Status::Unavailable(fmt::format("cache node {} is unreachable", m.opt.nodes[node]));
  std::vector<std::byte> buf;
  auto provide = [&buf](const proto::VersionInfo& info) -> Result<std::span<std::byte>> {
    if (info.size > (1ull << 32)) return Status::InvalidArgument("object too large");
    buf.resize(info.size);
    return std::span<std::byte>(buf);
  };
  auto ok = c->FetchSend(model, 0, provide);
  if (!ok.ok()) {
    if (ok.status().code() != StatusCode::kNotFound) m.MarkDown(node, ok.status());
    return ok.status();
  }
  ParseOptions parse;
  parse.verify_checksum = true;
  VIPER_ASSIGN_OR_RETURN(auto snap, Snapshot::FromBuffer(std::move(buf), parse));
  return TensorX(snap, model);
}

}  // namespace viper
