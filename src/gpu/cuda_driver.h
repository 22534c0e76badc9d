// The CUDA driver API entry points Viper calls, declared here so that no build needs cuda.h.
//
// The types and values are those of the driver ABI (cuda.h, CUDA 11 to 13; the driver keeps them
// stable). Only the versioned symbols that the current cuda.h maps its names to are resolved
// (cuMemAlloc -> cuMemAlloc_v2, ...). Internal to src/gpu.
#pragma once

#include <cstddef>
#include <string>

#include "viper/status.h"

namespace viper::gpu::cu {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
struct CUipcMemHandle {
  char reserved[64];
};
static_assert(sizeof(CUipcMemHandle) == 64);
struct CUuuid {
  char bytes[16];
};

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 0x01;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x02;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x01;
inline constexpr unsigned CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x01;
inline constexpr int CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;
inline constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
inline constexpr int CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11;
inline constexpr int CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12;
inline constexpr unsigned CU_MEMORYTYPE_DEVICE = 2;
inline constexpr int CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33;

// One function pointer per entry point used; all non-null once Load succeeded.
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);                                   // _v2
  CUresult (*cuMemFree)(CUdeviceptr);                                              // _v2
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);                      // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);       // _v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);       // _v2
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);             // _v2
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);                                           // _v2
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);                                             // _v2
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);                        // _v2 if present
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle*, CUdeviceptr);
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned);          // _v2
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
  CUresult (*cuGetErrorString)(CUresult, const char**);
};

// The loaded driver (dlopen of VIPER_CUDA_LIBRARY or libcuda.so.1, cuInit(0), >= 1 device), or
// Unavailable naming what is missing. Loaded once; the handle is never closed.
Result<const Driver*> Get();
// Loads `path` into a fresh table without caching: for ProbeDriverLibrary. The table is leaked
// on success (the library stays loaded).
Result<const Driver*> LoadFrom(const std::string& path);

// "GPU: <what>: <CUDA_ERROR_...: description> (CUresult n)" as Unavailable (device lost, no
// device), ResourceExhausted (out of memory) or Internal.
Status Error(const Driver& d, CUresult r, const std::string& what);
// Makes `device`'s primary context current on this thread (retained once per device).
Status UseDevice(const Driver& d, int device);

}  // namespace viper::gpu::cu

#define VIPER_CU(d, call, what)                                        \
  do {                                                                 \
    ::viper::gpu::cu::CUresult viper_cu_r_ = (d).call;                 \
    if (viper_cu_r_ != ::viper::gpu::cu::CUDA_SUCCESS)                 \
      return ::viper::gpu::cu::Error((d), viper_cu_r_, (what));        \
  } while (0)
