// Device and pinned buffers, streams, events, copies and IPC mappings over the loaded driver.
#include <cstring>
#include <utility>

#include "gpu/cuda_driver.h"
#include "viper/gpu.h"

namespace viper::gpu {
namespace {

// The driver with `device`'s primary context current on this thread.
Result<const cu::Driver*> On(int device) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, cu::Get());
  VIPER_RETURN_IF_ERROR(cu::UseDevice(*d, device));
  return d;
}

// Destructors cannot report: the driver is loaded (the object exists), so only set the context.
const cu::Driver* OnOrNull(int device) {
  auto d = On(device);
  return d.ok() ? *d : nullptr;
}

}  // namespace

// ---- DeviceBuffer ----------------------------------------------------------------------------
Result<DeviceBuffer> DeviceBuffer::Allocate(int device, uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("GPU: DeviceBuffer::Allocate: bytes 0: must be > 0");
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device));
  DeviceBuffer b;
  VIPER_CU(*d, cuMemAlloc(&b.ptr_, bytes), "cuMemAlloc of " + std::to_string(bytes) + " bytes");
  b.size_ = bytes;
  b.device_ = device;
  return b;
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_ == 0) return;
  if (const cu::Driver* d = OnOrNull(device_)) (void)d->cuMemFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, 0)), size_(std::exchange(o.size_, 0)), device_(o.device_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    DeviceBuffer old(std::move(*this));
    ptr_ = std::exchange(o.ptr_, 0);
    size_ = std::exchange(o.size_, 0);
    device_ = o.device_;
  }
  return *this;
}
Result<IpcHandle> DeviceBuffer::ExportIpc() const {
  if (ptr_ == 0) return Status::FailedPrecondition("GPU: ExportIpc of an empty DeviceBuffer");
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device_));
  cu::CUipcMemHandle h{};
  VIPER_CU(*d, cuIpcGetMemHandle(&h, ptr_), "cuIpcGetMemHandle");
  IpcHandle out;
  std::memcpy(out.data(), h.reserved, out.size());
  return out;
}

// ---- PinnedBuffer ----------------------------------------------------------------------------
Result<PinnedBuffer> PinnedBuffer::Allocate(int device, uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("GPU: PinnedBuffer::Allocate: bytes 0: must be > 0");
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device));
  void* p = nullptr;
  VIPER_CU(*d, cuMemHostAlloc(&p, bytes, cu::CU_MEMHOSTALLOC_PORTABLE),
           "cuMemHostAlloc of " + std::to_string(bytes) + " bytes");
  PinnedBuffer b;
  b.data_ = static_cast<std::byte*>(p);
  b.size_ = bytes;
  b.device_ = device;
  return b;
}
PinnedBuffer::~PinnedBuffer() {
  if (data_ == nullptr) return;
  if (const cu::Driver* d = OnOrNull(device_)) (void)d->cuMemFreeHost(data_);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), device_(o.device_) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    PinnedBuffer old(std::move(*this));
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    device_ = o.device_;
  }
  return *this;
}

// ---- Event -----------------------------------------------------------------------------------
Result<Event> Event::Create(int device, bool timing) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device));
  cu::CUevent e = nullptr;
  VIPER_CU(*d, cuEventCreate(&e, timing ? 0u : cu::CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  Event ev;
  ev.event_ = e;
  ev.device_ = device;
  return ev;
}
Event::~Event() {
  if (event_ == nullptr) return;
  if (const cu::Driver* d = OnOrNull(device_)) (void)d->cuEventDestroy(static_cast<cu::CUevent>(event_));
}
Event::Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)), device_(o.device_) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Event old(std::move(*this));
    event_ = std::exchange(o.event_, nullptr);
    device_ = o.device_;
  }
  return *this;
}
Status Event::Record(const Stream& stream) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device_));
  VIPER_CU(*d, cuEventRecord(static_cast<cu::CUevent>(event_), static_cast<cu::CUstream>(stream.raw())),
           "cuEventRecord");
  return Status::OK();
}
Status Event::Synchronize() const {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device_));
  VIPER_CU(*d, cuEventSynchronize(static_cast<cu::CUevent>(event_)), "cuEventSynchronize");
  return Status::OK();
}
Result<bool> Event::Query() const {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device_));
  cu::CUresult r = d->cuEventQuery(static_cast<cu::CUevent>(event_));
  if (r == cu::CUDA_SUCCESS) return true;
  if (r == cu::CUDA_ERROR_NOT_READY) return false;
  return cu::Error(*d, r, "cuEventQuery");
}
Result<float> Event::ElapsedMs(const Event& start, const Event& end) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(start.device_));
  float ms = 0;
  VIPER_CU(*d, cuEventElapsedTime(&ms, static_cast<cu::CUevent>(start.event_), static_cast<cu::CUevent>(end.event_)),
           "cuEventElapsedTime");
  return ms;
}

// ---- Stream ----------------------------------------------------------------------------------
Result<Stream> Stream::Create(int device) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device));
  cu::CUstream s = nullptr;
  VIPER_CU(*d, cuStreamCreate(&s, cu::CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  Stream st;
  st.stream_ = s;
  st.device_ = device;
  st.owned_ = true;
  return st;
}
Stream Stream::Borrow(int device, void* raw_stream) {
  Stream st;
  st.stream_ = raw_stream;
  st.device_ = device;
  st.owned_ = false;
  return st;
}
Stream::~Stream() {
  if (!owned_ || stream_ == nullptr) return;
  if (const cu::Driver* d = OnOrNull(device_)) (void)d->cuStreamDestroy(static_cast<cu::CUstream>(stream_));
}
Stream::Stream(Stream&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)), device_(o.device_), owned_(std::exchange(o.owned_, false)) {}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    Stream old(std::move(*this));
    stream_ = std::exchange(o.stream_, nullptr);
    device_ = o.device_;
    owned_ = std::exchange(o.owned_, false);
  }
  return *this;
}
Status Stream::WaitEvent(const Event& event) const {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device_));
  VIPER_CU(*d, cuStreamWaitEvent(static_cast<cu::CUstream>(stream_), static_cast<cu::CUevent>(event.raw()), 0),
           "cuStreamWaitEvent");
  return Status::OK();
}
Status Stream::Synchronize() const {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device_));
  VIPER_CU(*d, cuStreamSynchronize(static_cast<cu::CUstream>(stream_)), "cuStreamSynchronize");
  return Status::OK();
}

// ---- copies ----------------------------------------------------------------------------------
Status CopyDeviceToDevice(DevicePtr dst, DevicePtr src, uint64_t bytes, const Stream& stream) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(stream.device()));
  VIPER_CU(*d, cuMemcpyDtoDAsync(dst, src, bytes, static_cast<cu::CUstream>(stream.raw())), "cuMemcpyDtoDAsync");
  return Status::OK();
}
Status CopyHostToDevice(DevicePtr dst, const void* src, uint64_t bytes, const Stream& stream) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(stream.device()));
  VIPER_CU(*d, cuMemcpyHtoDAsync(dst, src, bytes, static_cast<cu::CUstream>(stream.raw())), "cuMemcpyHtoDAsync");
  return Status::OK();
}
Status CopyDeviceToHost(void* dst, DevicePtr src, uint64_t bytes, const Stream& stream) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(stream.device()));
  VIPER_CU(*d, cuMemcpyDtoHAsync(dst, src, bytes, static_cast<cu::CUstream>(stream.raw())), "cuMemcpyDtoHAsync");
  return Status::OK();
}
Status Memset(int device, DevicePtr dst, uint8_t value, uint64_t bytes) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device));
  VIPER_CU(*d, cuMemsetD8(dst, value, bytes), "cuMemsetD8");
  VIPER_CU(*d, cuStreamSynchronize(nullptr), "cuStreamSynchronize");  // see the header
  return Status::OK();
}
Result<int> PointerDevice(DevicePtr ptr) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, cu::Get());
  unsigned type = 0;
  if (d->cuPointerGetAttribute(&type, cu::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) != cu::CUDA_SUCCESS ||
      type != cu::CU_MEMORYTYPE_DEVICE)
    return Status::InvalidArgument("GPU: pointer 0x" + std::to_string(ptr) + " is not CUDA device memory");
  int ordinal = 0;
  VIPER_CU(*d, cuPointerGetAttribute(&ordinal, cu::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
           "cuPointerGetAttribute(DEVICE_ORDINAL)");
  return ordinal;
}

Result<DevicePtr> AllocationEnd(DevicePtr ptr) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, cu::Get());
  DevicePtr start = 0;
  size_t size = 0;
  VIPER_CU(*d, cuPointerGetAttribute(&start, cu::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr),
           "cuPointerGetAttribute(RANGE_START_ADDR)");
  VIPER_CU(*d, cuPointerGetAttribute(&size, cu::CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr), "cuPointerGetAttribute(RANGE_SIZE)");
  return start + size;
}

// ---- IpcMapping ------------------------------------------------------------------------------
Result<IpcMapping> IpcMapping::Open(int device, const IpcHandle& handle) {
  VIPER_ASSIGN_OR_RETURN(const cu::Driver* d, On(device));
  cu::CUipcMemHandle h{};
  std::memcpy(h.reserved, handle.data(), handle.size());
  IpcMapping m;
  VIPER_CU(*d, cuIpcOpenMemHandle(&m.ptr_, h, cu::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle");
  m.device_ = device;
  return m;
}
IpcMapping::~IpcMapping() {
  if (ptr_ == 0) return;
  if (const cu::Driver* d = OnOrNull(device_)) (void)d->cuIpcCloseMemHandle(ptr_);
}
IpcMapping::IpcMapping(IpcMapping&& o) noexcept : ptr_(std::exchange(o.ptr_, 0)), device_(o.device_) {}
IpcMapping& IpcMapping::operator=(IpcMapping&& o) noexcept {
  if (this != &o) {
    IpcMapping old(std::move(*this));
    ptr_ = std::exchange(o.ptr_, 0);
    device_ = o.device_;
  }
  return *this;
}

}  // namespace viper::gpu
