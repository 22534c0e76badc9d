// GPU memory through the CUDA driver API, loaded at run time.
//
// No build needs a CUDA toolkit: libcuda.so.1 (the NVIDIA driver's library) is opened with dlopen
// the first time anything here is used, and the few entry points and types Viper calls are
// declared in src/gpu/cuda_driver.h. On a machine without the driver or without a GPU every call
// returns Unavailable naming what is missing, e.g. "GPU: libcuda.so.1 not found (no NVIDIA
// driver): ...". VIPER_CUDA_LIBRARY names another library path (tests point it at nothing).
//
// Thread-safety: Driver() is safe from any thread. Each object here is used by one thread at a
// time unless said otherwise; every call makes the device's primary context current on the
// calling thread first, so callers never manage contexts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "viper/status.h"

namespace viper::gpu {

using DevicePtr = unsigned long long;  // CUdeviceptr

// OK when libcuda.so.1 loads, cuInit succeeds and at least one device exists; else Unavailable
// with the reason. Cached after the first call (the environment is read once).
Status Available();
// Devices the driver reports; 0 when unavailable.
int DeviceCount();
// "NVIDIA H100 80GB HBM3, driver 13000" or the Unavailable message.
std::string Describe(int device = 0);

// Bytes of a CUDA IPC memory handle (CUipcMemHandle): opaque, fixed by the driver ABI.
inline constexpr size_t kIpcHandleBytes = 64;
using IpcHandle = std::array<std::byte, kIpcHandleBytes>;

class Stream;

// Device memory from cuMemAlloc on `device`, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> Allocate(int device, uint64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  DevicePtr ptr() const { return ptr_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  // The handle another process opens with IpcMapping::Open (same node, same device).
  Result<IpcHandle> ExportIpc() const;

 private:
  DevicePtr ptr_ = 0;
  uint64_t size_ = 0;
  int device_ = 0;
};

// Page-locked host memory (cuMemHostAlloc, portable), so that copies to and from the device run
// asynchronously at the link's rate. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> Allocate(int device, uint64_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  int device_ = 0;
};

// A CUDA event. timing=false events are cheaper (no timestamp). Move-only.
class Event {
 public:
  Event() = default;
  static Result<Event> Create(int device, bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  Status Record(const Stream& stream);
  Status Synchronize() const;
  // True when all work recorded before it has completed; false while pending.
  Result<bool> Query() const;
  // Milliseconds between two completed timing events.
  static Result<float> ElapsedMs(const Event& start, const Event& end);
  void* raw() const { return event_; }

 private:
  void* event_ = nullptr;
  int device_ = 0;
};

// A CUDA stream (non-blocking with respect to the legacy default stream), or a borrowed one.
class Stream {
 public:
  Stream() = default;
  static Result<Stream> Create(int device);
  // Wraps a stream someone else owns (e.g. torch.cuda.current_stream().cuda_stream); not destroyed.
  static Stream Borrow(int device, void* raw_stream);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;

  // Work queued on this stream after the call waits for `event` (on the device, not the host).
  // Work queued on this stream after the call runs after `event` (the device orders it; the host
  // does not wait). Const: it queues work, the Stream object is unchanged.
  Status WaitEvent(const Event& event) const;
  Status Synchronize() const;
  void* raw() const { return stream_; }
  int device() const { return device_; }

 private:
  void* stream_ = nullptr;
  int device_ = 0;
  bool owned_ = false;
};

// Asynchronous copies on `stream`; the pinned side must be a PinnedBuffer's memory for the copy to
// overlap with the caller.
Status CopyDeviceToDevice(DevicePtr dst, DevicePtr src, uint64_t bytes, const Stream& stream);
Status CopyHostToDevice(DevicePtr dst, const void* src, uint64_t bytes, const Stream& stream);
Status CopyDeviceToHost(void* dst, DevicePtr src, uint64_t bytes, const Stream& stream);
// Byte fill that returns once the bytes are set (for tests and for zeroing a new buffer's
// padding): cuMemsetD8 runs on the legacy default stream and may return before it completes,
// and copies on a non-blocking stream are not ordered after it, so Memset waits for that stream.
Status Memset(int device, DevicePtr dst, uint8_t value, uint64_t bytes);
// The device ordinal of a device pointer; InvalidArgument if it is not device memory.
Result<int> PointerDevice(DevicePtr ptr);
// The end (one past the last byte) of the allocation that holds device pointer `ptr`: one copy
// must not span two allocations, even when they happen to be adjacent in the address space.
Result<DevicePtr> AllocationEnd(DevicePtr ptr);

// Another process's device memory opened from its IPC handle; closed on destruction. Move-only.
class IpcMapping {
 public:
  IpcMapping() = default;
  static Result<IpcMapping> Open(int device, const IpcHandle& handle);
  ~IpcMapping();
  IpcMapping(IpcMapping&& other) noexcept;
  IpcMapping& operator=(IpcMapping&& other) noexcept;
  DevicePtr ptr() const { return ptr_; }

 private:
  DevicePtr ptr_ = 0;
  int device_ = 0;
};

namespace internal {
// Loads a driver library from `path` without caching (tests of the no-driver path): OK or the
// Unavailable status Available() would give for it.
Status ProbeDriverLibrary(const std::string& path);
}  // namespace internal

}  // namespace viper::gpu
