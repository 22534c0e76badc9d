// Relay: one Subscriber per model on the upstream node. Remote transfers land straight in a segment
// of this node (Node::Receive), which forwards each chunk downstream as it lands, and are committed
// under the upstream's version number once verified; versions loaded another way (map, copy, file)
// are copied into a segment.
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "api/client.h"
#include "relay_placement.h"
#include "store/host_tier.h"
#include "viper/log.h"
#include "viper/node.h"
#include "viper/relay.h"
#include "viper/subscriber.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "relay";
}  // namespace

struct Relay::Impl {
  Node* node = nullptr;
  RelayOptions options;
  std::vector<std::unique_ptr<internal::RelayPlacement>> placements;  // registry-placed: one per model
  std::vector<std::unique_ptr<Subscriber>> subscribers;                // closed before the placements go
  mutable std::mutex mu;  // serializes OnVersion; guards below
  RelayStats stats;
  std::map<std::string, uint64_t> relayed;  // model -> newest version committed here
  std::unique_ptr<Client> announcer;        // tells the upstream what we hold (REPLICA)
  std::string announcer_node;               // ...connected to this node
  struct Link {                             // one model's subscription to the upstream
    std::string node;                       // connected to now ("" = none reachable)
    bool preferred = false;
    SubscriberStats counters;
  };
  std::map<std::string, Link> links;        // model -> its link

  void OnConnection(const std::string& model, const std::string& node, bool preferred, const SubscriberStats& counters);
  // model -> the version being received into this node (the subscriber's load owns it)
  std::map<std::string, std::weak_ptr<IncomingVersion>> arriving;

  void Announce(const proto::VersionInfo& info);

  void OnVersion(const ModelVersion& mv);
  Result<proto::VersionInfo> CommitArrived(const ModelVersion& mv);
  Result<proto::VersionInfo> Copy(const ModelVersion& mv);
};

// The relay's subscribers land remote transfers in a segment of the node, which forwards them
// downstream as they land. Logs when the first and the last bytes landed (CLOCK_REALTIME), so that
// a chain's pipelining shows in its logs.
class RelayLanding : public LandingZone {
 public:
  using Arrival = std::function<void(const std::shared_ptr<IncomingVersion>&)>;
  RelayLanding(Node* node, Arrival on_arrival) : node_(node), on_arrival_(std::move(on_arrival)) {}
  Result<Landing> Land(const proto::VersionInfo& info) override { return Arrive(info, nullptr); }
  // The delta's parts are passed on as they arrive (IncomingVersion::ForwardDeltaPart).
  Result<Landing> LandDelta(const proto::VersionInfo& info, uint64_t base_version, uint64_t base_checksum) override {
    const DeltaOrigin origin{base_version, base_checksum};
    return Arrive(info, &origin);
  }

 private:
  struct DeltaOrigin {
    uint64_t version, checksum;
  };

  Result<Landing> Arrive(const proto::VersionInfo& info, const DeltaOrigin* delta) {
    VIPER_ASSIGN_OR_RETURN(std::unique_ptr<IncomingVersion> received, node_->Receive(info, delta != nullptr));
    std::shared_ptr<IncomingVersion> in(std::move(received));
    on_arrival_(in);
    IncomingVersion* raw = in.get();  // the Landing's owner keeps it alive while bytes land
    auto first_ns = std::make_shared<int64_t>(0);
    Landing landing{in->data(), in, [raw, first_ns](uint64_t prefix) {
                      if (*first_ns == 0) {
                        *first_ns = WallClockNs();
                        log(LogLevel::kInfo, kLog, "{} version {}: first bytes landed at {} ns", raw->info().model,
                            raw->info().version, *first_ns);
                      }
                      raw->Landed(prefix);
                      if (prefix == raw->data().size())
                        log(LogLevel::kInfo, kLog, "{} version {}: all {} bytes landed at {} ns", raw->info().model,
                            raw->info().version, prefix, WallClockNs());
                    },
                    {}};
    if (delta)
      landing.delta_part = [raw, base = *delta](uint32_t index, std::shared_ptr<const std::vector<std::byte>> part,
                                                bool last) {
        raw->ForwardDeltaPart(base.version, base.checksum, index, std::move(part), last);
      };
    return landing;
  }

  Node* node_;
  Arrival on_arrival_;
};

// Runs on the subscriber's loader thread, after the version was verified.
void Relay::Impl::OnVersion(const ModelVersion& mv) {
  std::lock_guard<std::mutex> lock(mu);
  uint64_t& newest = relayed[mv.info.model];
  if (mv.version() <= newest) return;  // already relayed (Start replays the version live at start)
  auto committed = CommitArrived(mv);
  if (committed.ok() && committed->version == 0) committed = Copy(mv);
  if (!committed.ok()) {
    stats.failures++;
    log(LogLevel::kError, kLog, "{} version {} from {} not relayed: {}", mv.info.model, mv.version(), options.upstream,
        committed.status().message());
    return;
  }
  log(LogLevel::kInfo, kLog, "relayed {} version {} ({} bytes) from {} via {}", committed->model, committed->version,
      committed->size, options.upstream, fetch_path_name(mv.path));
  Announce(*committed);
  newest = mv.version();
  stats.versions_relayed++;
}

// A version that landed in this node's segment: committed in place (no copy). version 0 = it did
// not land here (map, copy or file path): the caller copies it.
Result<proto::VersionInfo> Relay::Impl::CommitArrived(const ModelVersion& mv) {
  auto it = arriving.find(mv.info.model);
  std::shared_ptr<IncomingVersion> in = it != arriving.end() ? it->second.lock() : nullptr;
  if (!in || in->info().version != mv.version() || in->data().data() != mv.snapshot.bytes().data())
    return proto::VersionInfo{};
  arriving.erase(it);
  // Forwarded while the upstream still wrote it: the checksum and final header came last (SEALED,
  // already in the segment); this node's own receivers get them now.
  VIPER_RETURN_IF_ERROR(in->Seal(mv.info));
  VIPER_ASSIGN_OR_RETURN(proto::VersionInfo committed, in->Commit());
  stats.versions_received_in_place++;
  return committed;
}

Result<proto::VersionInfo> Relay::Impl::Copy(const ModelVersion& mv) {
  std::span<const std::byte> bytes = mv.snapshot.bytes();
  if (bytes.size() != mv.info.size)
    return Status::Internal("snapshot of " + std::to_string(bytes.size()) + " bytes, announced " + std::to_string(mv.info.size));
  VIPER_ASSIGN_OR_RETURN(WriteLease lease, node->Allocate(bytes.size()));
  std::memcpy(lease.data().data(), bytes.data(), bytes.size());
  proto::VersionInfo info = mv.info;  // keeps the upstream's replicas; Commit lists ours first
  return node->Commit(std::move(lease), std::move(info));
}

// A subscription moved (connected, lost, or back to the preferred upstream): the node's STATS
// show it (NodeStats::upstream).
void Relay::Impl::OnConnection(const std::string& model, const std::string& node_address, bool preferred,
                               const SubscriberStats& counters) {
  std::lock_guard<std::mutex> lock(mu);
  links[model] = Link{node_address, preferred, counters};
  UpstreamStats up;
  up.subscriptions = options.models.size();
  for (const auto& [m, link] : links) {
    up.connected += !link.node.empty();
    up.on_preferred += link.preferred;
    up.connect_failures += link.counters.connect_failures;
    up.preferred_returns += link.counters.preferred_returns;
    up.liveness_failures += link.counters.liveness_failures;
  }
  stats.upstream = up;
  node->SetUpstreamStats(up);
}

// Best effort: a relay that cannot tell the upstream still serves its own host. Told is the node
// the model's subscription is connected to (the upstream, or the alternate standing in for it).
void Relay::Impl::Announce(const proto::VersionInfo& info) {
  std::string target = options.upstream;
  if (auto it = links.find(info.model); it != links.end() && !it->second.node.empty()) target = it->second.node;
  if (announcer && announcer_node != target) announcer.reset();  // the upstream forgets our replicas
  if (!announcer || !announcer->connected()) {
    announcer_node = target;
    ClientOptions co;
    co.connect = target;
    co.token = options.token;
    co.name = "relay-announcer:" + node->address();
    // On the loader thread: an upstream that accepts the connection but never answers (frozen,
    // or cut off mid-handshake) must not hold the next versions back for the default 30 s.
    co.timeout = std::chrono::milliseconds(5000);
    auto c = Client::Connect(co);
    if (!c.ok()) {
      announcer.reset();
      log(LogLevel::kWarn, kLog, "cannot announce {} version {} to {}: {}", info.model, info.version, target,
          c.status().message());
      return;
    }
    announcer = std::move(c).value();
  }
  proto::Replica self{proto::ReplicaKind::kNode, node->host_key(), node->address()};
  if (Status st = announcer->AnnounceReplica(info.model, info.version, self); !st.ok())
    log(LogLevel::kWarn, kLog, "cannot announce {} version {} to {}: {}", info.model, info.version, target,
        st.message());
}

Relay::Relay(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Relay::~Relay() {
  if (!impl_) return;
  for (auto& s : impl_->subscribers) s->Close();  // no callback runs after this
  impl_->subscribers.clear();
  impl_->placements.clear();  // leaves the relay trees
  impl_->announcer.reset();  // the upstream forgets our replicas
  impl_->node->SetUpstreamStats({});
}

namespace {
// The registry-placed relay's choice of upstream for `model` (SubscriberOptions::choose_node); the
// placement goes into `placements`, which outlive the subscriber.
Status PlaceIn(Node& node, const RelayOptions& o, const std::string& model,
               std::vector<std::unique_ptr<internal::RelayPlacement>>& placements, SubscriberOptions& so) {
  VIPER_ASSIGN_OR_RETURN(auto registry, OpenRegistry(o.registry, RegistryOptions{.password = o.registry_password}));
  internal::RelayPlacementOptions po{
      model, NodeRecordFor(node.options().name, node.address(), node.host_key(), static_cast<uint32_t>(::getpid())),
      o.max_children, o.heartbeat};
  VIPER_ASSIGN_OR_RETURN(auto placement, internal::RelayPlacement::Start(std::move(registry), std::move(po)));
  internal::RelayPlacement* raw = placement.get();
  placements.push_back(std::move(placement));
  so.choose_node = [raw](const std::string& unreachable) { return raw->Choose(unreachable); };
  so.preferred_probe = std::chrono::milliseconds(0);
  return Status::OK();
}
}  // namespace

Result<std::unique_ptr<Relay>> Relay::Start(Node& node, const RelayOptions& options) {
  if (options.upstream.empty() && options.registry.empty())
    return Status::InvalidArgument("relay: name the upstream, or a registry that places the relay");
  if (options.models.empty()) return Status::InvalidArgument("relay: name at least one model to relay");
  if (options.upstream == node.address())
    return Status::InvalidArgument("relay: upstream " + options.upstream + " is this node");
  auto impl = std::make_shared<Impl>();
  impl->node = &node;
  impl->options = options;
  std::unique_ptr<Relay> relay(new Relay(impl));  // closes the subscribers started so far on error
  for (const std::string& model : options.models) {
    SubscriberOptions so;
    so.model = model;
    so.connect = options.upstream;
    so.alternates = options.alternates;
    so.token = options.token;
    so.name = node.options().name.empty() ? "relay" : "relay:" + node.options().name;
    so.file_dir = options.file_dir;
    if (options.always_remote) so.path = FetchPath::kRemote;
    so.pipelined = options.pipelined;
    so.buffers = 1;  // only versions that did not land in the host tier are copied out of it
    so.wait_for_node = true;  // nodes start in any order: an upstream not up yet is waited for
    so.liveness_probe = options.liveness_probe;
    so.liveness_timeout = options.liveness_timeout;
    Impl* raw = impl.get();  // subscribers are closed before the Impl goes
    so.on_connection = [raw, model](const std::string& at, bool preferred, const SubscriberStats& counters) {
      raw->OnConnection(model, at, preferred, counters);
    };
    so.landing = std::make_shared<RelayLanding>(&node, [raw](const std::shared_ptr<IncomingVersion>& in) {
      std::lock_guard<std::mutex> lock(raw->mu);
      raw->arriving[in->info().model] = in;
    });
    if (options.upstream.empty()) VIPER_RETURN_IF_ERROR(PlaceIn(node, options, model, impl->placements, so));
    VIPER_ASSIGN_OR_RETURN(auto sub, Subscriber::Start(so));
    sub->OnUpdate([raw](const std::shared_ptr<const ModelVersion>& mv) { raw->OnVersion(*mv); });  // the live one too
    impl->subscribers.push_back(std::move(sub));
  }
  log(LogLevel::kInfo, kLog, "relaying {} model(s) from {}", options.models.size(),
      options.upstream.empty() ? "the registry's relay tree" : options.upstream);
  return relay;
}

RelayStats Relay::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RelayStats out = impl_->stats;
  for (const auto& p : impl_->placements) out.joins += p->joins();
  for (const auto& [model, link] : impl_->links) out.connected_to[model] = link.node;
  return out;
}

}  // namespace viper
