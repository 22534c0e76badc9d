// Node: GPU-resident copies of a model's versions (DeviceReplicaSource): the kDevice replica in
// NOTIFY, device-only NOTIFYs ahead of the host commit, FETCH in kDevice mode and its leases
// (docs/PROTOCOL.md, the DEVICE mode of the FETCH row).
#include <string>
#include <vector>

#include "node_impl.h"
#include "seal.h"
#include "viper/log.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "node";
}  // namespace

void Node::SetDeviceReplicas(const std::string& model, std::shared_ptr<DeviceReplicaSource> source) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (source) impl_->device_sources[model] = std::move(source);
  else impl_->device_sources.erase(model);
  impl_->device_announced.erase(model);
}

void Node::AnnounceDevice(proto::VersionInfo info) {
  std::vector<net::PeerId> to;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto src = impl_->device_sources.find(info.model);
    if (src == impl_->device_sources.end()) return;
    if (auto latest = impl_->FindLocked(info.model, 0); latest && latest->version >= info.version) return;
    info.checksum = 0;
    info.completed_ns = 0;
    info.replicas = {{proto::ReplicaKind::kDevice, host_key_, "cuda:" + std::to_string(src->second->device())}};
    internal::SealVersion(impl_->options.token, &info);  // this node vouches for it, as for a commit
    impl_->device_announced[info.model] = info;
    for (net::PeerId id : impl_->models[info.model].subscribers)
      if (auto p = impl_->peers.find(id); p != impl_->peers.end() && impl_->WantsDeviceLocked(p->second, info.model))
        to.push_back(id);
    impl_->stats.notifies_sent += to.size();
  }
  auto notify = proto::Encode(proto::Notify{info});
  for (net::PeerId peer : to) (void)impl_->engine->Send(peer, notify);
}

std::optional<proto::VersionInfo> Node::Impl::DeviceOnlyLocked(const std::string& model, uint64_t version) const {
  auto a = device_announced.find(model);
  auto src = device_sources.find(model);
  if (a == device_announced.end() || src == device_sources.end()) return std::nullopt;
  if (version != 0 && version != a->second.version) return std::nullopt;
  if (src->second->live_version() != a->second.version) return std::nullopt;
  if (auto latest = FindLocked(model, 0); latest && latest->version >= a->second.version) return std::nullopt;
  return a->second;
}

proto::VersionInfo Node::Impl::WithDeviceReplicaLocked(const proto::VersionInfo& info) const {
  auto it = device_sources.find(info.model);
  if (it == device_sources.end() || it->second->live_version() != info.version ||
      info.replicas.size() >= proto::kMaxReplicas)
    return info;
  proto::VersionInfo out = info;
  out.replicas.push_back({proto::ReplicaKind::kDevice, host_key, "cuda:" + std::to_string(it->second->device())});
  return out;
}

void Node::Impl::HandleDeviceFetch(net::PeerId peer, PeerState& p, const proto::Fetch& m) {
  if (p.host_key != host_key)
    return SendError(peer, m.request_id, proto::ErrorCode::kBadRequest,
                     "FETCH kDevice: a GPU-resident version is opened through CUDA IPC on the same host only; use SEND");
  auto src = device_sources.find(m.model);
  if (src == device_sources.end())
    return SendError(peer, m.request_id, proto::ErrorCode::kNotFound,
                     "FETCH kDevice: model " + m.model + " has no GPU-resident copy on this node");
  // A version announced device-only (not in the host tier yet), else the catalog's.
  auto info = DeviceOnlyLocked(m.model, m.version);
  if (!info) info = FindLocked(m.model, m.version);
  if (!info)
    return SendError(peer, m.request_id, proto::ErrorCode::kNotFound,
                     "FETCH kDevice: model " + m.model + " has no version " + std::to_string(m.version) +
                         " in the host tier or announced on the device");
  std::shared_ptr<DeviceReplicaSource> source = src->second;
  auto message = source->Lease(info->version);
  if (!message.ok()) return SendError(peer, m.request_id, proto::ErrorCode::kNotFound, message.status().message());
  std::shared_ptr<void> lease(nullptr, [source, msg = *message](void*) { source->Release(msg); });
  p.device_leases.emplace(std::make_pair(m.model, info->version), std::move(lease));
  stats.leases_granted++;
  log(LogLevel::kDebug, kLog, "peer {} leases the device copy of {} version {}", peer, m.model, info->version);
  Send(peer, proto::FetchOk{m.request_id, proto::FetchMode::kDevice, *info, std::move(message).value(), 0, 0,
                            proto::Encoding::kFull, 0, ""});
}

}  // namespace viper
