// Node: GPU-resident copies of a model's versions (DeviceReplicaSource): the kDevice replica in
// NOTIFY, FETCH in kDevice mode and its leases (docs/PROTOCOL.md "FETCH kDevice").
#include <string>

#include "node_impl.h"
#include "viper/log.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "node";
}  // namespace

void Node::SetDeviceReplicas(const std::string& model, std::shared_ptr<DeviceReplicaSource> source) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (source) impl_->device_sources[model] = std::move(source);
  else impl_->device_sources.erase(model);
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
  auto info = FindLocked(m.model, m.version);
  if (!info)
    return SendError(peer, m.request_id, proto::ErrorCode::kNotFound,
                     "FETCH kDevice: model " + m.model + " has no version " + std::to_string(m.version) +
                         " in the host tier (a device copy is leased with its version's catalog entry)");
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
