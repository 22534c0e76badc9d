// The producer's cut-through: a version this process is still writing into a segment of its node
// is announced (INCOMING, checksum 0) and served to remote peers as its bytes land, through the
// same IncomingVersion and sender loop that forward a relay's arriving versions; its checksum and
// final header follow (SEALED) when the writer seals it.
// Design: docs/ARCHITECTURE.md "Cut-through from the producer".
#include <cstring>

#include "node_impl.h"
#include "seal.h"
#include "viper/log.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "node";

std::string Named(const proto::VersionInfo& info) { return info.model + " version " + std::to_string(info.version); }

}  // namespace

bool Node::HasEarlyReaders(const std::string& model) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [id, p] : impl_->peers)
    if (p.incoming_models.count(model) != 0) return true;
  return false;
}

Result<std::unique_ptr<IncomingVersion>> Node::Produce(WriteLease lease, proto::VersionInfo info) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(info.model));
  VIPER_RETURN_IF_ERROR(ValidateVersion(info.version));
  if (lease.data().size() != info.size)
    return Status::InvalidArgument(Named(info) + ": a segment of " + std::to_string(lease.data().size()) +
                                   " bytes for a version of " + std::to_string(info.size));
  const uint64_t header = internal::HeaderLength(lease.data());
  if (header == 0 || header > proto::kMaxSealedHeaderBytes)
    return Status::InvalidArgument(Named(info) + ": the segment does not start with a snapshot header of at most " +
                                   std::to_string(proto::kMaxSealedHeaderBytes) + " bytes");
  auto state = std::make_shared<IncomingVersion::State>();
  state->node = impl_.get();
  state->producing = true;
  state->sealed = false;
  state->bytes = lease.data();
  state->provisional_header = std::make_shared<const std::vector<std::byte>>(
      state->bytes.begin(), state->bytes.begin() + static_cast<std::ptrdiff_t>(header));
  state->lease = std::move(lease);
  info.checksum = 0;  // not known until Seal
  info.completed_ns = 0;
  // Peers learn this node as the version's one holder, of kind relay: it does not hold it yet.
  info.replicas = {proto::Replica{proto::ReplicaKind::kRelay, host_key_, impl_->address}};
  internal::SealVersion(impl_->options.token, &info);
  state->info = std::move(info);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stats.produced_early++;
  }
  impl_->AnnounceIncoming(state);
  return std::unique_ptr<IncomingVersion>(new IncomingVersion(std::move(state)));
}

bool IncomingVersion::sealed() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->sealed;
}

Status IncomingVersion::Seal(const proto::VersionInfo& final) {
  State& st = *state_;
  Node::Impl* node = st.node;
  std::vector<std::shared_ptr<BulkSend>> told;
  proto::Sealed sealed;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.sealed) return Status::OK();
    if (st.aborted) return Status::FailedPrecondition(Named(st.info) + " was aborted: " + st.abort_reason);
    if (st.landed < st.bytes.size())
      return Status::FailedPrecondition(Named(st.info) + ": sealed with " + std::to_string(st.landed) + " of " +
                                        std::to_string(st.bytes.size()) + " bytes landed");
    if (final.model != st.info.model || final.version != st.info.version || final.size != st.info.size)
      return Status::InvalidArgument("seal of " + Named(final) + " (" + std::to_string(final.size) + " bytes) for " +
                                     Named(st.info) + " (" + std::to_string(st.info.size) + " bytes)");
    const uint64_t header = internal::HeaderLength(st.bytes);
    if (header == 0 || header > proto::kMaxSealedHeaderBytes)
      return Status::InvalidArgument(Named(st.info) + ": no snapshot header of at most " +
                                     std::to_string(proto::kMaxSealedHeaderBytes) + " bytes to seal");
    st.info.checksum = final.checksum;
    st.info.step = final.step;
    st.info.publish_ns = final.publish_ns;
    st.info.metadata = final.metadata;
    st.info.completed_ns = final.completed_ns != 0 ? final.completed_ns : WallClockNs();  // complete now (or upstream)
    internal::SealVersion(node->options.token, &st.info);
    st.sealed = true;
    told.swap(st.awaiting_seal);
    sealed.info = st.info;
    sealed.header.assign(reinterpret_cast<const char*>(st.bytes.data()), header);
  }
  if (told.empty()) return Status::OK();
  log(LogLevel::kDebug, kLog, "{} sealed while {} peer(s) received it", Named(sealed.info), told.size());
  // From the progress thread, so that SEALED follows the FETCH_OK of a send started meanwhile.
  node->engine->Post([node, told = std::move(told), sealed = std::move(sealed)]() mutable {
    for (const auto& send : told) {
      if (send->failed) continue;
      sealed.request_id = send->request_id;
      (void)node->engine->Send(send->peer, proto::Encode(sealed));
    }
  });
  return Status::OK();
}

}  // namespace viper
