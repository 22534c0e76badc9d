// Relay: one Subscriber per model on the upstream node; each version it makes live is copied into
// this node's host tier and committed under the upstream's version number.
#include <cstring>
#include <map>
#include <mutex>

#include "viper/client.h"
#include "viper/log.h"
#include "viper/node.h"
#include "viper/subscriber.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "relay";
}  // namespace

struct Relay::Impl {
  Node* node = nullptr;
  RelayOptions options;
  std::vector<std::unique_ptr<Subscriber>> subscribers;
  mutable std::mutex mu;  // serializes OnVersion; guards below
  RelayStats stats;
  std::map<std::string, uint64_t> relayed;  // model -> newest version committed here
  std::unique_ptr<Client> announcer;        // tells the upstream what we hold (REPLICA)

  void Announce(const proto::VersionInfo& info);

  void OnVersion(const ModelVersion& mv);
  Status Copy(const ModelVersion& mv);
};

// Runs on the subscriber's loader thread, after the version was verified.
void Relay::Impl::OnVersion(const ModelVersion& mv) {
  std::lock_guard<std::mutex> lock(mu);
  uint64_t& newest = relayed[mv.info.model];
  if (mv.version() <= newest) return;  // already relayed (Start replays the version live at start)
  Status st = Copy(mv);
  if (!st.ok()) {
    stats.failures++;
    log(LogLevel::kError, kLog, "{} version {} from {} not relayed: {}", mv.info.model, mv.version(), options.upstream,
        st.message());
    return;
  }
  newest = mv.version();
  stats.versions_relayed++;
}

Status Relay::Impl::Copy(const ModelVersion& mv) {
  std::span<const std::byte> bytes = mv.snapshot.bytes();
  if (bytes.size() != mv.info.size)
    return Status::Internal("snapshot of " + std::to_string(bytes.size()) + " bytes, announced " + std::to_string(mv.info.size));
  VIPER_ASSIGN_OR_RETURN(WriteLease lease, node->Allocate(bytes.size()));
  std::memcpy(lease.data().data(), bytes.data(), bytes.size());
  proto::VersionInfo info = mv.info;  // keeps the upstream's replicas; Commit lists ours first
  VIPER_ASSIGN_OR_RETURN(proto::VersionInfo committed, node->Commit(std::move(lease), std::move(info)));
  log(LogLevel::kInfo, kLog, "relayed {} version {} ({} bytes) from {} via {}", committed.model, committed.version,
      committed.size, options.upstream, fetch_path_name(mv.path));
  Announce(committed);
  return Status::OK();
}

// Best effort: a relay that cannot tell the upstream still serves its own host.
void Relay::Impl::Announce(const proto::VersionInfo& info) {
  if (!announcer || !announcer->connected()) {
    ClientOptions co;
    co.connect = options.upstream;
    co.token = options.token;
    co.name = "relay-announcer:" + node->address();
    auto c = Client::Connect(co);
    if (!c.ok()) {
      announcer.reset();
      log(LogLevel::kWarn, kLog, "cannot announce {} version {} to {}: {}", info.model, info.version, options.upstream,
          c.status().message());
      return;
    }
    announcer = std::move(c).value();
  }
  proto::Replica self{proto::ReplicaKind::kNode, node->host_key(), node->address()};
  if (Status st = announcer->AnnounceReplica(info.model, info.version, self); !st.ok())
    log(LogLevel::kWarn, kLog, "cannot announce {} version {} to {}: {}", info.model, info.version, options.upstream,
        st.message());
}

Relay::Relay(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Relay::~Relay() {
  if (!impl_) return;
  for (auto& s : impl_->subscribers) s->Close();  // no callback runs after this
  impl_->subscribers.clear();
  impl_->announcer.reset();  // the upstream forgets our replicas
}

Result<std::unique_ptr<Relay>> Relay::Start(Node& node, const RelayOptions& options) {
  if (options.upstream.empty()) return Status::InvalidArgument("relay: the upstream address is required");
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
    so.token = options.token;
    so.name = node.options().name.empty() ? "relay" : "relay:" + node.options().name;
    so.file_dir = options.file_dir;
    so.buffers = 1;  // each version is copied into the host tier at once
    VIPER_ASSIGN_OR_RETURN(auto sub, Subscriber::Start(so));
    Impl* raw = impl.get();  // subscribers are closed before the Impl goes
    sub->OnUpdate([raw](const std::shared_ptr<const ModelVersion>& mv) { raw->OnVersion(*mv); });
    if (auto live = sub->latest()) raw->OnVersion(*live);  // loaded before the callback was set
    impl->subscribers.push_back(std::move(sub));
  }
  log(LogLevel::kInfo, kLog, "relaying {} model(s) from {}", options.models.size(), options.upstream);
  return relay;
}

RelayStats Relay::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace viper
