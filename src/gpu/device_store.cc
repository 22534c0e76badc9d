// DeviceVersionStore, DeviceVersionReader and the GPU version message (include/viper/gpu_store.h).
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "viper/gpu_store.h"

namespace viper::gpu {

// ---- message ---------------------------------------------------------------------------------
namespace {
constexpr char kMagic[4] = {'V', 'G', 'P', 'U'};
constexpr uint32_t kFormat = 1;

template <typename T>
void Put(std::string* out, size_t at, T v) {
  std::memcpy(out->data() + at, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
}
template <typename T>
T Get(std::span<const std::byte> in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}
}  // namespace

// Layout (little-endian): 0 magic "VGPU", 4 u32 format, 8 u64 version, 16 u64 total_bytes,
// 24 u64 data_offset, 32 u64 data_bytes, 40 u64 checksum, 48 i32 device, 52 u32 buffer,
// 56 u32 producer_pid, 60 u32 zero, 64 the 64-byte CUipcMemHandle.
std::string EncodeGpuVersion(const GpuVersion& v) {
  std::string out(kGpuVersionMessageBytes, '\0');
  std::memcpy(out.data(), kMagic, 4);
  Put<uint32_t>(&out, 4, kFormat);
  Put<uint64_t>(&out, 8, v.version);
  Put<uint64_t>(&out, 16, v.total_bytes);
  Put<uint64_t>(&out, 24, v.data_offset);
  Put<uint64_t>(&out, 32, v.data_bytes);
  Put<uint64_t>(&out, 40, v.checksum);
  Put<int32_t>(&out, 48, v.device);
  Put<uint32_t>(&out, 52, v.buffer);
  Put<uint32_t>(&out, 56, v.producer_pid);
  std::memcpy(out.data() + 64, v.handle.data(), kIpcHandleBytes);
  return out;
}

Result<GpuVersion> ParseGpuVersion(std::span<const std::byte> in) {
  if (in.size() != kGpuVersionMessageBytes)
    return Status::Corruption("GPU version message: size " + std::to_string(in.size()) + ": must be " +
                              std::to_string(kGpuVersionMessageBytes) + " bytes");
  if (std::memcmp(in.data(), kMagic, 4) != 0) return Status::Corruption("GPU version message: magic is not \"VGPU\"");
  if (uint32_t f = Get<uint32_t>(in, 4); f != kFormat)
    return Status::Corruption("GPU version message: format " + std::to_string(f) + ": only 1 is known");
  GpuVersion v;
  v.version = Get<uint64_t>(in, 8);
  v.total_bytes = Get<uint64_t>(in, 16);
  v.data_offset = Get<uint64_t>(in, 24);
  v.data_bytes = Get<uint64_t>(in, 32);
  v.checksum = Get<uint64_t>(in, 40);
  v.device = Get<int32_t>(in, 48);
  v.buffer = Get<uint32_t>(in, 52);
  v.producer_pid = Get<uint32_t>(in, 56);
  if (Get<uint32_t>(in, 60) != 0) return Status::Corruption("GPU version message: reserved bytes 60..63 not zero");
  std::memcpy(v.handle.data(), in.data() + 64, kIpcHandleBytes);
  if (v.device < 0) return Status::Corruption("GPU version message: device " + std::to_string(v.device) + ": must be >= 0");
  if (v.data_offset > v.total_bytes || v.data_bytes > v.total_bytes - v.data_offset)
    return Status::Corruption("GPU version message: data region [" + std::to_string(v.data_offset) + ", +" +
                              std::to_string(v.data_bytes) + ") outside total_bytes " + std::to_string(v.total_bytes));
  return v;
}

// ---- store -----------------------------------------------------------------------------------

// The device-to-host copy of a version's data region goes in chunks of at least 8 MiB (a few µs of
// queueing each against about 0.3 ms of copy at a PCIe 5 link's rate), at most 512 per version.
namespace {
uint64_t HostChunkBytes(uint64_t data_bytes) {
  constexpr uint64_t kMin = 8ull << 20, kMaxChunks = 512, kGrain = 64 << 10;
  uint64_t chunk = std::max(kMin, (data_bytes + kMaxChunks - 1) / kMaxChunks);
  return (chunk + kGrain - 1) / kGrain * kGrain;
}
size_t HostChunks(uint64_t data_bytes) {  // one, of no bytes, for an empty data region
  return static_cast<size_t>(std::max<uint64_t>(1, (data_bytes + HostChunkBytes(data_bytes) - 1) / HostChunkBytes(data_bytes)));
}
}  // namespace

struct DeviceVersionStore::Impl {
  struct Buffer {
    DeviceBuffer device;
    PinnedBuffer pinned;
    PinnedBuffer header;  // the snapshot header staged for its copy into the device buffer
    Event ready;      // recorded on the producer's stream
    Event copied;     // recorded on the copy stream after the tensors
    std::vector<Event> host_chunks;  // recorded on the host stream after each chunk of the device-to-host copy
    IpcHandle handle{};
    uint64_t version = 0;
    int leases = 0;
    bool busy = false;  // queued: copy or seal still to finish
    std::shared_ptr<const SnapshotLayout> layout;  // of the last version copied into it
  };
  struct Job {
    size_t buffer;
    VersionStamp stamp;
    std::shared_ptr<const SnapshotLayout> layout;
  };

  Options options;
  LiveFn on_live;
  SealedFn on_sealed;
  HostProgressFn on_progress;
  Stream copy_stream;
  Stream host_stream;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::deque<Job> jobs;       // queued by Publish, for the announcer
  std::deque<Job> seal_jobs;  // announced (device copy complete), for the sealer
  std::optional<size_t> live;  // buffer index of the live version
  uint64_t last_published = 0;
  uint64_t last_live = 0;
  uint64_t last_sealed = 0;
  Status failed;  // first error of the threads: every later Wait returns it
  bool stop = false;
  bool announcer_done = false;  // the sealer stops once this is set and its queue is empty
  std::shared_ptr<const SnapshotLayout> layout;  // of the last publish, reused when specs match
  std::vector<TensorSpec> layout_specs;
  std::thread announcer;  // a version live as soon as its device copy completes
  std::thread sealer;     // then its pinned copy sealed and handed to SealedFn, in order

  // REQUIRES: b is buffers[i], busy (so neither replaced nor rewritten by Publish).
  GpuVersion Describe(size_t i, const Buffer& b, const SnapshotLayout& l, uint64_t checksum) const {
    GpuVersion v;
    v.version = b.version;
    v.total_bytes = l.total_bytes();
    v.data_offset = l.data_offset();
    v.data_bytes = l.data_bytes();
    v.checksum = checksum;
    v.device = options.device;
    v.buffer = static_cast<uint32_t>(i);
    v.producer_pid = static_cast<uint32_t>(::getpid());
    v.handle = b.handle;
    return v;
  }
  std::optional<GpuVersion> live_desc;  // what Acquire hands out

  void MakeLive(size_t i, const GpuVersion& v) {
    {
      std::lock_guard lock(mu);
      live = i;
      live_desc = v;
      last_live = v.version;
    }
    cv.notify_all();
    if (on_live) on_live(v);
  }

  // Announcer thread: takes the versions in order, waits for each one's device copy and makes it
  // live (kAfterDeviceCopy), then hands it to the sealer: a version is announced when its copy
  // completes, whatever the host path of earlier versions still has to do.
  void RunAnnouncer() {
    for (;;) {
      Job job;
      Buffer* bp = nullptr;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || !jobs.empty(); });
        if (jobs.empty()) {
          announcer_done = true;
          cv.notify_all();
          return;
        }
        job = std::move(jobs.front());
        jobs.pop_front();
        bp = buffers[job.buffer].get();  // the vector may grow meanwhile; the buffer stays (busy)
      }
      Buffer& b = *bp;
      Status st = b.copied.Synchronize();
      if (st.ok() && options.announce == Announce::kAfterDeviceCopy) MakeLive(job.buffer, Describe(job.buffer, b, *job.layout, 0));
      if (st.ok() && options.host_copy) st = QueueHostCopy(job, b);
      if (st.ok() && options.host_copy) {
        std::lock_guard lock(mu);
        seal_jobs.push_back(std::move(job));
        cv.notify_all();
        continue;
      }
      if (st.ok() && options.announce == Announce::kAfterChecksum) MakeLive(job.buffer, Describe(job.buffer, b, *job.layout, 0));
      Finish(job, st);
    }
  }

  // Announcer thread (host_copy), once the job's device copy is complete: its device-to-host copy
  // queued on the host stream in chunks, each with its event, so that the sealer (and through
  // on_progress the host tier and remote readers) takes each chunk as it lands. A buffer's pinned
  // memory is allocated here at its first use, not in Publish: pinning host memory takes the order
  // of a second per GiB in a virtual machine (seen on an H100 host), which the producer's thread
  // must not wait for. Then the next version's announcement waits for it instead, once per buffer.
  Status QueueHostCopy(const Job& job, Buffer& b) {
    const SnapshotLayout& l = *job.layout;
    if (b.pinned.size() != b.device.size()) {
      b.pinned = {};
      VIPER_ASSIGN_OR_RETURN(b.pinned, PinnedBuffer::Allocate(options.device, b.device.size()));
    }
    const uint64_t chunk = HostChunkBytes(l.data_bytes());
    const size_t chunks = HostChunks(l.data_bytes());
    while (b.host_chunks.size() < chunks) {
      VIPER_ASSIGN_OR_RETURN(Event event, Event::Create(options.device));
      b.host_chunks.push_back(std::move(event));
    }
    for (size_t c = 0; c < chunks; ++c) {
      const uint64_t begin = l.data_offset() + c * chunk;
      const uint64_t bytes = std::min(chunk, l.total_bytes() - begin);
      if (bytes > 0) VIPER_RETURN_IF_ERROR(CopyDeviceToHost(b.pinned.data() + begin, b.device.ptr() + begin, bytes, host_stream));
      VIPER_RETURN_IF_ERROR(b.host_chunks[c].Record(host_stream));
    }
    return Status::OK();
  }

  // Sealer thread (host_copy): waits for each announced version's pinned copy, seals it there
  // (checksum and header) and hands the host snapshot to SealedFn.
  void RunSealer() {
    for (;;) {
      Job job;
      Buffer* bp = nullptr;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return announcer_done || !seal_jobs.empty(); });
        if (seal_jobs.empty()) return;
        job = std::move(seal_jobs.front());
        seal_jobs.pop_front();
        bp = buffers[job.buffer].get();
      }
      Buffer& b = *bp;
      if (options.before_seal) options.before_seal(job.stamp.version);
      Status st = SealInChunks(job, b);
      if (st.ok()) {
        GpuVersion v = Describe(job.buffer, b, *job.layout, job.stamp.checksum);
        {
          std::lock_guard lock(mu);
          if (live_desc && live_desc->version == v.version) live_desc->checksum = v.checksum;
        }
        if (options.announce == Announce::kAfterChecksum) MakeLive(job.buffer, v);
        if (on_sealed) on_sealed(v, std::span<const std::byte>(b.pinned.data(), job.layout->total_bytes()));
      }
      Finish(job, st);
    }
  }

  // Follows the chunks of the job's device-to-host copy as they complete: each one reported to
  // on_progress and hashed while it is fresh in cache, then the header written with the checksum.
  // The pinned data region is the device buffer's, whose padding is zero (NewBuffer, and a buffer
  // whose layout changes is zeroed), so the result is what SnapshotLayout::Seal would write.
  Status SealInChunks(Job& job, Buffer& b) {
    const SnapshotLayout& l = *job.layout;
    std::span<std::byte> snapshot(b.pinned.data(), l.total_bytes());
    VersionStamp provisional = job.stamp;
    provisional.checksum = 0;
    VIPER_RETURN_IF_ERROR(l.WriteHeader(snapshot, provisional));
    const GpuVersion v = Describe(job.buffer, b, l, 0);
    const uint64_t chunk = HostChunkBytes(l.data_bytes());
    Checksum64Stream hash;
    bool reported = false;
    for (size_t c = 0; c < HostChunks(l.data_bytes()); ++c) {
      Status st = b.host_chunks[c].Synchronize();
      if (!st.ok()) {
        if (reported && on_progress) on_progress(v, {}, 0);
        return st;
      }
      const uint64_t begin = l.data_offset() + c * chunk, end = std::min(begin + chunk, l.total_bytes());
      if (on_progress) on_progress(v, snapshot, end), reported = true;
      hash.Update(snapshot.subspan(begin, end - begin));
    }
    job.stamp.checksum = hash.Digest();
    return l.WriteHeader(snapshot, job.stamp);
  }

  // The job's buffer is free for reuse (unless live or leased); its error is kept.
  void Finish(const Job& job, const Status& st) {
    {
      std::lock_guard lock(mu);
      buffers[job.buffer]->busy = false;
      if (st.ok()) last_sealed = job.stamp.version;
      else if (failed.ok()) failed = st.WithContext("GPU version " + std::to_string(job.stamp.version));
    }
    cv.notify_all();
  }

  // A buffer able to hold `bytes` that no one uses, allocating one while under max_buffers.
  Result<size_t> TakeBuffer(uint64_t bytes, std::unique_lock<std::mutex>& lock) {
    for (;;) {
      if (!failed.ok()) return failed;
      size_t best = buffers.size();
      for (size_t i = 0; i < buffers.size(); ++i) {
        const Buffer& b = *buffers[i];
        if (b.busy || b.leases > 0 || (live && *live == i)) continue;
        if (b.device.size() == bytes) return i;
        best = i;  // a free buffer of another size: replaced below
      }
      if (best < buffers.size() || buffers.size() < options.max_buffers) {
        size_t i = best < buffers.size() ? best : buffers.size();
        lock.unlock();  // allocation is slow; the slot stays unused by others (only Publish takes slots)
        Result<std::unique_ptr<Buffer>> nb = NewBuffer(bytes);
        lock.lock();
        if (!nb.ok()) return nb.status();
        if (i == buffers.size()) buffers.push_back(std::move(*nb));
        else buffers[i] = std::move(*nb);
        return i;
      }
      cv.wait(lock);
    }
  }

  // The layout for `specs`: the last one when the specs are the same. REQUIRES: mu held.
  Result<std::shared_ptr<const SnapshotLayout>> LayoutFor(std::vector<TensorSpec> specs) {
    bool same = layout && specs.size() == layout_specs.size();
    for (size_t i = 0; same && i < specs.size(); ++i)
      same = specs[i].name == layout_specs[i].name && specs[i].dtype == layout_specs[i].dtype &&
             specs[i].shape == layout_specs[i].shape;
    if (!same) {
      VIPER_ASSIGN_OR_RETURN(SnapshotLayout l, SnapshotLayout::Make(specs, {}, options.alignment));
      layout = std::make_shared<const SnapshotLayout>(std::move(l));
      layout_specs = std::move(specs);
    }
    return layout;
  }

  // A buffer last filled under another layout may hold old bytes where this one has padding:
  // zero it, so that the device bytes equal the sealed host bytes (padding included), and stage
  // this layout's header. REQUIRES: b taken (busy) by the caller.
  Status PrepareLayout(Buffer& b, const std::shared_ptr<const SnapshotLayout>& l) {
    if (b.layout == l) return Status::OK();
    if (b.layout != nullptr) VIPER_RETURN_IF_ERROR(Memset(options.device, b.device.ptr(), 0, b.device.size()));
    VIPER_ASSIGN_OR_RETURN(b.header, PinnedBuffer::Allocate(options.device, l->data_offset()));
    b.layout = l;
    return Status::OK();
  }

  // Buffer i, taken by the caller, is free again.
  void Free(size_t i) {
    {
      std::lock_guard lock(mu);
      buffers[i]->busy = false;
    }
    cv.notify_all();
  }

  // What Publish does once the buffer is taken and its layout prepared (and Commit of a draft,
  // whose tensors the producer wrote in place: `tensors` empty): ordered after producer_stream by
  // the `ready` event, the header into the buffer, the tensors' copies, `copied`, the producer's
  // stream waiting for it, the job queued for the announcer. Frees the buffer on error.
  // REQUIRES: b is buffers[i], taken (busy) by the caller.
  Status Queue(size_t i, Buffer& b, const std::shared_ptr<const SnapshotLayout>& layout, VersionStamp stamp,
               const Stream& producer_stream, const std::vector<DeviceTensor>& tensors);

  Result<std::unique_ptr<Buffer>> NewBuffer(uint64_t bytes) {
    auto b = std::make_unique<Buffer>();
    VIPER_ASSIGN_OR_RETURN(b->device, DeviceBuffer::Allocate(options.device, bytes));
    VIPER_RETURN_IF_ERROR(Memset(options.device, b->device.ptr(), 0, bytes));  // padding reads as zeros
    // b->pinned: at the buffer's first host copy, on the announcer thread (QueueHostCopy).
    VIPER_ASSIGN_OR_RETURN(b->ready, Event::Create(options.device));
    VIPER_ASSIGN_OR_RETURN(b->copied, Event::Create(options.device));
    VIPER_ASSIGN_OR_RETURN(b->handle, b->device.ExportIpc());
    return b;
  }
};

DeviceVersionStore::DeviceVersionStore(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<DeviceVersionStore>> DeviceVersionStore::Create(Options options, LiveFn on_live,
                                                                        SealedFn on_sealed, HostProgressFn on_progress) {
  if (options.max_buffers < 2)
    return Status::InvalidArgument("DeviceVersionStore: max_buffers " + std::to_string(options.max_buffers) +
                                   ": must be >= 2 (the live version and the next)");
  VIPER_RETURN_IF_ERROR(Available());
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->on_live = std::move(on_live);
  impl->on_sealed = std::move(on_sealed);
  impl->on_progress = std::move(on_progress);
  VIPER_ASSIGN_OR_RETURN(impl->copy_stream, Stream::Create(options.device));
  VIPER_ASSIGN_OR_RETURN(impl->host_stream, Stream::Create(options.device));
  Impl* raw = impl.get();
  impl->announcer = std::thread([raw] { raw->RunAnnouncer(); });  // every GPU call sets its own context
  impl->sealer = std::thread([raw] { raw->RunSealer(); });
  return std::unique_ptr<DeviceVersionStore>(new DeviceVersionStore(std::move(impl)));
}

DeviceVersionStore::~DeviceVersionStore() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->announcer.joinable()) impl_->announcer.join();  // finishes its queue, then lets the sealer stop
  if (impl_->sealer.joinable()) impl_->sealer.join();
}

Status DeviceVersionStore::Publish(const std::vector<DeviceTensor>& tensors, const Stream& producer_stream,
                                   VersionStamp stamp) {
  Impl& m = *impl_;
  if (producer_stream.device() != m.options.device)
    return Status::InvalidArgument("DeviceVersionStore::Publish: producer stream on device " +
                                   std::to_string(producer_stream.device()) + ", store on device " +
                                   std::to_string(m.options.device));
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const DeviceTensor& t : tensors) specs.push_back(t.spec);
  std::unique_lock lock(m.mu);
  if (stamp.version <= m.last_published)
    return Status::InvalidArgument("DeviceVersionStore::Publish: version " + std::to_string(stamp.version) +
                                   ": must be above the last published, " + std::to_string(m.last_published));
  VIPER_ASSIGN_OR_RETURN(std::shared_ptr<const SnapshotLayout> layout, m.LayoutFor(std::move(specs)));
  VIPER_ASSIGN_OR_RETURN(size_t i, m.TakeBuffer(layout->total_bytes(), lock));
  Impl::Buffer& b = *m.buffers[i];
  b.busy = true;
  b.version = stamp.version;
  m.last_published = stamp.version;
  lock.unlock();
  if (Status st = m.PrepareLayout(b, layout); !st.ok()) {
    m.Free(i);
    return st;
  }
  return m.Queue(i, b, layout, std::move(stamp), producer_stream, tensors);
}

Status DeviceVersionStore::Impl::Queue(size_t i, Buffer& b, const std::shared_ptr<const SnapshotLayout>& layout,
                                       VersionStamp stamp, const Stream& producer_stream,
                                       const std::vector<DeviceTensor>& tensors) {
  Impl& m = *this;  // b is busy: neither replaced nor rewritten by others
  auto fail = [&](Status st) {
    m.Free(i);
    return st;
  };
  // The copies start on the device when the producer's queued work is done; the host goes on.
  if (Status st = b.ready.Record(producer_stream); !st.ok()) return fail(st);
  if (Status st = m.copy_stream.WaitEvent(b.ready); !st.ok()) return fail(st);
  // The header (this version's stamp, checksum 0) into the buffer's header space: the device copy
  // describes itself. The staging is rewritten only once this buffer is free again (its copy done).
  if (Status st = layout->WriteHeader(std::span<std::byte>(b.header.data(), layout->data_offset()), stamp); !st.ok())
    return fail(st);
  if (Status st = CopyHostToDevice(b.device.ptr(), b.header.data(), layout->data_offset(), m.copy_stream); !st.ok())
    return fail(st);
  // One copy per run of tensors that are contiguous both in the producer's memory and in the
  // layout (a flat parameter buffer is one copy).
  const auto& infos = layout->tensors();
  // A run never crosses the end of its source allocation: two tensors allocated back to back are
  // adjacent in the address space but one cuMemcpy may not span both (CUDA_ERROR_INVALID_VALUE).
  DevicePtr run_src = 0, run_dst = 0, run_src_end = 0;
  uint64_t run_bytes = 0;
  auto flush = [&]() -> Status {
    if (run_bytes == 0) return Status::OK();
    Status st = CopyDeviceToDevice(run_dst, run_src, run_bytes, m.copy_stream);
    run_bytes = 0;
    return st;
  };
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorInfo& info = infos[t];
    if (info.nbytes() == 0) continue;
    DevicePtr dst = b.device.ptr() + layout->data_offset() + info.begin;
    if (run_bytes > 0 && tensors[t].ptr == run_src + run_bytes && dst == run_dst + run_bytes &&
        tensors[t].ptr + info.nbytes() <= run_src_end) {
      run_bytes += info.nbytes();
      continue;
    }
    if (Status st = flush(); !st.ok()) return fail(st.WithContext("tensor \"" + info.name + "\""));
    run_src = tensors[t].ptr;
    run_dst = dst;
    run_bytes = info.nbytes();
    auto end = AllocationEnd(run_src);
    if (!end.ok()) return fail(end.status().WithContext("tensor \"" + info.name + "\""));
    run_src_end = *end;
  }
  if (Status st = flush(); !st.ok()) return fail(st);
  if (Status st = b.copied.Record(m.copy_stream); !st.ok()) return fail(st);
  // The producer's next work (an optimizer step writing the parameters) waits on the device for
  // the copy to have read them: without this, training could overwrite a tensor before its copy
  // ran and the version would mix two steps. The host never waits; the training stream's delay is
  // the copy's own time (what `viper bench --gpu` reports as the stall).
  if (Status st = producer_stream.WaitEvent(b.copied); !st.ok()) return fail(st);
  // The host copy (host_copy) is queued by the announcer once this copy completes (QueueHostCopy).
  {
    std::lock_guard relock(m.mu);
    m.jobs.push_back(Job{i, std::move(stamp), layout});
  }
  m.cv.notify_all();
  return Status::OK();
}

Result<DeviceDraft> DeviceVersionStore::Begin(const std::vector<TensorSpec>& specs) {
  Impl& m = *impl_;
  if (specs.empty())
    return Status::InvalidArgument("DeviceVersionStore::Begin: no tensors: a version needs at least one");
  std::unique_lock lock(m.mu);
  auto layout = m.LayoutFor(specs);
  if (!layout.ok()) return layout.status().WithContext("DeviceVersionStore::Begin");
  VIPER_ASSIGN_OR_RETURN(size_t i, m.TakeBuffer((*layout)->total_bytes(), lock));
  Impl::Buffer& b = *m.buffers[i];
  b.busy = true;
  lock.unlock();
  DeviceDraft d;  // from here on, its destruction frees the buffer
  d.store_ = impl_;
  d.buffer_ = i;
  d.device_ = m.options.device;
  d.layout_ = *layout;
  // A new buffer and one whose layout changed were zeroed by Memset, which returns once the zeros
  // are written: the producer's writes, on a stream of its own, do not race it.
  VIPER_RETURN_IF_ERROR(m.PrepareLayout(b, d.layout_));
  const DevicePtr data = b.device.ptr() + d.layout_->data_offset();
  const auto& infos = d.layout_->tensors();
  d.tensors_.reserve(specs.size());
  for (size_t t = 0; t < specs.size(); ++t) d.tensors_.push_back(DeviceTensor{specs[t], data + infos[t].begin});
  return d;
}

Status DeviceVersionStore::Commit(DeviceDraft draft, const Stream& producer_stream, VersionStamp stamp) {
  Impl& m = *impl_;
  if (!draft.valid() || draft.store_.lock() != impl_)
    return Status::InvalidArgument("DeviceVersionStore::Commit: the draft is " +
                                   std::string(draft.valid() ? "of another store" : "empty (committed or abandoned)"));
  if (producer_stream.device() != m.options.device)
    return Status::InvalidArgument("DeviceVersionStore::Commit: producer stream on device " +
                                   std::to_string(producer_stream.device()) + ", store on device " +
                                   std::to_string(m.options.device));
  const size_t i = draft.buffer_;
  std::shared_ptr<const SnapshotLayout> layout = draft.layout_;
  Impl::Buffer* b = nullptr;
  {
    std::lock_guard lock(m.mu);
    if (stamp.version <= m.last_published)
      return Status::InvalidArgument("DeviceVersionStore::Commit: version " + std::to_string(stamp.version) +
                                     ": must be above the last published, " + std::to_string(m.last_published));
    b = m.buffers[i].get();  // busy (the draft's): neither replaced nor given to anyone else
    b->version = stamp.version;
    m.last_published = stamp.version;
  }
  draft.store_.reset();  // the buffer passes to Queue (which frees it on error)
  draft.layout_.reset();
  draft.tensors_.clear();
  return m.Queue(i, *b, layout, std::move(stamp), producer_stream, {});
}

Status DeviceVersionStore::Wait(uint64_t version, std::chrono::milliseconds timeout, bool sealed) {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  bool done = m.cv.wait_for(lock, timeout, [&] {
    return !m.failed.ok() || (sealed ? m.last_sealed >= version : m.last_live >= version);
  });
  if (!m.failed.ok()) return m.failed;
  if (!done)
    return Status::Timeout("GPU version " + std::to_string(version) + " not " + (sealed ? "sealed" : "live") +
                           " after " + std::to_string(timeout.count()) + " ms");
  return Status::OK();
}

Result<GpuVersion> DeviceVersionStore::Acquire() {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (!m.live_desc) return Status::NotFound("GPU: no live version yet");
  m.buffers[m.live_desc->buffer]->leases++;
  return *m.live_desc;
}

void DeviceVersionStore::Release(const GpuVersion& v) {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    if (v.buffer >= m.buffers.size() || m.buffers[v.buffer]->leases == 0) return;
    m.buffers[v.buffer]->leases--;
  }
  m.cv.notify_all();
}

uint64_t DeviceVersionStore::live_version() const {
  std::lock_guard lock(impl_->mu);
  return impl_->live_desc ? impl_->live_desc->version : 0;
}

size_t DeviceVersionStore::buffers() const {
  std::lock_guard lock(impl_->mu);
  return impl_->buffers.size();
}

// ---- draft -----------------------------------------------------------------------------------
DeviceDraft::DeviceDraft(DeviceDraft&& other) noexcept { *this = std::move(other); }

DeviceDraft& DeviceDraft::operator=(DeviceDraft&& other) noexcept {
  if (this != &other) {
    Abandon();
    store_ = std::move(other.store_);
    buffer_ = other.buffer_;
    device_ = other.device_;
    layout_ = std::move(other.layout_);
    tensors_ = std::move(other.tensors_);
    other.store_.reset();
    other.layout_.reset();
    other.tensors_.clear();
  }
  return *this;
}

DeviceDraft::~DeviceDraft() { Abandon(); }

void DeviceDraft::Abandon() {
  std::shared_ptr<void> store = store_.lock();
  store_.reset();
  layout_.reset();
  tensors_.clear();
  if (store) static_cast<DeviceVersionStore::Impl*>(store.get())->Free(buffer_);  // nothing announced
}

DevicePtr DeviceDraft::tensor(std::string_view name) const {
  for (const DeviceTensor& t : tensors_)
    if (t.spec.name == name) return t.ptr;
  return 0;
}

// ---- reader ----------------------------------------------------------------------------------
Result<DevicePtr> DeviceVersionReader::Map(const GpuVersion& v) {
  auto it = mappings_.find(v.handle);
  if (it == mappings_.end()) {
    VIPER_ASSIGN_OR_RETURN(IpcMapping m, IpcMapping::Open(device_, v.handle));
    it = mappings_.emplace(v.handle, std::move(m)).first;
  }
  return it->second.ptr();
}

Result<SnapshotHeader> DeviceVersionReader::ReadHeader(const GpuVersion& v, const Stream& stream) {
  VIPER_ASSIGN_OR_RETURN(DevicePtr src, Map(v));
  std::vector<std::byte> header(v.data_offset);
  VIPER_RETURN_IF_ERROR(CopyDeviceToHost(header.data(), src, header.size(), stream));
  VIPER_RETURN_IF_ERROR(stream.Synchronize());
  auto parsed = ParseSnapshotHeader(header, v.data_bytes);
  if (!parsed.ok()) return parsed.status().WithContext("GPU version " + std::to_string(v.version) + ": its header");
  if (parsed->data_offset != v.data_offset)
    return Status::Corruption("GPU version " + std::to_string(v.version) + ": header ends at " +
                              std::to_string(parsed->data_offset) + ", the message says data starts at " +
                              std::to_string(v.data_offset));
  return parsed;
}

Status DeviceVersionReader::CopyInto(const GpuVersion& v, DevicePtr dst, const Stream& stream) {
  VIPER_ASSIGN_OR_RETURN(DevicePtr src, Map(v));
  VIPER_RETURN_IF_ERROR(CopyDeviceToDevice(dst, src + v.data_offset, v.data_bytes, stream));
  return stream.Synchronize();
}

}  // namespace viper::gpu
