// GPU-resident versions: a producer keeps each published version in device memory, in the
// snapshot's own layout, and same-node consumers in other processes open it through CUDA IPC.
//
// DeviceVersionStore (producer side). Publish queues, on the store's own copy stream, one
// device-to-device copy per tensor into a device buffer laid out exactly as the host snapshot
// (SnapshotLayout: header space, then every tensor at its data offset), ordered after the
// producer's stream by an event (cuStreamWaitEvent: the device orders the copy; the host never
// waits and nothing synchronizes the device). An announcer thread announces each version (LiveFn)
// when its copy event completes, in publish order. When host_copy is on, a second stream copies the
// buffer's data region to pinned host memory after the same event; a sealer thread then seals it
// there (xxh3 checksum + header, SnapshotLayout::Seal) and hands the complete host snapshot to
// SealedFn (the host/file tiers), in order. The two threads are separate so that a version is
// announced when its device copy completes even while earlier versions are still being sealed.
// With Announce::kAfterChecksum the version is announced only once sealed.
//
// The buffer's header space holds the snapshot header as of Publish (copied from pinned memory on
// the copy stream before the `copied` event; viper.checksum reads 0 there, the sealed host copy has
// the real one), so a consumer that has only the device copy reads the layout from it
// (DeviceVersionReader::ReadHeader).
//
// Buffers are reused across versions as the host tier reuses segments: a buffer is free again
// when it is neither the live version, nor leased (Acquire/Release), nor still being copied or
// sealed. Publish allocates a new buffer while fewer than max_buffers exist, else it waits for one
// to free (the only case in which Publish blocks the caller).
//
// Zero-copy (Begin/Commit): Begin hands out a buffer laid out for the given specs (a DeviceDraft:
// each tensor's device pointer at its data offset), the producer writes the tensors in place with
// its own work on its stream, and Commit queues the version exactly as Publish does after its
// copies: ordered after the producer's stream by the `ready` event, the header written, announced
// when `copied` completes, the pinned copy sealed in the background. A draft holds its buffer (not
// reused) until committed or destroyed; destroyed uncommitted, nothing is announced.
//
// DeviceVersionReader (consumer side): opens a GpuVersion's IPC handle (cached per buffer, since
// buffers are reused) and copies the data region device-to-device into the consumer's memory.
//
// GpuVersion travels between processes as a fixed 128-byte message (EncodeGpuVersion /
// ParseGpuVersion; docs/PROTOCOL.md "GPU version").
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "viper/gpu.h"
#include "viper/snapshot.h"
#include "viper/status.h"

namespace viper::gpu {

// A tensor in the producer's device memory: spec.dtype/shape give its byte count.
struct DeviceTensor {
  TensorSpec spec;
  DevicePtr ptr = 0;
};

// What a same-node consumer needs to open a version.
struct GpuVersion {
  uint64_t version = 0;
  uint64_t total_bytes = 0;  // the device buffer's snapshot extent: header space + data
  uint64_t data_offset = 0;  // where the data region starts in the buffer
  uint64_t data_bytes = 0;
  uint64_t checksum = 0;     // xxh3 of the data region; 0 until sealed (Announce::kAfterDeviceCopy)
  int32_t device = 0;
  uint32_t buffer = 0;       // the producer's buffer index (a lease names version and buffer)
  uint32_t producer_pid = 0;
  IpcHandle handle{};
};

inline constexpr size_t kGpuVersionMessageBytes = 128;
std::string EncodeGpuVersion(const GpuVersion& v);
// Corruption naming the field and value when the bytes are not a GPU version message: wrong size,
// magic or format, data region outside total_bytes, negative device.
Result<GpuVersion> ParseGpuVersion(std::span<const std::byte> bytes);

class DeviceVersionStore;

// A version being written in place in one of the store's device buffers (DeviceVersionStore::
// Begin): each tensor is a device pointer into the buffer at its snapshot data offset, to be
// written by the producer's own work (kernels, copies) on its stream, then committed. Move-only.
// Destroying it without Commit abandons it: nothing is announced and the buffer is free again, so
// no work may still be writing the tensors by then (synchronize the stream that wrote them). The
// pointers are valid until Commit or destruction, and never after the store is destroyed.
class DeviceDraft {
 public:
  DeviceDraft() = default;
  DeviceDraft(DeviceDraft&& other) noexcept;
  DeviceDraft& operator=(DeviceDraft&& other) noexcept;
  ~DeviceDraft();  // abandons the version unless committed

  // Tensor `name`'s place in the buffer (0 if unknown).
  DevicePtr tensor(std::string_view name) const;
  // Every tensor (spec and device pointer), in the order Begin was given.
  const std::vector<DeviceTensor>& tensors() const { return tensors_; }
  const SnapshotLayout& layout() const { return *layout_; }
  int device() const { return device_; }
  bool valid() const { return layout_ != nullptr; }

 private:
  friend class DeviceVersionStore;
  void Abandon();
  std::weak_ptr<void> store_;  // the store's state; expired once the store is destroyed
  size_t buffer_ = 0;
  int device_ = 0;
  std::shared_ptr<const SnapshotLayout> layout_;
  std::vector<DeviceTensor> tensors_;
};

class DeviceVersionStore {
 public:
  enum class Announce { kAfterDeviceCopy, kAfterChecksum };
  struct Options {
    int device = 0;
    size_t max_buffers = 3;  // live + one being written + one leased
    bool host_copy = true;   // pinned copy, checksum and seal of every version
    Announce announce = Announce::kAfterDeviceCopy;
    uint64_t alignment = 64;
    // Tests: called on the sealer thread with a version's number before its host copy is followed
    // and sealed; a test that holds it here orders what the host path does after what it checks.
    std::function<void(uint64_t version)> before_seal;
  };
  using LiveFn = std::function<void(const GpuVersion&)>;
  // The sealed host snapshot (header + data, checksum in the header); valid during the call.
  using SealedFn = std::function<void(const GpuVersion&, std::span<const std::byte> snapshot)>;
  // The pinned host copy of a version as it lands, before its checksum is known (host_copy): the
  // device-to-host copy runs in chunks, and the sealer calls this after each chunk completed, with
  // the version (checksum 0), its whole host snapshot (a provisional header with checksum 0, then
  // the data region) and `landed`: bytes [0, landed) are final, but for the header, which the seal
  // rewrites. Calls for one version come in order, the last with landed == snapshot.size(), then
  // SealedFn; if the version's host copy fails, one more call with landed == 0 and an empty
  // snapshot says to drop it. On the sealer thread; the snapshot is valid during the call.
  using HostProgressFn = std::function<void(const GpuVersion&, std::span<const std::byte> snapshot, uint64_t landed)>;

  static Result<std::unique_ptr<DeviceVersionStore>> Create(Options options, LiveFn on_live = {},
                                                            SealedFn on_sealed = {}, HostProgressFn on_progress = {});
  ~DeviceVersionStore();  // waits for queued versions
  DeviceVersionStore(const DeviceVersionStore&) = delete;
  DeviceVersionStore& operator=(const DeviceVersionStore&) = delete;

  // Call from one thread at a time. Queues version stamp.version of `tensors` (written by work on
  // producer_stream). Returns once the copies are queued; work queued on producer_stream after
  // the call runs after the copies have read the tensors (a device-side wait, no host sync), so
  // the producer may overwrite them at once. Errors: InvalidArgument (bad specs, tensor on another device,
  // version not above the last), the GPU's errors.
  Status Publish(const std::vector<DeviceTensor>& tensors, const Stream& producer_stream, VersionStamp stamp);
  // Zero-copy: a buffer laid out for `specs` (the layout Publish would make for them) handed out
  // for the producer to write the tensors in place (DeviceDraft). Takes a buffer under the rules of
  // Publish (a free one, a new one below max_buffers, else it waits). A buffer that held another
  // layout is zeroed first, the host waiting for that. Errors: InvalidArgument (bad specs: the
  // snapshot layout's message, or no tensor), the GPU's errors.
  Result<DeviceDraft> Begin(const std::vector<TensorSpec>& specs);
  // Queues version stamp.version of the draft as Publish queues a version once its copies are
  // queued: ordered after producer_stream's queued work (the draft's writes) by an event, the
  // header written, announced when that completes, the pinned host copy sealed in the background.
  // The draft is consumed (abandoned on error). Errors: InvalidArgument (a draft of another store,
  // an empty one, stream on another device, version not above the last), the GPU's errors.
  Status Commit(DeviceDraft draft, const Stream& producer_stream, VersionStamp stamp);
  // Blocks until `version` is live (or sealed, if sealed=true). Timeout / the copy's error.
  Status Wait(uint64_t version, std::chrono::milliseconds timeout, bool sealed = false);
  // Leases the live version (NotFound before the first): its buffer is not reused until Release.
  Result<GpuVersion> Acquire();
  void Release(const GpuVersion& v);
  // The live version's number (0 before the first).
  uint64_t live_version() const;
  size_t buffers() const;

 private:
  friend class DeviceDraft;
  struct Impl;
  explicit DeviceVersionStore(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with the drafts (weakly), so a draft may outlive the store
};

class DeviceVersionReader {
 public:
  explicit DeviceVersionReader(int device) : device_(device) {}
  // Copies v's data region into dst (data_bytes bytes of device memory) on `stream` and waits for it.
  Status CopyInto(const GpuVersion& v, DevicePtr dst, const Stream& stream);
  // The producer's buffer mapped into this process (cached); valid while this reader lives.
  Result<DevicePtr> Map(const GpuVersion& v);
  // The snapshot header in v's buffer (copied to the host on `stream`, parsed: tensors and metadata;
  // its viper.checksum is 0, not the version's). Corruption as ParseSnapshotHeader.
  Result<SnapshotHeader> ReadHeader(const GpuVersion& v, const Stream& stream);

 private:
  int device_;
  std::map<IpcHandle, IpcMapping> mappings_;
};

}  // namespace viper::gpu
