// libviper_cuda_emulator.so: the CUDA driver entry points Viper loads (src/gpu/cuda_driver.h),
// implemented on host memory, so that the logic of Viper's GPU code (layouts, chunks, events,
// leases, the messages between processes, the host and network paths) runs on machines without a
// GPU: VIPER_CUDA_LIBRARY=<this library> gpu_test. It is not a GPU and proves nothing about one:
// no kernels, no PCIe, no driver of NVIDIA's; Viper's GPU code is tested only on a GPU
// (scripts/gpu-check.sh). What it keeps of the driver's contract, because Viper's code relies on it:
//
// - Streams run their work in order on a thread each, asynchronously to the caller; events mark a
//   point in a stream (cuEventRecord) that cuEventSynchronize / cuEventQuery / cuStreamWaitEvent
//   wait for; the legacy default stream (null) runs work at once on the caller's thread.
// - Copies with page-locked memory (cuMemHostAlloc) are asynchronous; a copy from pageable memory
//   waits for the stream and reads the source before it returns, and one into pageable memory
//   waits for the stream and completes before it returns, as the driver documents.
// - Device memory is a shared memory file (memfd) mapped here; its IPC handle names this process
//   and the file, and cuIpcOpenMemHandle in another process of the same user maps the same pages
//   through /proc/<pid>/fd. cuPointerGetAttribute knows every allocation and mapping.
// - cuMemFree and cuMemFreeHost first wait for the work queued on every stream, as the driver's
//   free synchronizes the device: memory never goes from under a copy still in flight.
// - One device. VIPER_CUDA_EMULATOR_COPY_GBPS (default: none) slows every stream copy to that
//   rate, to widen the windows in which work that is not ordered by events would race.
// - Asynchronous errors are sticky. viper_cuda_emulator_fail_next_copy(code) (a test's hook, found
//   with dlsym) makes the next copy a stream runs fail: from then on every stream and event
//   synchronization returns `code`, as the driver's calls do after a copy or kernel faulted on the
//   device (an illegal address, an Xid). Code 0 disarms it and ends the error.
// - viper_cuda_emulator_on_host_alloc(fn) (a test's hook) calls fn(bytes) on the thread of every
//   cuMemHostAlloc, so that a test can see which thread pins host memory (null: none).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
constexpr CUresult kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kInvalidDevice = 101, kInvalidHandle = 400,
                   kNotReady = 600, kNotSupported = 801;
constexpr CUresult kIllegalAddress = 700;
constexpr uint32_t kHandleMagic = 0x4d454356;  // "VCEM"

std::atomic<CUresult> fail_next_copy{kSuccess};  // armed by the tests' hook
std::atomic<CUresult> sticky_error{kSuccess};
std::atomic<void (*)(size_t)> on_host_alloc{nullptr};  // set by the tests' hook

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A handle is a heap Handle holding the event: work queued on a stream holds the event too, so an
// event destroyed while a stream still waits for it stays alive until that wait is over (the
// driver's rule: cuEventDestroy returns at once, the resources go when the device is done).
struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // generations recorded
  uint64_t completed = 0;  // the latest generation its stream reached
  int64_t when_ns = 0;
  void Complete(uint64_t generation) {
    std::lock_guard lock(mu);
    if (generation > completed) completed = generation, when_ns = NowNs();
    cv.notify_all();
  }
  void WaitFor(uint64_t generation) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return completed >= generation; });
  }
};

struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> work;
  uint64_t queued = 0, done = 0;
  bool stop = false;
  std::thread worker;

  Stream() : worker([this] { Run(); }) {}
  ~Stream() {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();  // finishes what was queued first
  }
  void Queue(std::function<void()> fn) {
    {
      std::lock_guard lock(mu);
      work.push_back(std::move(fn));
      ++queued;
    }
    cv.notify_all();
  }
  void Synchronize() {
    std::unique_lock lock(mu);
    const uint64_t target = queued;
    cv.wait(lock, [&] { return done >= target; });
  }
  void Run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || !work.empty(); });
        if (work.empty()) return;
        fn = std::move(work.front());
        work.pop_front();
      }
      fn();
      {
        std::lock_guard lock(mu);
        ++done;
      }
      cv.notify_all();
    }
  }
};

struct Range {
  uint64_t size = 0;
  int fd = -1;         // device allocations of this process: the memfd behind it
  bool opened = false;  // a mapping of another process's allocation (cuIpcOpenMemHandle)
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, Range> device;      // base -> allocation or IPC mapping
  std::map<uintptr_t, uint64_t> pinned;   // base -> size (cuMemHostAlloc)
  double copy_gbps = 0;
  State() {
    if (const char* e = std::getenv("VIPER_CUDA_EMULATOR_COPY_GBPS")) copy_gbps = std::atof(e);
  }
  // The device range holding [p, p + n), or null.
  const std::pair<const uintptr_t, Range>* FindDevice(uintptr_t p, uint64_t n = 1) {
    std::lock_guard lock(mu);
    auto it = device.upper_bound(p);
    if (it == device.begin()) return nullptr;
    --it;
    if (p + n > it->first + it->second.size) return nullptr;
    return &*it;
  }
  bool IsPinned(const void* ptr, uint64_t n) {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard lock(mu);
    auto it = pinned.upper_bound(p);
    if (it == pinned.begin()) return false;
    --it;
    return p + n <= it->first + it->second;
  }
};

State& S() {
  static State* s = new State();  // never destroyed: streams may outlive static destruction order
  return *s;
}

void Copy(void* dst, const void* src, size_t n) {
  std::memmove(dst, src, n);
  if (double gbps = S().copy_gbps; gbps > 0)
    std::this_thread::sleep_for(std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(n) / gbps)));
}

// A copy on `stream`: queued when both host sides are page-locked or device memory, else done as
// the driver does for pageable memory (after the stream's queued work, before returning).
CUresult StreamCopy(void* dst, const void* src, size_t n, void* stream, bool host_pageable) {
  auto* s = static_cast<Stream*>(stream);
  if (s == nullptr) {
    Copy(dst, src, n);
    return kSuccess;
  }
  if (host_pageable) {
    s->Synchronize();
    Copy(dst, src, n);
    return kSuccess;
  }
  s->Queue([dst, src, n] {
    if (CUresult fault = fail_next_copy.exchange(kSuccess); fault != kSuccess) {
      sticky_error.store(fault);  // the copy faulted on the device: nothing lands
      return;
    }
    Copy(dst, src, n);
  });
  return kSuccess;
}

// Every stream alive (cuStreamCreate .. cuStreamDestroy), for the frees' device-wide wait.
std::mutex streams_mu;
std::set<Stream*> streams;

void SynchronizeDevice() {
  std::lock_guard lock(streams_mu);  // a stream is not destroyed while it is waited for
  for (Stream* s : streams) s->Synchronize();
}

struct IpcHandle {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t pad;
  uint64_t size;
  char reserved[40];
};
static_assert(sizeof(IpcHandle) == 64);

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult cuInit(unsigned) { return kSuccess; }
__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int* v) {
  *v = 12000;
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuDeviceGet(int* dev, int ordinal) {
  if (ordinal != 0) return kInvalidDevice;
  *dev = 0;
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuDeviceGetName(char* name, int len, int dev) {
  if (dev != 0) return kInvalidDevice;
  std::snprintf(name, static_cast<size_t>(len), "%s", "Viper CUDA emulator (host memory, not a GPU)");
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  static int context;
  if (dev != 0) return kInvalidDevice;
  *ctx = &context;
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuCtxSetCurrent(void*) { return kSuccess; }

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t n) {
  if (n == 0) return kInvalidValue;
  int fd = ::memfd_create("viper-cuda-emulator", MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  if (::ftruncate(fd, static_cast<off_t>(n)) != 0) {
    ::close(fd);
    return kOutOfMemory;
  }
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return kOutOfMemory;
  }
  std::lock_guard lock(S().mu);
  S().device[reinterpret_cast<uintptr_t>(p)] = Range{n, fd, false};
  *out = reinterpret_cast<uintptr_t>(p);
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuMemFree_v2(CUdeviceptr p) {
  SynchronizeDevice();
  std::lock_guard lock(S().mu);
  auto it = S().device.find(static_cast<uintptr_t>(p));
  if (it == S().device.end() || it->second.opened) return kInvalidValue;
  ::munmap(reinterpret_cast<void*>(it->first), it->second.size);
  ::close(it->second.fd);
  S().device.erase(it);
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
  if (!S().FindDevice(p, n)) return kInvalidValue;
  std::memset(reinterpret_cast<void*>(p), v, n);
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* s) {
  if (!S().FindDevice(dst, n) || !S().FindDevice(src, n)) return kInvalidValue;
  return StreamCopy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, s, false);
}
__attribute__((visibility("default"))) CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* s) {
  if (!S().FindDevice(dst, n)) return kInvalidValue;
  return StreamCopy(reinterpret_cast<void*>(dst), src, n, s, !S().IsPinned(src, n));
}
__attribute__((visibility("default"))) CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* s) {
  if (!S().FindDevice(src, n)) return kInvalidValue;
  return StreamCopy(dst, reinterpret_cast<const void*>(src), n, s, !S().IsPinned(dst, n));
}
__attribute__((visibility("default"))) CUresult cuMemHostAlloc(void** out, size_t n, unsigned) {
  if (auto observe = on_host_alloc.load()) observe(n);
  void* p = ::mmap(nullptr, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return kOutOfMemory;
  std::lock_guard lock(S().mu);
  S().pinned[reinterpret_cast<uintptr_t>(p)] = n ? n : 1;
  *out = p;
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuMemFreeHost(void* p) {
  SynchronizeDevice();
  std::lock_guard lock(S().mu);
  auto it = S().pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == S().pinned.end()) return kInvalidValue;
  ::munmap(p, it->second);
  S().pinned.erase(it);
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuStreamCreate(void** out, unsigned) {
  auto* stream = new Stream();
  {
    std::lock_guard lock(streams_mu);
    streams.insert(stream);
  }
  *out = stream;
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuStreamDestroy_v2(void* s) {
  {
    std::lock_guard lock(streams_mu);
    streams.erase(static_cast<Stream*>(s));
  }
  delete static_cast<Stream*>(s);
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuStreamSynchronize(void* s) {
  if (s != nullptr) static_cast<Stream*>(s)->Synchronize();
  return sticky_error.load();
}
__attribute__((visibility("default"))) CUresult cuEventCreate(void** out, unsigned) {
  *out = new std::shared_ptr<Event>(std::make_shared<Event>());
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuEventDestroy_v2(void* e) {
  delete static_cast<std::shared_ptr<Event>*>(e);
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuEventRecord(void* ev, void* stream) {
  std::shared_ptr<Event> e = *static_cast<std::shared_ptr<Event>*>(ev);
  uint64_t generation = 0;
  {
    std::lock_guard lock(e->mu);
    generation = ++e->recorded;
  }
  if (stream == nullptr) e->Complete(generation);
  else static_cast<Stream*>(stream)->Queue([e, generation] { e->Complete(generation); });
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuStreamWaitEvent(void* stream, void* ev, unsigned) {
  std::shared_ptr<Event> e = *static_cast<std::shared_ptr<Event>*>(ev);
  uint64_t generation = 0;
  {
    std::lock_guard lock(e->mu);
    generation = e->recorded;
  }
  if (stream == nullptr) e->WaitFor(generation);
  else static_cast<Stream*>(stream)->Queue([e, generation] { e->WaitFor(generation); });
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuEventSynchronize(void* ev) {
  Event* e = static_cast<std::shared_ptr<Event>*>(ev)->get();
  uint64_t generation = 0;
  {
    std::lock_guard lock(e->mu);
    generation = e->recorded;
  }
  e->WaitFor(generation);
  return sticky_error.load();
}
__attribute__((visibility("default"))) CUresult cuEventQuery(void* ev) {
  if (CUresult sticky = sticky_error.load(); sticky != kSuccess) return sticky;
  Event* e = static_cast<std::shared_ptr<Event>*>(ev)->get();
  std::lock_guard lock(e->mu);
  return e->completed >= e->recorded ? kSuccess : kNotReady;
}
__attribute__((visibility("default"))) CUresult cuEventElapsedTime(float* ms, void* a, void* b) {
  Event* start = static_cast<std::shared_ptr<Event>*>(a)->get();
  Event* end = static_cast<std::shared_ptr<Event>*>(b)->get();
  if (cuEventQuery(a) != kSuccess || cuEventQuery(b) != kSuccess) return kNotReady;
  std::scoped_lock lock(start->mu, end->mu);
  *ms = static_cast<float>(static_cast<double>(end->when_ns - start->when_ns) / 1e6);
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuIpcGetMemHandle(void* out, CUdeviceptr p) {
  std::lock_guard lock(S().mu);
  auto it = S().device.find(static_cast<uintptr_t>(p));
  if (it == S().device.end() || it->second.opened) return kInvalidValue;
  IpcHandle h{};
  h.magic = kHandleMagic;
  h.pid = static_cast<int32_t>(::getpid());
  h.fd = it->second.fd;
  h.size = it->second.size;
  std::memcpy(out, &h, sizeof h);
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* out, IpcHandle h, unsigned) {
  if (h.magic != kHandleMagic || h.size == 0) return kInvalidHandle;
  std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return kInvalidHandle;
  void* p = ::mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return kOutOfMemory;
  std::lock_guard lock(S().mu);
  S().device[reinterpret_cast<uintptr_t>(p)] = Range{h.size, -1, true};
  *out = reinterpret_cast<uintptr_t>(p);
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  std::lock_guard lock(S().mu);
  auto it = S().device.find(static_cast<uintptr_t>(p));
  if (it == S().device.end() || !it->second.opened) return kInvalidValue;
  ::munmap(reinterpret_cast<void*>(it->first), it->second.size);
  S().device.erase(it);
  return kSuccess;
}
__attribute__((visibility("default"))) CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr p) {
  const auto* r = S().FindDevice(static_cast<uintptr_t>(p));
  if (r == nullptr) return kInvalidValue;
  switch (attribute) {
    case 2:  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
      *static_cast<unsigned*>(data) = 2;  // CU_MEMORYTYPE_DEVICE
      return kSuccess;
    case 9:  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
      *static_cast<int*>(data) = 0;
      return kSuccess;
    case 11:  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
      *static_cast<CUdeviceptr*>(data) = r->first;
      return kSuccess;
    case 12:  // CU_POINTER_ATTRIBUTE_RANGE_SIZE
      *static_cast<size_t*>(data) = r->second.size;
      return kSuccess;
    default:
      return kNotSupported;
  }
}
__attribute__((visibility("default"))) CUresult cuGetErrorString(CUresult r, const char** text) {
  switch (r) {
    case kSuccess: *text = "no error"; break;
    case kInvalidValue: *text = "invalid argument (emulator)"; break;
    case kOutOfMemory: *text = "out of memory (emulator)"; break;
    case kInvalidDevice: *text = "invalid device ordinal (emulator)"; break;
    case kInvalidHandle: *text = "invalid resource handle (emulator)"; break;
    case kNotReady: *text = "device not ready (emulator)"; break;
    case kNotSupported: *text = "operation not supported (emulator)"; break;
    case kIllegalAddress: *text = "an illegal memory access was encountered (emulator)"; break;
    default: *text = "unknown error (emulator)"; return kInvalidValue;
  }
  return kSuccess;
}

// Not the driver's: the tests' hook for an asynchronous error (see the top of this file).
__attribute__((visibility("default"))) void viper_cuda_emulator_fail_next_copy(CUresult code) {
  fail_next_copy.store(code);
  if (code == kSuccess) sticky_error.store(kSuccess);
}

__attribute__((visibility("default"))) void viper_cuda_emulator_on_host_alloc(void (*fn)(size_t)) {
  on_host_alloc.store(fn);
}

}  // extern "C"
