// GpuPublisher (include/viper/gpu_publisher.h).
#include "viper/gpu_publisher.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "net/protocol.h"
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

  // The version whose pinned copy is landing, copied into its host-tier segment chunk by chunk as
  // the store reports them (the staged path's host stage): announced at once to remote readers
  // (Node::Produce) when the model has some, so that their transfer overlaps the device-to-host
  // copy and this one. Store's sealer thread only.
  struct Streaming {
    uint64_t version = 0;
    WriteLease lease;                        // not announced early: committed at the seal
    std::unique_ptr<IncomingVersion> early;  // announced early: remote readers receive it as it lands
    uint64_t copied = 0;                     // bytes [0, copied) of the snapshot are in the segment
    Status failed;                           // then the seal copies the snapshot whole instead
    std::span<std::byte> data() const { return early ? early->data() : lease.data(); }
  };
  Streaming streaming;

  proto::VersionInfo InfoOf(const gpu::GpuVersion& v, const Pending& p, uint64_t checksum) const {
    proto::VersionInfo vi;
    vi.model = publisher->options().model;
    vi.version = v.version;
    vi.size = v.total_bytes;
    vi.checksum = checksum;
    vi.step = p.info.step;
    vi.publish_ns = p.publish_ns;
    if (p.info.loss) vi.metadata[std::string(kMetaLoss)] = std::to_string(*p.info.loss);
    return vi;
  }

  // On the store's thread, after each chunk of v's pinned copy (HostProgressFn).
  void Progress(const gpu::GpuVersion& v, std::span<const std::byte> snapshot, uint64_t landed) {
    if (landed == 0) {  // the host copy failed: an early version's readers are aborted
      streaming = {};
      return;
    }
    if (streaming.version != v.version) {
      streaming = {};
      streaming.version = v.version;
      streaming.failed = StartSegment(v, snapshot);
      if (!streaming.failed.ok()) return;
    }
    if (!streaming.failed.ok() || landed <= streaming.copied) return;
    std::memcpy(streaming.data().data() + streaming.copied, snapshot.data() + streaming.copied, landed - streaming.copied);
    streaming.copied = landed;
    if (streaming.early) streaming.early->Landed(landed);
  }

  // A segment for v with its provisional header, produced early if a remote reader will take it.
  Status StartSegment(const gpu::GpuVersion& v, std::span<const std::byte> snapshot) {
    Node& node = publisher->node();
    VIPER_ASSIGN_OR_RETURN(WriteLease lease, node.Allocate(snapshot.size()));
    std::memcpy(lease.data().data(), snapshot.data(), v.data_offset);
    streaming.copied = v.data_offset;
    const std::string& model = publisher->options().model;
    if (!publisher->options().cut_through || v.data_offset > proto::kMaxSealedHeaderBytes || !node.HasEarlyReaders(model)) {
      streaming.lease = std::move(lease);
      return Status::OK();
    }
    Pending p;
    {
      std::lock_guard lock(mu);
      if (auto it = pending.find(v.version); it != pending.end()) p = it->second;
    }
    VIPER_ASSIGN_OR_RETURN(streaming.early, node.Produce(std::move(lease), InfoOf(v, p, 0)));
    return Status::OK();
  }

  // On the store's thread: the sealed host snapshot committed on the node: the segment it streamed
  // into (sealed, if announced early), else one copy of the snapshot into a new segment.
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
    Node& node = publisher->node();
    proto::VersionInfo vi = InfoOf(v, p, v.checksum);
    Streaming done = std::exchange(streaming, {});
    if (done.version == v.version && done.failed.ok() && done.copied == snapshot.size()) {
      std::memcpy(done.data().data(), snapshot.data(), v.data_offset);  // the final header
      if (done.early) {
        VIPER_RETURN_IF_ERROR(done.early->Seal(vi));
        return done.early->Commit().status();
      }
      return node.Commit(std::move(done.lease), std::move(vi)).status();
    }
    done = {};  // aborts an early version that did not land whole
    VIPER_ASSIGN_OR_RETURN(WriteLease lease, node.Allocate(snapshot.size()));
    std::memcpy(lease.data().data(), snapshot.data(), snapshot.size());
    return node.Commit(std::move(lease), std::move(vi)).status();
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
        if (st.ok()) {
          s->publisher->NoteAnnounced(v.version);
          s->publisher->KeepSpareLater(snap.size());
        }
        {
          std::lock_guard lock(s->mu);
          if (st.ok()) s->committed = std::max(s->committed, v.version);
          else if (s->failed.ok()) s->failed = st.WithContext("GPU version " + std::to_string(v.version) + " to the host tier");
        }
        s->cv.notify_all();
      },
      [weak](const gpu::GpuVersion& v, std::span<const std::byte> snapshot, uint64_t landed) {
        if (auto s = weak.lock()) s->Progress(v, snapshot, landed);
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
  shared_->streaming = {};  // an early version left unsealed is aborted while its node lives
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
  // First the store's seal: a version whose device copy failed never reaches the commit below, and
  // the store has its error. A sealed version has been handed to Commit (committed or failed).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string what = "GPU version " + std::to_string(version) + " to the host tier";
  VIPER_RETURN_IF_ERROR(store_->Wait(version, timeout, /*sealed=*/true).WithContext(what));
  std::unique_lock lock(shared_->mu);
  bool done = shared_->cv.wait_until(lock, deadline, [&] { return !shared_->failed.ok() || shared_->committed >= version; });
  if (!shared_->failed.ok()) return shared_->failed;
  if (!done) return Status::Timeout("GPU version " + std::to_string(version) + " not in the host tier after " +
                                    std::to_string(timeout.count()) + " ms");
  return Status::OK();
}

}  // namespace viper
