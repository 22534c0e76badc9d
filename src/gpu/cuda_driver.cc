// dlopen of the CUDA driver library and resolution of the entry points in cuda_driver.h.
#include "gpu/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "viper/gpu.h"

namespace viper::gpu::cu {
namespace {

// The first name found is taken: versioned names first (what cuda.h maps the plain name to).
template <typename Fn>
bool Resolve(void* lib, Fn* slot, std::initializer_list<const char*> names, std::string* missing) {
  for (const char* name : names) {
    if (void* sym = ::dlsym(lib, name)) {
      *slot = reinterpret_cast<Fn>(sym);
      return true;
    }
  }
  if (!missing->empty()) *missing += ", ";
  *missing += *names.begin();
  return false;
}

Result<const Driver*> Load(const std::string& path, bool default_path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return Status::Unavailable("GPU: " + path + " not found" + (default_path ? " (no NVIDIA driver)" : "") +
                               ": " + (why ? why : "dlopen failed"));
  }
  auto* d = new Driver{};
  std::string missing;
  Resolve(lib, &d->cuInit, {"cuInit"}, &missing);
  Resolve(lib, &d->cuDriverGetVersion, {"cuDriverGetVersion"}, &missing);
  Resolve(lib, &d->cuDeviceGetCount, {"cuDeviceGetCount"}, &missing);
  Resolve(lib, &d->cuDeviceGet, {"cuDeviceGet"}, &missing);
  Resolve(lib, &d->cuDeviceGetName, {"cuDeviceGetName"}, &missing);
  Resolve(lib, &d->cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}, &missing);
  Resolve(lib, &d->cuCtxSetCurrent, {"cuCtxSetCurrent"}, &missing);
  Resolve(lib, &d->cuMemAlloc, {"cuMemAlloc_v2"}, &missing);
  Resolve(lib, &d->cuMemFree, {"cuMemFree_v2"}, &missing);
  Resolve(lib, &d->cuMemsetD8, {"cuMemsetD8_v2"}, &missing);
  Resolve(lib, &d->cuMemcpyDtoDAsync, {"cuMemcpyDtoDAsync_v2"}, &missing);
  Resolve(lib, &d->cuMemcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"}, &missing);
  Resolve(lib, &d->cuMemcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"}, &missing);
  Resolve(lib, &d->cuMemHostAlloc, {"cuMemHostAlloc"}, &missing);
  Resolve(lib, &d->cuMemFreeHost, {"cuMemFreeHost"}, &missing);
  Resolve(lib, &d->cuStreamCreate, {"cuStreamCreate"}, &missing);
  Resolve(lib, &d->cuStreamDestroy, {"cuStreamDestroy_v2"}, &missing);
  Resolve(lib, &d->cuStreamWaitEvent, {"cuStreamWaitEvent"}, &missing);
  Resolve(lib, &d->cuStreamSynchronize, {"cuStreamSynchronize"}, &missing);
  Resolve(lib, &d->cuEventCreate, {"cuEventCreate"}, &missing);
  Resolve(lib, &d->cuEventDestroy, {"cuEventDestroy_v2"}, &missing);
  Resolve(lib, &d->cuEventRecord, {"cuEventRecord"}, &missing);
  Resolve(lib, &d->cuEventSynchronize, {"cuEventSynchronize"}, &missing);
  Resolve(lib, &d->cuEventQuery, {"cuEventQuery"}, &missing);
  Resolve(lib, &d->cuEventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"}, &missing);
  Resolve(lib, &d->cuIpcGetMemHandle, {"cuIpcGetMemHandle"}, &missing);
  Resolve(lib, &d->cuIpcOpenMemHandle, {"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}, &missing);
  Resolve(lib, &d->cuIpcCloseMemHandle, {"cuIpcCloseMemHandle"}, &missing);
  Resolve(lib, &d->cuPointerGetAttribute, {"cuPointerGetAttribute"}, &missing);
  Resolve(lib, &d->cuGetErrorString, {"cuGetErrorString"}, &missing);
  if (!missing.empty()) {
    delete d;
    ::dlclose(lib);
    return Status::Unavailable("GPU: " + path + " is not a usable CUDA driver library: missing " + missing);
  }
  CUresult r = d->cuInit(0);
  if (r != CUDA_SUCCESS) {
    Status st = Error(*d, r, "cuInit (driver present, no usable GPU)");
    delete d;
    return Status::Unavailable(st.message());
  }
  int count = 0;
  r = d->cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS || count <= 0) {
    delete d;
    return Status::Unavailable("GPU: the CUDA driver reports no device");
  }
  return static_cast<const Driver*>(d);
}

}  // namespace

Result<const Driver*> LoadFrom(const std::string& path) { return Load(path, false); }

Result<const Driver*> Get() {
  static const Result<const Driver*> driver = [] {
    const char* env = std::getenv("VIPER_CUDA_LIBRARY");
    if (env != nullptr && *env != '\0') return Load(env, false);
    return Load("libcuda.so.1", true);
  }();
  return driver;
}

Status Error(const Driver& d, CUresult r, const std::string& what) {
  const char* text = nullptr;
  if (d.cuGetErrorString == nullptr || d.cuGetErrorString(r, &text) != CUDA_SUCCESS || text == nullptr)
    text = "unknown CUDA error";
  std::string msg = "GPU: " + what + ": " + text + " (CUresult " + std::to_string(r) + ")";
  switch (r) {
    case 2:    // CUDA_ERROR_OUT_OF_MEMORY
      return Status::ResourceExhausted(msg);
    case 100:  // CUDA_ERROR_NO_DEVICE
    case 101:  // CUDA_ERROR_INVALID_DEVICE
    case 3:    // CUDA_ERROR_NOT_INITIALIZED
    case 4:    // CUDA_ERROR_DEINITIALIZED
    case 46:   // CUDA_ERROR_DEVICES_UNAVAILABLE
    case 801:  // CUDA_ERROR_NOT_SUPPORTED
      return Status::Unavailable(msg);
    case 1:    // CUDA_ERROR_INVALID_VALUE
    case 400:  // CUDA_ERROR_INVALID_HANDLE
      return Status::InvalidArgument(msg);
    default:
      return Status::Internal(msg);
  }
}

Status UseDevice(const Driver& d, int device) {
  // Per thread, the device whose primary context this code last made current: most calls find it
  // already current and cost no driver call (a publish makes one call per tensor).
  thread_local int current = -1;
  if (current == device) return Status::OK();
  static std::mutex mu;
  static std::vector<CUcontext> contexts;  // primary context per device, retained once
  CUcontext ctx = nullptr;
  {
    std::lock_guard lock(mu);
    int count = 0;
    VIPER_CU(d, cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (device < 0 || device >= count)
      return Status::InvalidArgument("GPU: device " + std::to_string(device) + " out of range: " +
                                     std::to_string(count) + " device(s)");
    if (contexts.size() < static_cast<size_t>(count)) contexts.resize(count, nullptr);
    if (contexts[device] == nullptr) {
      CUdevice dev = 0;
      VIPER_CU(d, cuDeviceGet(&dev, device), "cuDeviceGet");
      VIPER_CU(d, cuDevicePrimaryCtxRetain(&contexts[device], dev), "cuDevicePrimaryCtxRetain");
    }
    ctx = contexts[device];
  }
  VIPER_CU(d, cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  current = device;
  return Status::OK();
}

}  // namespace viper::gpu::cu

namespace viper::gpu {

Status Available() { return cu::Get().status(); }

int DeviceCount() {
  auto d = cu::Get();
  if (!d.ok()) return 0;
  int count = 0;
  return (*d)->cuDeviceGetCount(&count) == cu::CUDA_SUCCESS ? count : 0;
}

std::string Describe(int device) {
  auto d = cu::Get();
  if (!d.ok()) return d.status().message();
  char name[256] = {};
  cu::CUdevice dev = 0;
  int version = 0;
  if ((*d)->cuDeviceGet(&dev, device) != cu::CUDA_SUCCESS ||
      (*d)->cuDeviceGetName(name, sizeof(name) - 1, dev) != cu::CUDA_SUCCESS)
    return "GPU: device " + std::to_string(device) + " not found";
  (void)(*d)->cuDriverGetVersion(&version);
  return std::string(name) + ", CUDA driver API " + std::to_string(version);
}

namespace internal {
Status ProbeDriverLibrary(const std::string& path) { return cu::LoadFrom(path).status(); }
}  // namespace internal

}  // namespace viper::gpu
