// viper_gpu_peer: a same-node GPU consumer in its own process, driven over stdin/stdout by the GPU
// test (tests/gpu) and `viper bench --gpu` (bench/harness/gpu.cc).
//
//   viper_gpu_peer [--device N] [--verify] [--in-place]
// stdin: 'V' + a 128-byte GPU version message (docs/PROTOCOL.md): open its IPC handle (cached),
// copy the data region device-to-device into this process's own buffer, wait for the copy (with
// --in-place: no copy, the consumer reads the producer's buffer where it is); 'Q': exit. Each 'V' is answered by one line on stdout:
//   OK <version> <done_ns> <copy_us> <checksum>   done_ns: CLOCK_MONOTONIC when the copy completed;
//                                                 copy_us: the copy timed with events; checksum:
//                                                 16 hex digits of the copied bytes with --verify
//                                                 (copied back to the host), else "-"
//   ERR <message>
// Starts by printing "READY <device description>" or "UNAVAILABLE <reason>" (then exits 3).
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "viper/gpu.h"
#include "viper/gpu_store.h"
#include "viper/snapshot.h"

using namespace viper;
using namespace viper::gpu;

namespace {

bool ReadFull(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void Reply(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

Status Handle(DeviceVersionReader& reader, const GpuVersion& v, int device, bool verify, bool in_place,
              DeviceBuffer& dst, const Stream& stream, Event& t0, Event& t1) {
  if (in_place) {
    VIPER_ASSIGN_OR_RETURN(DevicePtr src, reader.Map(v));
    int64_t done = NowNs();
    std::string sum = "-";
    if (verify) {
      std::vector<std::byte> host(v.data_bytes);
      VIPER_RETURN_IF_ERROR(CopyDeviceToHost(host.data(), src + v.data_offset, v.data_bytes, stream));
      VIPER_RETURN_IF_ERROR(stream.Synchronize());
      sum = checksum_hex(checksum64(host));
    }
    Reply("OK " + std::to_string(v.version) + " " + std::to_string(done) + " 0 " + sum);
    return Status::OK();
  }
  if (dst.size() < v.data_bytes) {
    dst = DeviceBuffer();
    VIPER_ASSIGN_OR_RETURN(dst, DeviceBuffer::Allocate(device, v.data_bytes));
  }
  VIPER_ASSIGN_OR_RETURN(DevicePtr src, reader.Map(v));
  VIPER_RETURN_IF_ERROR(t0.Record(stream));
  VIPER_RETURN_IF_ERROR(CopyDeviceToDevice(dst.ptr(), src + v.data_offset, v.data_bytes, stream));
  VIPER_RETURN_IF_ERROR(t1.Record(stream));
  VIPER_RETURN_IF_ERROR(t1.Synchronize());
  int64_t done = NowNs();
  VIPER_ASSIGN_OR_RETURN(float ms, Event::ElapsedMs(t0, t1));
  std::string sum = "-";
  if (verify) {
    std::vector<std::byte> host(v.data_bytes);
    VIPER_RETURN_IF_ERROR(CopyDeviceToHost(host.data(), dst.ptr(), v.data_bytes, stream));
    VIPER_RETURN_IF_ERROR(stream.Synchronize());
    sum = checksum_hex(checksum64(host));
  }
  Reply("OK " + std::to_string(v.version) + " " + std::to_string(done) + " " +
        std::to_string(static_cast<int64_t>(ms * 1000.0f)) + " " + sum);
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  bool verify = false, in_place = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--verify") == 0) verify = true;
    else if (std::strcmp(argv[i], "--in-place") == 0) in_place = true;
    else {
      std::fprintf(stderr, "viper_gpu_peer: unknown argument \"%s\": usage: viper_gpu_peer [--device N] [--verify] [--in-place]\n", argv[i]);
      return 2;
    }
  }
  if (Status st = Available(); !st.ok()) {
    Reply("UNAVAILABLE " + st.message());
    return 3;
  }
  auto stream = Stream::Create(device);
  auto t0 = Event::Create(device, true);
  auto t1 = Event::Create(device, true);
  if (!stream.ok() || !t0.ok() || !t1.ok()) {
    Reply("UNAVAILABLE " + (!stream.ok() ? stream.status() : !t0.ok() ? t0.status() : t1.status()).message());
    return 3;
  }
  Reply("READY " + Describe(device));
  DeviceVersionReader reader(device);
  DeviceBuffer dst;
  for (;;) {
    char cmd = 0;
    if (!ReadFull(0, &cmd, 1) || cmd == 'Q') return 0;
    if (cmd != 'V') {
      Reply("ERR unknown command byte " + std::to_string(static_cast<int>(cmd)));
      return 1;
    }
    std::byte msg[kGpuVersionMessageBytes];
    if (!ReadFull(0, msg, sizeof msg)) return 1;
    Result<GpuVersion> v = ParseGpuVersion(msg);
    Status st = v.ok() ? Handle(reader, *v, device, verify, in_place, dst, *stream, *t0, *t1) : v.status();
    if (!st.ok()) Reply("ERR " + st.ToString());
  }
}
