// The GPU layer on a machine without a usable CUDA driver: every call is a clear Unavailable, and
// the GPU version message parser rejects malformed bytes with a named reason.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "viper/gpu.h"
#include "viper/gpu_store.h"

namespace viper::gpu {
namespace {

TEST(GpuDriver, MissingLibraryIsUnavailableAndNamed) {
  // CTest sets VIPER_CUDA_LIBRARY=/nonexistent/libcuda.so.1 (tests/gpu/CMakeLists.txt).
  const char* env = std::getenv("VIPER_CUDA_LIBRARY");
  ASSERT_NE(env, nullptr) << "run through ctest, or set VIPER_CUDA_LIBRARY=/nonexistent/libcuda.so.1";
  Status st = Available();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("GPU: /nonexistent/libcuda.so.1 not found"), std::string::npos) << st.message();
  EXPECT_EQ(DeviceCount(), 0);
  EXPECT_EQ(Describe(0), st.message());
}

TEST(GpuDriver, EveryEntryPointReturnsUnavailable) {
  auto buf = DeviceBuffer::Allocate(0, 1024);
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(buf.status().message().find("not found"), std::string::npos);
  EXPECT_EQ(PinnedBuffer::Allocate(0, 1024).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Stream::Create(0).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Event::Create(0).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(IpcMapping::Open(0, IpcHandle{}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(PointerDevice(0x1000).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Memset(0, 0x1000, 0, 16).code(), StatusCode::kUnavailable);
  auto store = DeviceVersionStore::Create({});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable);
}

TEST(GpuDriver, DefaultNameSaysNoDriver) {
  // The message a user without the NVIDIA driver sees, from the same loader with the default name.
  Status st = internal::ProbeDriverLibrary("/nonexistent-dir/libcuda.so.1");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("not found"), std::string::npos) << st.message();
}

TEST(GpuDriver, LibraryWithoutTheEntryPointsIsUnavailable) {
  // libm loads but is no CUDA driver: the message lists what it lacks.
  Status st = internal::ProbeDriverLibrary("libm.so.6");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("is not a usable CUDA driver library: missing cuInit"), std::string::npos)
      << st.message();
}

TEST(GpuDriver, StoreRejectsTooFewBuffersBeforeTouchingTheDriver) {
  DeviceVersionStore::Options o;
  o.max_buffers = 1;
  auto store = DeviceVersionStore::Create(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("max_buffers 1"), std::string::npos);
}

GpuVersion Sample() {
  GpuVersion v;
  v.version = 7;
  v.total_bytes = 4096;
  v.data_offset = 256;
  v.data_bytes = 3840;
  v.checksum = 0x0123456789abcdefull;
  v.device = 1;
  v.buffer = 2;
  v.producer_pid = 4242;
  for (size_t i = 0; i < v.handle.size(); ++i) v.handle[i] = std::byte(i * 3 + 1);
  return v;
}

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(GpuVersionMessage, RoundTrips) {
  GpuVersion v = Sample();
  std::string m = EncodeGpuVersion(v);
  ASSERT_EQ(m.size(), kGpuVersionMessageBytes);
  auto p = ParseGpuVersion(Bytes(m));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->version, 7u);
  EXPECT_EQ(p->total_bytes, 4096u);
  EXPECT_EQ(p->data_offset, 256u);
  EXPECT_EQ(p->data_bytes, 3840u);
  EXPECT_EQ(p->checksum, v.checksum);
  EXPECT_EQ(p->device, 1);
  EXPECT_EQ(p->buffer, 2u);
  EXPECT_EQ(p->producer_pid, 4242u);
  EXPECT_EQ(p->handle, v.handle);
}

TEST(GpuVersionMessage, MalformedIsCorruptionNamingTheField) {
  std::string m = EncodeGpuVersion(Sample());
  auto expect = [](const std::string& bytes, const char* what) {
    auto p = ParseGpuVersion(Bytes(bytes));
    ASSERT_FALSE(p.ok()) << what;
    EXPECT_EQ(p.status().code(), StatusCode::kCorruption);
    EXPECT_NE(p.status().message().find(what), std::string::npos) << p.status().message();
  };
  expect(m.substr(0, 127), "size 127: must be 128 bytes");
  std::string bad = m;
  bad[0] = 'X';
  expect(bad, "magic");
  bad = m;
  bad[4] = 2;
  expect(bad, "format 2");
  bad = m;
  bad[60] = 1;
  expect(bad, "reserved bytes");
  GpuVersion v = Sample();
  v.device = -1;
  expect(EncodeGpuVersion(v), "device -1");
  v = Sample();
  v.data_bytes = 3841;
  expect(EncodeGpuVersion(v), "outside total_bytes 4096");
  v = Sample();
  v.data_offset = ~0ull;
  expect(EncodeGpuVersion(v), "outside total_bytes");
}

}  // namespace
}  // namespace viper::gpu
