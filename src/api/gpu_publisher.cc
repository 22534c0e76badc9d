// GpuPublisher (include/viper/gpu_publisher.h).
#include "viper/gpu_publisher.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "store/host_tier.h"
#include "viper/node.h"

namespace viper {

// The store as the node's device replica of the model: the node leases its live version to
// same-host consumers (FETCH kDevice). Detached before the store goes; a lease released after
// that is a no-op.
class GpuPublisher::Replicas : public DeviceReplicaSource {
 public:
  Replicas(gpu::DeviceVersionStore* store, int device) : store_(store), device_(device) {}
  int device() const override { return device_; }
  uint64_t live_version() const override {
    std::lock_guard lock(mu_);
    return store_ ? store_->live_version() : 0;
  }
  Result<std::string> Lease(uint64_t version) override {
    std::lock_guard lock(mu_);
    if (!store_) return Status::NotFound("GPU: the producer's device copy is closed");
    VIPER_ASSIGN_OR_RETURN(gpu::GpuVersion v, store_->Acquire());
    if (version != 0 && v.version != version) {
      store_->Release(v);
      return Status::NotFound("GPU: version " + std::to_string(version) + " is no longer on the device (version " +
                              std::to_string(v.version) + " is live there)");
    }
    return gpu::EncodeGpuVersion(v);
  }
  void Release(const std::string& message) override {
    auto v = gpu::ParseGpuVersion(std::as_bytes(std::span(message.data(), message.size())));
    std::lock_guard lock(mu_);
    if (store_ && v.ok()) store_->Release(*v);
  }
  void Detach() {
    std::lock_guard lock(mu_);
    store_ = nullptr;
  }

 private:
  mutable std::mutex mu_;
  gpu::DeviceVersionStore* store_;
  int device_;
};

struct GpuPublisher::Shared {
  Publisher* publisher = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  struct Pending {
    PublishInfo info;
    int64_t publish_ns = 0;  // CLOCK_REALTIME of PublishDevice
  };
  std::map<uint64_t, Pending> pending;  // version -> what PublishDevice was given
  uint64_t committed = 0;
  Status failed;

  // On the store's thread, as soon as the device copy completes: the version announced device-only
  // to the same-host subscribers that place versions on a GPU (Node::AnnounceDevice).
  void AnnounceLive(const gpu::GpuVersion& v) {
    proto::VersionInfo vi;
    vi.model = publisher->options().model;
    vi.version = v.version;
    vi.size = v.total_bytes;  // the host snapshot's size: same layout
    {
      std::lock_guard lock(mu);
      auto it = pending.find(v.version);
      if (it == pending.end()) return;  // committed already (announced after the checksum)
      vi.step = it->second.info.step;
      vi.publish_ns = it->second.publish_ns;
      if (it->second.info.loss) vi.metadata[std::string(kMetaLoss)] = std::to_string(*it->second.info.loss);
    }
    publisher->node().AnnounceDevice(std::move(vi));
  }

  // On the store's thread: the sealed host snapshot into a segment, committed on the node.
  Status Commit(const gpu::GpuVersion& v, std::span<const std::byte> snapshot) {
    Pending p;
    {
      std::lock_guard lock(mu);
      auto it = pending.find(v.version);
      if (it != pending.end()) {
        p = std::move(it->second);
        pending.erase(it);
      }
    }
    const PublishInfo& info = p.info;
    Node& node = publisher->node();
    VIPER_ASSIGN_OR_RETURN(WriteLease lease, node.Allocate(snapshot.size()));
    std::memcpy(lease.data().data(), snapshot.data(), snapshot.size());
    proto::VersionInfo vi;
    vi.model = publisher->options().model;
    vi.version = v.version;
    vi.size = snapshot.size();
    vi.checksum = v.checksum;
    vi.step = info.step;
    vi.publish_ns = p.publish_ns;
    if (info.loss) vi.metadata[std::string(kMetaLoss)] = std::to_string(*info.loss);
    VIPER_RETURN_IF_ERROR(node.Commit(std::move(lease), std::move(vi)).status());
    return Status::OK();
  }
};

Result<std::unique_ptr<GpuPublisher>> GpuPublisher::Start(Publisher* publisher, gpu::DeviceVersionStore::Options options) {
  if (publisher == nullptr) return Status::InvalidArgument("GpuPublisher::Start: publisher is null");
  options.host_copy = true;  // the host path needs the sealed copy
  options.alignment = publisher->options().alignment;
  std::unique_ptr<GpuPublisher> gp(new GpuPublisher());
  gp->shared_ = std::make_shared<Shared>();
  gp->shared_->publisher = publisher;
  std::weak_ptr<Shared> weak = gp->shared_;
  auto on_live = [weak](const gpu::GpuVersion& v) {
    if (auto s = weak.lock()) s->AnnounceLive(v);
  };
  VIPER_ASSIGN_OR_RETURN(
      gp->store_, gpu::DeviceVersionStore::Create(options, on_live, [weak](const gpu::GpuVersion& v, std::span<const std::byte> snap) {
        auto s = weak.lock();
        if (!s) return;
        Status st = s->Commit(v, snap);
        {
          std::lock_guard lock(s->mu);
          if (st.ok()) s->committed = std::max(s->committed, v.version);
          else if (s->failed.ok()) s->failed = st.WithContext("GPU version " + std::to_string(v.version) + " to the host tier");
        }
        s->cv.notify_all();
      }));
  gp->replicas_ = std::make_shared<Replicas>(gp->store_.get(), options.device);
  publisher->node().SetDeviceReplicas(publisher->options().model, gp->replicas_);
  return gp;
}

GpuPublisher::~GpuPublisher() {
  if (replicas_) {  // consumers' leases end with the store; their mappings of it go stale
    shared_->publisher->node().SetDeviceReplicas(shared_->publisher->options().model, nullptr);
    replicas_->Detach();
  }
  store_.reset();  // the store's thread finishes its queue first
}

Result<VersionStamp> GpuPublisher::Reserve(const PublishInfo& info, const char* what) {
  const std::string& model = shared_->publisher->options().model;
  if (!info.metadata.empty())
    return Status::InvalidArgument(std::string(what) + ": user metadata is not supported on the GPU path (" +
                                   std::to_string(info.metadata.size()) + " keys given)");
  VIPER_ASSIGN_OR_RETURN(uint64_t version, shared_->publisher->node().ReserveVersion(model));
  VersionStamp stamp;
  stamp.model = model;
  stamp.version = version;
  stamp.step = info.step;
  stamp.time_ns = static_cast<uint64_t>(WallClockNs());
  stamp.loss = info.loss;
  {
    std::lock_guard lock(shared_->mu);
    shared_->pending[version] = Shared::Pending{info, static_cast<int64_t>(stamp.time_ns)};
  }
  return stamp;
}

void GpuPublisher::Unreserve(uint64_t version) {
  std::lock_guard lock(shared_->mu);
  shared_->pending.erase(version);
}

Result<uint64_t> GpuPublisher::PublishDevice(const std::vector<gpu::DeviceTensor>& tensors,
                                             const gpu::Stream& producer_stream, const PublishInfo& info) {
  VIPER_ASSIGN_OR_RETURN(VersionStamp stamp, Reserve(info, "GpuPublisher::PublishDevice"));
  const uint64_t version = stamp.version;
  Status st = store_->Publish(tensors, producer_stream, std::move(stamp));
  if (!st.ok()) {
    Unreserve(version);
    return st;
  }
  return version;
}

Result<gpu::DeviceDraft> GpuPublisher::BeginDevice(const std::vector<TensorSpec>& specs) {
  return store_->Begin(specs);
}

Result<uint64_t> GpuPublisher::CommitDevice(gpu::DeviceDraft draft, const gpu::Stream& producer_stream,
                                            const PublishInfo& info) {
  if (!draft.valid())
    return Status::InvalidArgument("GpuPublisher::CommitDevice: the draft is empty (committed or abandoned)");
  VIPER_ASSIGN_OR_RETURN(VersionStamp stamp, Reserve(info, "GpuPublisher::CommitDevice"));
  const uint64_t version = stamp.version;
  Status st = store_->Commit(std::move(draft), producer_stream, std::move(stamp));
  if (!st.ok()) {
    Unreserve(version);
    return st;
  }
  return version;
}

Status GpuPublisher::WaitHost(uint64_t version, std::chrono::milliseconds timeout) {
  std::unique_lock lock(shared_->mu);
  bool done = shared_->cv.wait_for(lock, timeout, [&] { return !shared_->failed.ok() || shared_->committed >= version; });
  if (!shared_->failed.ok()) return shared_->failed;
  if (!done) return Status::Timeout("GPU version " + std::to_string(version) + " not in the host tier after " +
                                    std::to_string(timeout.count()) + " ms");
  return Status::OK();
}

}  // namespace viper
