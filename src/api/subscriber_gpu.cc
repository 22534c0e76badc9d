// Subscriber: versions placed on a GPU (SubscriberOptions::gpu_device): device-to-device from the
// producer's GPU copy through CUDA IPC under a node lease (FETCH kDevice), or host-to-device.
#include <algorithm>
#include <cstring>
#include <functional>

#include "subscriber_impl.h"
#include "viper/gpu.h"
#include "viper/gpu_store.h"
#include "viper/log.h"
#include "viper/node.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "subscriber";
// Why a version is placed from host bytes when its announcement lists no kDevice replica.
constexpr std::string_view kNoGpuCopyListed =
    "the node lists no GPU copy of it (a CPU producer, a version announced while still written, or a newer version "
    "live on its GPU)";
}  // namespace

struct Subscriber::Impl::GpuState {
  int device = 0;
  gpu::Stream stream;
  // The producer's buffers opened through CUDA IPC (cached: the producer reuses them). Shared with
  // in-place versions, which read through its mappings.
  std::shared_ptr<gpu::DeviceVersionReader> reader;
  // This subscriber's own device buffers: one is reused once no ModelVersion holds it (use_count 1),
  // so the live version's buffer is never written while a new one is copied in.
  std::vector<std::shared_ptr<gpu::DeviceBuffer>> buffers;

  Result<std::shared_ptr<gpu::DeviceBuffer>> Take(uint64_t bytes) {
    for (auto& b : buffers)
      if (b.use_count() == 1 && b->size() == bytes) return b;
    std::erase_if(buffers, [](const auto& b) { return b.use_count() == 1; });  // free, of another size
    VIPER_ASSIGN_OR_RETURN(gpu::DeviceBuffer nb, gpu::DeviceBuffer::Allocate(device, std::max<uint64_t>(bytes, 1)));
    buffers.push_back(std::make_shared<gpu::DeviceBuffer>(std::move(nb)));
    return buffers.back();
  }
};

Status Subscriber::Impl::StartGpu() {
  if (options.gpu_device < -1)
    return Status::InvalidArgument("SubscriberOptions::gpu_device " + std::to_string(options.gpu_device) +
                                   ": must be -1 (no GPU) or a CUDA device ordinal >= 0");
  if (options.gpu_device == -1) {
    if (options.gpu_in_place)
      return Status::InvalidArgument("SubscriberOptions::gpu_in_place needs gpu_device >= 0 (it is -1)");
    if (options.gpu_early)
      return Status::InvalidArgument("SubscriberOptions::gpu_early needs gpu_device >= 0 (it is -1)");
    return Status::OK();
  }
  if (Status st = gpu::Available(); !st.ok())
    return st.WithContext("SubscriberOptions::gpu_device " + std::to_string(options.gpu_device));
  if (int n = gpu::DeviceCount(); options.gpu_device >= n)
    return Status::InvalidArgument("SubscriberOptions::gpu_device " + std::to_string(options.gpu_device) +
                                   ": this machine has " + std::to_string(n) + " GPU(s)");
  auto g = std::make_shared<GpuState>();
  g->device = options.gpu_device;
  VIPER_ASSIGN_OR_RETURN(g->stream, gpu::Stream::Create(g->device));
  g->reader = std::make_shared<gpu::DeviceVersionReader>(g->device);
  gpu = std::move(g);
  return Status::OK();
}

Status Subscriber::Impl::PlaceOnDevice(ModelVersion& mv, const proto::VersionInfo& announced) {
  std::string why_host = std::string(kNoGpuCopyListed);
  bool listed = std::any_of(announced.replicas.begin(), announced.replicas.end(),
                            [](const proto::Replica& r) { return r.kind == proto::ReplicaKind::kDevice; });
  if (listed) {
    auto c = EnsureClient();
    if (!c.ok()) {
      why_host = "node unreachable: " + c.status().message();
    } else if (!(*c)->same_host()) {
      why_host = "the producer's GPU is on another host";
    } else {
      Status st = PlaceFromProducer(mv, **c, *c);
      if (st.ok()) return st;
      why_host = "GPU copy not opened: " + st.message();
      log(LogLevel::kWarn, kLog, "{} version {}: {}; copying from host memory", options.model, mv.version(), why_host);
    }
  }
  GpuState& g = *gpu;
  auto data = mv.snapshot.data_region();
  VIPER_ASSIGN_OR_RETURN(std::shared_ptr<gpu::DeviceBuffer> buf, g.Take(data.size()));
  VIPER_RETURN_IF_ERROR(gpu::CopyHostToDevice(buf->ptr(), data.data(), data.size(), g.stream));
  VIPER_RETURN_IF_ERROR(g.stream.Synchronize());
  auto dv = std::make_shared<DeviceVersion>();
  dv->device = g.device;
  dv->data = buf->ptr();
  dv->bytes = data.size();
  dv->how = "host-to-device (" + why_host + ")";
  dv->tensors = mv.snapshot.tensors();
  dv->hold = std::move(buf);
  mv.device = std::move(dv);
  return Status::OK();
}

Status Subscriber::Impl::PlaceFromProducer(ModelVersion& mv, Client& client, const std::shared_ptr<Client>& connection) {
  GpuState& g = *gpu;
  VIPER_ASSIGN_OR_RETURN(proto::FetchOk ok, client.FetchDevice(mv.info.model, mv.info.version));
  std::function<void()> release = client.Releaser(ok.info.model, ok.info.version);
  auto fail = [&](Status st) {
    release();
    return st;
  };
  auto v = gpu::ParseGpuVersion(std::as_bytes(std::span(ok.segment.data(), ok.segment.size())));
  if (!v.ok()) return fail(v.status());
  const bool device_only = mv.snapshot.bytes().empty();  // no host bytes: the layout comes from the device
  const uint64_t data_bytes = device_only ? v->data_bytes : mv.snapshot.data_region().size();
  if (v->version != mv.info.version || v->data_bytes != data_bytes || (device_only && v->total_bytes != mv.info.size))
    return fail(Status::FailedPrecondition(
        "the node leased GPU version " + std::to_string(v->version) + " of " + std::to_string(v->total_bytes) + " bytes (" +
        std::to_string(v->data_bytes) + " data) for version " + std::to_string(mv.info.version) + " of " +
        std::to_string(mv.info.size) + " bytes (" + std::to_string(data_bytes) + " data)"));
  if (v->checksum != 0 && mv.info.checksum != 0 && v->checksum != mv.info.checksum)
    return fail(Status::Corruption("GPU version " + std::to_string(v->version) + ": checksum " + checksum_hex(v->checksum) +
                                   " != announced " + checksum_hex(mv.info.checksum)));
  auto dv = std::make_shared<DeviceVersion>();
  dv->device = g.device;
  dv->bytes = data_bytes;
  if (device_only) {
    auto header = g.reader->ReadHeader(*v, g.stream);
    if (!header.ok()) return fail(header.status());
    dv->tensors = std::move(header->tensors);
  } else {
    dv->tensors = mv.snapshot.tensors();
  }
  if (options.gpu_in_place) {
    auto mapped = g.reader->Map(*v);
    if (!mapped.ok()) return fail(mapped.status());
    struct InPlace {
      std::shared_ptr<gpu::DeviceVersionReader> reader;  // its mapping of the producer's buffer
      std::shared_ptr<Client> connection;                // the lease lives on it
      std::function<void()> release;
      InPlace() = default;
      InPlace(const InPlace&) = delete;
      InPlace& operator=(const InPlace&) = delete;
      ~InPlace() {
        if (release) release();
      }
    };
    auto hold = std::make_shared<InPlace>();
    hold->reader = g.reader;
    hold->connection = connection;
    hold->release = std::move(release);
    dv->data = *mapped + v->data_offset;
    dv->in_place = true;
    dv->how = "in place in the producer's GPU buffer " + std::to_string(v->buffer) + " (CUDA IPC, leased)";
    dv->hold = std::move(hold);
  } else {
    auto buf = g.Take(data_bytes);
    if (!buf.ok()) return fail(buf.status());
    if (Status st = g.reader->CopyInto(*v, (*buf)->ptr(), g.stream); !st.ok()) return fail(st);
    release();  // the copy is complete: the producer may reuse its buffer
    dv->data = (*buf)->ptr();
    dv->how = "device-to-device from the producer's GPU buffer " + std::to_string(v->buffer) + " (CUDA IPC)";
    dv->hold = std::move(buf).value();
  }
  mv.device = std::move(dv);
  return Status::OK();
}

// Copies a remote transfer's data region to this consumer's GPU as it lands: the transfer's
// landed prefix [0, landed) grows chunk by chunk (on the loader thread, between chunks), and each
// new piece of the data region [8 + N, size) goes host-to-device on the GPU state's stream at once,
// into a buffer of the consumer's own that becomes the version's device copy once the bytes
// verified. Until then nothing reads the buffer; a transfer that fails or does not verify leaves it
// free again. The receive buffer is pooled, pageable memory: the driver stages each piece through
// its own pinned memory and returns once it has read it, so the host buffer is free of the GPU when
// the transfer ends (the destructor waits for the stream all the same).
class Subscriber::Impl::DeviceStaging {
 public:
  DeviceStaging(std::shared_ptr<GpuState> gpu, std::string why) : gpu_(std::move(gpu)), why_(std::move(why)) {}
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;
  ~DeviceStaging() {
    if (copied_ > data_begin_) (void)gpu_->stream.Synchronize();
  }

  // received: the transfer's buffer; bytes [0, landed) of the version's `total` have landed in it.
  void Received(std::span<const std::byte> received, uint64_t landed, uint64_t total) {
    if (!failure_.ok() || total > received.size() || landed > total) return;
    received = received.first(total);
    if (buffer_ == nullptr) {
      if (landed < 8) return;
      uint64_t n = 0;
      std::memcpy(&n, received.data(), 8);  // little-endian u64, as the format says
      if (n > received.size() - 8) {  // the snapshot's parse refuses it with the whole story
        failure_ = Status::Corruption("header length " + std::to_string(n) + " past the transfer's end");
        return;
      }
      data_begin_ = copied_ = 8 + n;
      auto taken = gpu_->Take(received.size() - data_begin_);
      if (!taken.ok()) {
        failure_ = taken.status();
        return;
      }
      buffer_ = std::move(taken).value();
    }
    if (landed <= copied_) return;
    failure_ = gpu::CopyHostToDevice(buffer_->ptr() + (copied_ - data_begin_), received.data() + copied_, landed - copied_,
                                     gpu_->stream);
    copied_ = landed;
  }

  // mv.device from the staged copy, or why there is none (the caller copies the bytes whole).
  Status Finish(ModelVersion& mv) {
    VIPER_RETURN_IF_ERROR(failure_);
    const uint64_t size = mv.snapshot.bytes().size();
    if (buffer_ == nullptr || data_begin_ != mv.snapshot.data_offset() || copied_ != size)
      return Status::FailedPrecondition("staged " + std::to_string(copied_ > data_begin_ ? copied_ - data_begin_ : 0) +
                                        " of the " + std::to_string(mv.snapshot.data_region().size()) + " data bytes");
    VIPER_RETURN_IF_ERROR(gpu_->stream.Synchronize());
    auto dv = std::make_shared<DeviceVersion>();
    dv->device = gpu_->device;
    dv->data = buffer_->ptr();
    dv->bytes = size - data_begin_;
    dv->how = "host-to-device as its chunks arrived (" + why_ + ")";
    dv->tensors = mv.snapshot.tensors();
    dv->hold = std::move(buffer_);
    mv.device = std::move(dv);
    return Status::OK();
  }

 private:
  std::shared_ptr<GpuState> gpu_;
  std::string why_;  // why the host path (for DeviceVersion::how)
  std::shared_ptr<gpu::DeviceBuffer> buffer_;
  uint64_t data_begin_ = 0, copied_ = 0;  // bytes [data_begin_, copied_) of the transfer are queued
  Status failure_;
};

std::shared_ptr<Subscriber::Impl::DeviceStaging> Subscriber::Impl::StageOnDevice(const proto::VersionInfo& announced,
                                                                                 Client& client) {
  bool listed = std::any_of(announced.replicas.begin(), announced.replicas.end(),
                            [](const proto::Replica& r) { return r.kind == proto::ReplicaKind::kDevice; });
  // On the producer's host PlaceOnDevice opens its GPU copy instead, unless the network path is
  // forced (SubscriberOptions::path kRemote: as from another host).
  const bool forced = options.path == FetchPath::kRemote;
  if (listed && client.same_host() && !forced) return nullptr;
  std::string why = !listed          ? std::string(kNoGpuCopyListed)
                    : client.same_host() ? "path remote: the network path, as from another host"
                                         : "the producer's GPU is on another host";
  return std::make_shared<DeviceStaging>(gpu, std::move(why));
}

void Subscriber::Impl::StageReceived(DeviceStaging& staging, std::span<const std::byte> received, uint64_t landed,
                                     uint64_t total) {
  staging.Received(received, landed, total);
}

void Subscriber::Impl::FinishStaging(DeviceStaging& staging, ModelVersion& mv) {
  Status st = staging.Finish(mv);
  if (!st.ok())  // PlaceOnDevice copies it whole
    log(LogLevel::kWarn, kLog, "{} version {}: not staged on GPU {} as it arrived ({}); copying it whole", options.model,
        mv.version(), options.gpu_device, st.message());
}

Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::LoadDeviceOnly(const proto::VersionInfo& info) {
  VIPER_ASSIGN_OR_RETURN(std::shared_ptr<Client> c, EnsureClient());
  if (!c->same_host())
    return Status::FailedPrecondition("a device-only version of " + info.model + " from a node on another host");
  auto mv = std::make_shared<ModelVersion>();
  mv->info = info;
  VIPER_RETURN_IF_ERROR(PlaceFromProducer(*mv, *c, c).WithContext("device-only version " + std::to_string(info.version)));
  mv->path = options.gpu_in_place ? FetchPath::kMap : FetchPath::kCopy;
  mv->reason = "device only: the producer's GPU copy, announced before its host copy (" + mv->device->how + ")";
  mv->timings.fetched_ns = WallClockNs();
  return mv;
}

}  // namespace viper
