// GpuPublisher: a Publisher's versions kept on the GPU, with the host path for everyone else.
//
// PublishDevice(tensors in device memory, the producer's stream, info) reserves the version number
// on the publisher's node, queues the device copy into a DeviceVersionStore (include/viper/
// gpu_store.h: device-to-device, ordered after the producer's stream by an event, the version live
// on the GPU when its copy completes) and returns without waiting for the device. The store's
// thread copies the version's pinned host copy (same layout, same bytes) into a host-tier segment
// chunk by chunk as it lands from the device, and commits it on the node once sealed (checksum and
// header with this model, version, step, time and loss): subscribers without a GPU, on this host or
// another, receive the same version through the host path, under the same number and checksum.
// Subscribers on the network that take versions still arriving (kSubscribeIncoming) are told at
// the first chunk (Node::Produce) and receive it as it lands (with PublisherOptions::cut_through).
//
// The node lists the live device version in its NOTIFY (a kDevice replica) and leases it to
// consumers on this host (FETCH kDevice: the CUDA IPC handle under the node's lease rules), so a
// Subscriber with SubscriberOptions::gpu_device copies it device-to-device or reads it in place.
// As soon as a version's device copy completes (before its host copy is sealed) it is also
// announced device-only (Node::AnnounceDevice) to the same-host subscribers with
// SubscriberOptions::gpu_early, which go live from the device copy alone.
//
// BeginDevice/CommitDevice is the zero-copy form: the producer writes the tensors in place in the
// version's device buffer, and CommitDevice then follows PublishDevice's path from its copies on.
//
// Versions are numbered by the node in PublishDevice/CommitDevice call order; use one publishing path per
// model (PublishDevice, or the Publisher's Publish/Commit). Thread-safety: PublishDevice, BeginDevice and
// CommitDevice from one thread at a time; store() as DeviceVersionStore.
#pragma once

#include <memory>
#include <vector>

#include "viper/gpu_store.h"
#include "viper/publisher.h"

namespace viper {

class GpuPublisher {
 public:
  // `publisher` is borrowed and must outlive this object. Unavailable without a GPU.
  static Result<std::unique_ptr<GpuPublisher>> Start(Publisher* publisher,
                                                     gpu::DeviceVersionStore::Options options = {});
  ~GpuPublisher();  // waits for queued versions to be sealed and committed

  // The version number on success. Errors: the node's (ReserveVersion), the store's (Publish).
  Result<uint64_t> PublishDevice(const std::vector<gpu::DeviceTensor>& tensors, const gpu::Stream& producer_stream,
                                 const PublishInfo& info = {});
  // Zero-copy: a device buffer of the store laid out for `specs` (gpu::DeviceVersionStore::Begin),
  // for the producer to write each tensor in place (draft.tensor(name): a device pointer) with its
  // own work on its stream. The version number is taken at CommitDevice. Errors: the store's Begin.
  Result<gpu::DeviceDraft> BeginDevice(const std::vector<TensorSpec>& specs);
  // Publishes the draft as PublishDevice publishes its copies: the version number reserved on the
  // node, the version ordered after producer_stream's queued work (the writes) by an event and
  // announced when that completes, the host copy sealed and committed in the background. Returns
  // without waiting for the device. The draft is consumed (abandoned on error).
  Result<uint64_t> CommitDevice(gpu::DeviceDraft draft, const gpu::Stream& producer_stream,
                                const PublishInfo& info = {});
  // Blocks until `version` is committed in the host tier (announced to every subscriber), or the
  // first error of its device copy or of the host path (Timeout only if neither came in time).
  Status WaitHost(uint64_t version, std::chrono::milliseconds timeout);
  gpu::DeviceVersionStore& store() { return *store_; }

 private:
  struct Shared;
  class Replicas;
  // The version number and stamp for `info` (the number reserved on the node), registered as
  // pending for the host path; `what` names the caller in errors.
  Result<VersionStamp> Reserve(const PublishInfo& info, const char* what);
  void Unreserve(uint64_t version);
  GpuPublisher() = default;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Replicas> replicas_;  // the node's device replica of the model
  std::unique_ptr<gpu::DeviceVersionStore> store_;
};

}  // namespace viper
