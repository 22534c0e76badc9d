// HostTier: a pool of POSIX shared-memory segments. See src/store/host_tier.h for the contract.
//
// Bookkeeping lives in a Pool shared (via weak_ptr) with the ReadLease tokens, so that a lease
// dropped on any thread can hand its segment back, and a lease that outlives the tier still keeps
// its mapping valid (the mapping is reference-counted separately from the pool).
#include "store/host_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "core/fd.h"
#include "core/memory.h"
#include "store/file_tier.h"
#include "store_util.h"
#include "viper/log.h"

namespace viper {
namespace {

using store_internal::FormatBytes;

constexpr std::string_view kLog = "host_tier";
constexpr const char* kShmDir = "/dev/shm";

// Process-wide, so that two tiers with the same prefix in one process never pick the same name.
std::atomic<uint64_t> g_next_seq{1};

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// Capacity of a fresh segment for `size` bytes: a little slack so that a later version whose
// header grew by a few bytes still fits. Untouched slack pages cost no memory in tmpfs.
uint64_t FreshCapacity(uint64_t size) { return RoundUp(size + std::max<uint64_t>(PageSize(), size / 64), PageSize()); }

// A recycled segment must not be much larger than the request: handing a 1.7 GB segment to a
// 64 MiB version would pin the big one for a small use. Beyond this the pool creates fresh.
bool FitsForRecycling(uint64_t capacity, uint64_t size) {
  return capacity >= size && capacity <= 2 * RoundUp(size, PageSize()) + PageSize();
}

Status ValidatePrefix(const std::string& prefix) {
  bool ok = !prefix.empty() && prefix.size() <= 64;
  for (char c : prefix) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-');
  }
  if (ok) return Status::OK();
  return Status::InvalidArgument(
      fmt::format("host tier prefix '{}' must be 1-64 characters of [A-Za-z0-9_-]", prefix));
}

// One mapped segment. Unmaps on destruction; unlinking the name is the pool's call. No file
// descriptor is kept: one per segment ran a process out of them (RLIMIT_NOFILE, often 1024) at a
// thousand segments, which a sample cache holding one sample per segment reaches in seconds.
struct Mapping {
  std::string name;
  ino_t inode = 0;  // of the segment created, to check a reopened name against
  std::byte* base = nullptr;
  uint64_t capacity = 0;

  ~Mapping() {
    if (base != nullptr && ::munmap(base, capacity) != 0) {
      log(LogLevel::kWarn, kLog, "segment {}: munmap failed: {}", name, std::strerror(errno));
    }
  }
};

void UnlinkSegment(const std::string& name) {
  if (::shm_unlink(("/" + name).c_str()) != 0 && errno != ENOENT) {
    log(LogLevel::kWarn, kLog, "segment {}: shm_unlink failed: {}", name, std::strerror(errno));
  }
}

// Creates /dev/shm/<name> with exactly `mode` (fchmod: the umask must not widen or narrow it),
// sized `capacity`, mapped read-write; *fd is its descriptor, for Reserve. O_EXCL: an existing
// entry of that name (another user's squat, a link) is never opened; the caller picks another
// name on AlreadyExists.
Result<std::shared_ptr<Mapping>> CreateSegment(const std::string& name, uint64_t capacity, mode_t mode, Fd* fd) {
  auto map = std::make_shared<Mapping>();
  map->name = name;
  *fd = Fd(::shm_open(("/" + name).c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (fd->get() < 0 && errno == EEXIST) {
    struct stat st {};
    std::string owner = ::lstat((std::string(kShmDir) + "/" + name).c_str(), &st) == 0
                            ? fmt::format("uid {}", st.st_uid)
                            : "someone";
    return Status::AlreadyExists(fmt::format("segment {}: the name is taken (by {})", name, owner));
  }
  if (fd->get() < 0) return Status::FromErrno(fmt::format("segment {}: shm_open failed", name));
  auto fail = [&](std::string what) {
    Status st = Status::FromErrno(fmt::format("segment {}: {}", name, what));
    UnlinkSegment(name);
    return st;
  };
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return fail("fstat failed");
  map->inode = st.st_ino;
  if (::fchmod(fd->get(), mode) != 0) return fail(fmt::format("fchmod {:o} failed", mode));
  if (::ftruncate(fd->get(), static_cast<off_t>(capacity)) != 0) {
    return fail(fmt::format("ftruncate to {} failed", FormatBytes(capacity)));
  }
  void* base = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  if (base == MAP_FAILED) return fail(fmt::format("mmap of {} failed", FormatBytes(capacity)));
  map->base = static_cast<std::byte*>(base);
  map->capacity = capacity;
  return map;
}

// Backs the first `size` bytes with real tmpfs pages, so that a full /dev/shm fails here with a
// clear error instead of killing the writer with SIGBUS on its first store into a hole, and maps
// them into our page tables in one pass (fallocate does not): the producer's first copy into a
// fresh 1.7 GB segment otherwise faults 415k pages one by one (0.98-4.8 s against 0.14 s).
// `fd`: the segment's descriptor (CreateSegment's, or ReserveMore's).
Status Reserve(int fd, const Mapping& map, uint64_t size) {
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err == 0) {
    PrefaultForWrite(map.base, size);
    return Status::OK();
  }
  std::string room;  // what a full /dev/shm holds, for whoever sizes it (a container's is often 64 MiB)
  struct statvfs vfs {};
  if (err == ENOSPC && ::statvfs(kShmDir, &vfs) == 0)
    room = fmt::format(" (which holds {} in all; a container's is often 64 MiB: docker run --shm-size, a memory-backed "
                       "emptyDir on Kubernetes)", FormatBytes(uint64_t{vfs.f_blocks} * vfs.f_frsize));
  return Status::FromErrno(
      fmt::format("segment {}: reserving {} in {}{} failed", map.name, FormatBytes(size), kShmDir, room), err);
}

// Reserve for a recycled segment asked for more than it reserved before: its name is opened again
// (the sticky /dev/shm lets no other user replace it; the inode is checked all the same).
Status ReserveMore(const Mapping& map, uint64_t size) {
  Fd fd(::shm_open(("/" + map.name).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0));
  if (fd.get() < 0) return Status::FromErrno(fmt::format("segment {}: shm_open failed", map.name));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(fmt::format("segment {}: fstat failed", map.name));
  if (st.st_ino != map.inode) return Status::Internal(fmt::format("segment {}: the name no longer names it", map.name));
  return Reserve(fd.get(), map, size);
}

// A new segment `<prefix>.<pid>.<seq>` for `size` bytes, reserved (and faulted in); its seq is
// its id in the pool. Nothing is left in /dev/shm on failure.
struct FreshSegment {
  uint64_t id = 0;
  std::shared_ptr<Mapping> map;
};
// A name that is taken (another local user may create any name in /dev/shm) is skipped: the next
// try jumps the sequence by a random amount, so that squatting the names ahead cannot keep up.
Result<FreshSegment> CreateReservedSegment(const HostTierOptions& options, uint64_t size) {
  constexpr int kTries = 16;
  FreshSegment fresh;
  std::string name;
  Fd fd;  // closed when the segment is reserved
  for (int attempt = 0;; ++attempt) {
    uint64_t step = 1;
    if (attempt > 0) {
      thread_local std::mt19937_64 rng{std::random_device{}()};
      step += rng() & 0xffffffffu;
    }
    fresh.id = g_next_seq.fetch_add(step);
    name = fmt::format("{}.{}.{}", options.prefix, ::getpid(), fresh.id);
    Result<std::shared_ptr<Mapping>> made = CreateSegment(name, FreshCapacity(size), options.mode, &fd);
    if (made.ok()) {
      fresh.map = *std::move(made);
      break;
    }
    if (made.status().code() != StatusCode::kAlreadyExists || attempt + 1 == kTries) return made.status();
    log(LogLevel::kWarn, kLog, "{}{}: not ours, left alone; picking another name", "/dev/shm/",
        made.status().message());
  }
  Status st = Reserve(fd.get(), *fresh.map, size);
  if (!st.ok()) {
    UnlinkSegment(name);
    return st;
  }
  return fresh;
}

enum class SegState { kWriting, kCommitted, kRetiredLeased, kFree };

struct Segment {
  std::shared_ptr<Mapping> map;
  SegState state = SegState::kWriting;
  uint64_t size = 0;      // bytes in use by the current or last version
  uint64_t reserved = 0;  // bytes backed by posix_fallocate
  std::string model;
  uint64_t version = 0;
  uint64_t leases = 0;     // live ReadLease holds
  uint64_t free_tick = 0;  // when it became free (LRU trimming)
};

std::string JoinVersions(const std::map<uint64_t, uint64_t>* versions) {
  if (versions == nullptr || versions->empty()) return "none";
  std::string out;
  for (const auto& [v, id] : *versions) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

// The tier's state. Every member is guarded by `mu`. Segments enter and leave `segments` only
// through Add and Remove, and the free state only through MakeFree and TakeFree, which keep the
// indexes beside it: every operation is logarithmic in the segments held (a sample cache holds
// tens of thousands; scans over them made each put cost O(n): 0.5 ms at 10,000, 7.8 ms at 60,000).
class HostPool {
 public:
  HostPool(const HostTierOptions& options, uint64_t max_bytes) : options_(options), max_bytes(max_bytes) {}

  std::mutex mu;
  HostTierOptions options_;
  const uint64_t max_bytes;    // the byte budget in effect (options_.max_bytes or its default)
  uint64_t pending_bytes = 0;  // capacity of fresh segments being created (not yet in `segments`)
  std::map<uint64_t, Segment> segments;                                 // by id (= name's seq)
  // model -> version -> id. A model's entry is made by its first commit and never left empty
  // (keep_versions >= 1), so its size is the number of models held.
  std::map<std::string, std::map<uint64_t, uint64_t>> committed;
  uint64_t tick = 0;
  uint64_t recycled_allocations = 0;
  uint64_t fresh_allocations = 0;
  uint64_t spare_segments = 0;  // made by KeepSpare
  bool shut_down = false;
  uint64_t spare_size = 0;             // size a KeepSpare() is making a segment for, 0 if none
  std::condition_variable spare_done;  // signalled when that segment is in the free pool (or failed)

  void Add(uint64_t id, Segment seg) {
    held_capacity_ += seg.map->capacity;
    capacities_.emplace(seg.map->capacity, id);
    segments.emplace(id, std::move(seg));
  }
  // Out of the pool: the caller unlinks and unmaps the mapping (Drop).
  std::shared_ptr<Mapping> Remove(uint64_t id) {
    auto it = segments.find(id);
    Segment& seg = it->second;
    if (seg.state == SegState::kFree) Unindex(id, seg);
    held_capacity_ -= seg.map->capacity;
    capacities_.erase({seg.map->capacity, id});
    std::shared_ptr<Mapping> map = std::move(seg.map);
    segments.erase(it);
    return map;
  }

  // The free segment that best fits `size` (smallest adequate capacity, then lowest id), or 0.
  uint64_t FindFree(uint64_t size) const {
    auto it = free_by_capacity_.lower_bound({size, 0});
    return it != free_by_capacity_.end() && FitsForRecycling(it->first, size) ? it->second : 0;
  }
  // Takes free segment `id` for writing.
  Segment& TakeFree(uint64_t id) {
    Segment& seg = segments.at(id);
    Unindex(id, seg);
    seg.state = SegState::kWriting;
    return seg;
  }
  // Whether at least `n` segments (in any state) could be recycled for `size`.
  bool HasFitting(uint64_t size, size_t n) const {
    size_t fitting = 0;
    for (auto it = capacities_.lower_bound({size, 0}); it != capacities_.end() && fitting < n; ++it) {
      if (!FitsForRecycling(it->first, size)) break;
      ++fitting;
    }
    return fitting >= n;
  }

  // The budget is the node's host_max_bytes or, by default, half of /dev/shm: in a container,
  // whose /dev/shm is often 64 MiB, it is /dev/shm that needs to grow.
  std::string HowToRaiseTheBudget() const {
    if (options_.max_bytes != 0) return "raise the node's host_max_bytes, `viper serve --host-max-bytes`";
    return fmt::format("the default budget is half of {}'s {}: give {} more room (a container's is often 64 MiB: "
                       "docker run --shm-size, a memory-backed emptyDir on Kubernetes) or set host_max_bytes, "
                       "`viper serve --host-max-bytes`, within it", kShmDir, FormatBytes(max_bytes * 2), kShmDir);
  }

  // Capacity of every segment held or being created.
  uint64_t UsedBytes() const { return pending_bytes + held_capacity_; }

  // Makes room in the budget for a fresh segment of `capacity`: unlinks free segments (least
  // recently freed first) while it would not fit; ResourceExhausted if it still does not.
  Status MakeRoom(uint64_t capacity, std::vector<std::shared_ptr<Mapping>>* out) {
    while (UsedBytes() + capacity > max_bytes) {
      if (free_by_tick_.empty()) {
        return Status::ResourceExhausted(fmt::format(
            "host tier: a new {} segment would bring the shared memory this node holds to {}, beyond its budget of "
            "{} ({} segments for {} models; {})",
            FormatBytes(capacity), FormatBytes(UsedBytes() + capacity), FormatBytes(max_bytes), segments.size(),
            committed.size(), HowToRaiseTheBudget()));
      }
      out->push_back(Remove(free_by_tick_.begin()->second));
    }
    return Status::OK();
  }

  // Moves a segment to the free pool and trims the pool; unlinked victims are appended to `out`
  // so that the caller unmaps them after dropping the lock.
  void MakeFree(uint64_t id, std::vector<std::shared_ptr<Mapping>>* out) {
    Segment& seg = segments.at(id);
    seg.state = SegState::kFree;
    seg.model.clear();
    seg.free_tick = ++tick;
    free_by_capacity_.emplace(seg.map->capacity, id);
    free_by_tick_.emplace(seg.free_tick, id);
    Trim(out);
  }

  void Trim(std::vector<std::shared_ptr<Mapping>>* out) {
    while (free_by_tick_.size() > options_.max_free_segments) out->push_back(Remove(free_by_tick_.begin()->second));
  }

  // Retirement: free now, or when the last lease drops.
  void Retire(uint64_t id, std::vector<std::shared_ptr<Mapping>>* out) {
    Segment& seg = segments.at(id);
    if (seg.leases == 0) {
      MakeFree(id, out);
    } else {
      seg.state = SegState::kRetiredLeased;
    }
  }

  void ApplyRetention(const std::string& model, std::vector<std::shared_ptr<Mapping>>* out) {
    auto& versions = committed[model];
    while (versions.size() > options_.keep_versions) {
      uint64_t id = versions.begin()->second;
      versions.erase(versions.begin());
      Retire(id, out);
    }
  }

  void ReleaseLease(uint64_t id) {
    std::vector<std::shared_ptr<Mapping>> victims;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (shut_down) return;
      auto it = segments.find(id);
      if (it == segments.end() || it->second.leases == 0) return;
      if (--it->second.leases == 0 && it->second.state == SegState::kRetiredLeased) MakeFree(id, &victims);
    }
    Drop(std::move(victims));
  }

  // Unlinks and unmaps segments removed from the pool (outside the lock: munmap of GBs is slow).
  static void Drop(std::vector<std::shared_ptr<Mapping>> victims) {
    for (auto& map : victims) {
      log(LogLevel::kDebug, kLog, "unlinking free segment {} ({})", map->name, FormatBytes(map->capacity));
      UnlinkSegment(map->name);
    }
    victims.clear();
  }

 private:
  void Unindex(uint64_t id, const Segment& seg) {
    free_by_capacity_.erase({seg.map->capacity, id});
    free_by_tick_.erase(seg.free_tick);
  }

  uint64_t held_capacity_ = 0;                            // capacity of everything in `segments`
  std::set<std::pair<uint64_t, uint64_t>> capacities_;    // (capacity, id) of every segment
  std::set<std::pair<uint64_t, uint64_t>> free_by_capacity_;  // (capacity, id) of the free ones
  std::map<uint64_t, uint64_t> free_by_tick_;             // free_tick -> id of the free ones, oldest first
};

// The object behind ReadLease::hold(): tells the pool when the last copy of a lease goes, and
// keeps the mapping alive even if the tier is gone by then.
struct LeaseToken {
  std::weak_ptr<HostPool> pool;
  std::shared_ptr<Mapping> map;
  uint64_t id = 0;
  ~LeaseToken() {
    if (auto p = pool.lock()) p->ReleaseLease(id);
  }
};

}  // namespace

struct HostTier::Impl {
  std::shared_ptr<HostPool> pool;
};

// ---- WriteLease ----

WriteLease::WriteLease(WriteLease&& other) noexcept
    : tier_(std::exchange(other.tier_, nullptr)),
      segment_id_(other.segment_id_),
      data_(std::exchange(other.data_, {})),
      recycled_(other.recycled_) {}

WriteLease& WriteLease::operator=(WriteLease&& other) noexcept {
  if (this != &other) {
    if (tier_ != nullptr) tier_->Abort(segment_id_);
    tier_ = std::exchange(other.tier_, nullptr);
    segment_id_ = other.segment_id_;
    data_ = std::exchange(other.data_, {});
    recycled_ = other.recycled_;
  }
  return *this;
}

WriteLease::~WriteLease() {
  if (tier_ != nullptr) tier_->Abort(segment_id_);
}

const std::string& WriteLease::segment_name() const {
  static const std::string kNone;
  return tier_ != nullptr ? tier_->NameOf(segment_id_) : kNone;
}

// ---- HostTier ----

namespace {

// The byte budget in effect: the configured one, or half of /dev/shm's size.
uint64_t EffectiveMaxBytes(const HostTierOptions& options) {
  if (options.max_bytes != 0) return options.max_bytes;
  struct statvfs vfs {};
  if (::statvfs(kShmDir, &vfs) != 0 || vfs.f_blocks == 0) return UINT64_MAX;
  return static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize / 2;
}

}  // namespace

HostTier::HostTier(const HostTierOptions& options)
    : options_(options),
      impl_(std::make_unique<Impl>(Impl{std::make_shared<HostPool>(options, EffectiveMaxBytes(options))})) {}

Result<std::unique_ptr<HostTier>> HostTier::Open(const HostTierOptions& options) {
  VIPER_RETURN_IF_ERROR(ValidatePrefix(options.prefix));
  if (options.keep_versions < 1) return Status::InvalidArgument("host tier keep_versions must be >= 1");
  if ((options.mode & ~static_cast<mode_t>(0777)) != 0 || (options.mode & 0600) != 0600) {
    return Status::InvalidArgument(fmt::format(
        "host tier mode {:o} must be permission bits (<= 0777) that include owner read-write (0600)",
        options.mode));
  }
  if (options.remove_stale) {
    for (const std::string& name : FindStaleSegments(options.prefix, options.prefix_is_exclusive)) {
      if (options.keep_stale.count(name) != 0) continue;
      log(LogLevel::kWarn, kLog, "removing stale segment {}{}: its creating process is dead", "/dev/shm/", name);
      UnlinkSegment(name);
    }
  }
  return std::unique_ptr<HostTier>(new HostTier(options));
}

HostTier::~HostTier() {
  std::vector<std::shared_ptr<Mapping>> all;
  {
    std::lock_guard<std::mutex> lock(impl_->pool->mu);
    impl_->pool->shut_down = true;
    for (auto& [id, seg] : impl_->pool->segments) all.push_back(std::move(seg.map));
    impl_->pool->segments.clear();
    impl_->pool->committed.clear();
  }
  // Leased mappings stay mapped through their LeaseToken; the names go now.
  for (auto& map : all) UnlinkSegment(map->name);
}

Result<WriteLease> HostTier::Allocate(uint64_t size) {
  if (size == 0) return Status::InvalidArgument("host tier: cannot allocate a segment of 0 bytes");
  HostPool& pool = *impl_->pool;
  std::shared_ptr<Mapping> map;
  uint64_t id = 0;
  bool recycled = false;
  uint64_t reserved = 0;
  {
    std::unique_lock<std::mutex> lock(pool.mu);
    id = pool.FindFree(size);
    if (id == 0 && pool.spare_size != 0 && FitsForRecycling(FreshCapacity(pool.spare_size), size)) {
      // The spare being made fits: waiting for it costs no more than making another one, and
      // two fresh segments filled at once would compete for the same pages.
      pool.spare_done.wait(lock, [&] { return pool.spare_size == 0; });
      id = pool.FindFree(size);
    }
    if (id != 0) {
      Segment& seg = pool.TakeFree(id);
      seg.size = size;
      map = seg.map;
      reserved = seg.reserved;
      recycled = true;
    }
  }
  const uint64_t capacity = FreshCapacity(size);
  if (!recycled) {
    std::vector<std::shared_ptr<Mapping>> victims;
    Status room;
    {
      std::lock_guard<std::mutex> lock(pool.mu);
      room = pool.MakeRoom(capacity, &victims);
      if (room.ok()) pool.pending_bytes += capacity;
    }
    HostPool::Drop(std::move(victims));
    VIPER_RETURN_IF_ERROR(room);
    Result<FreshSegment> fresh = CreateReservedSegment(options_, size);
    if (!fresh.ok()) {
      std::lock_guard<std::mutex> lock(pool.mu);
      pool.pending_bytes -= capacity;
      return fresh.status();
    }
    id = fresh->id;
    map = std::move(fresh->map);
  } else if (size > reserved) {
    Status st = ReserveMore(*map, size);
    if (!st.ok()) {
      Abort(id);
      return st;
    }
  }
  std::lock_guard<std::mutex> lock(pool.mu);
  if (recycled) {
    Segment& seg = pool.segments.at(id);
    seg.reserved = std::max(seg.reserved, size);
    ++pool.recycled_allocations;
  } else {
    Segment seg;
    seg.map = map;
    seg.size = size;
    seg.reserved = size;
    pool.Add(id, std::move(seg));
    pool.pending_bytes -= capacity;
    ++pool.fresh_allocations;
  }
  WriteLease lease;
  lease.tier_ = this;
  lease.segment_id_ = id;
  lease.data_ = std::span<std::byte>(map->base, size);
  lease.recycled_ = recycled;
  return lease;
}

Status HostTier::KeepSpare(uint64_t size) {
  if (size == 0) return Status::InvalidArgument("host tier: cannot keep a spare segment of 0 bytes");
  HostPool& pool = *impl_->pool;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (pool.shut_down || pool.spare_size != 0 || pool.FindFree(size) != 0) return Status::OK();
    if (pool.HasFitting(size, options_.keep_versions + 1)) return Status::OK();  // one model's steady state
    if (pool.UsedBytes() + FreshCapacity(size) > pool.max_bytes) return Status::OK();  // a spare is not worth the budget
    pool.spare_size = size;
    pool.pending_bytes += FreshCapacity(size);
  }
  Result<FreshSegment> fresh = CreateReservedSegment(options_, size);
  std::vector<std::shared_ptr<Mapping>> victims;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.spare_size = 0;
    pool.pending_bytes -= FreshCapacity(size);
    if (fresh.ok() && pool.shut_down) {
      UnlinkSegment(fresh->map->name);  // the tier closed meanwhile; the mapping goes with `fresh`
    } else if (fresh.ok()) {
      Segment seg;
      seg.map = fresh->map;
      seg.size = size;
      seg.reserved = size;
      pool.Add(fresh->id, std::move(seg));
      pool.MakeFree(fresh->id, &victims);
      ++pool.spare_segments;
    }
  }
  pool.spare_done.notify_all();
  HostPool::Drop(std::move(victims));
  return fresh.status().WithContext("keeping a spare segment");
}

Status HostTier::Commit(WriteLease lease, const std::string& model, uint64_t version) {
  if (!lease) return Status::InvalidArgument("host tier Commit: the write lease is empty (moved from or committed)");
  if (lease.tier_ != this) return Status::InvalidArgument("host tier Commit: the write lease belongs to another tier");
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  VIPER_RETURN_IF_ERROR(ValidateVersion(version).WithContext("model " + model));
  HostPool& pool = *impl_->pool;
  std::vector<std::shared_ptr<Mapping>> victims;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    auto held = pool.committed.find(model);
    if (options_.max_models != 0 && held == pool.committed.end()) {
      const size_t models = pool.committed.size();
      if (models >= options_.max_models) {
        return Status::ResourceExhausted(fmt::format(
            "host tier: model {} would be model {} in this node's shared memory, beyond its budget of {} models "
            "(raise the node's host_max_models, `viper serve --host-max-models`)",
            model, models + 1, options_.max_models));
      }
    }
    auto& versions = pool.committed[model];
    if (!versions.empty() && version <= versions.rbegin()->first) {
      return Status::FailedPrecondition(fmt::format(
          "host tier: model {} version {} is not newer than its latest committed version {}", model, version,
          versions.rbegin()->first));
    }
    Segment& seg = pool.segments.at(lease.segment_id_);
    seg.state = SegState::kCommitted;
    seg.model = model;
    seg.version = version;
    versions.emplace(version, lease.segment_id_);
    lease.tier_ = nullptr;  // committed: its destructor must not abort
    pool.ApplyRetention(model, &victims);
  }
  HostPool::Drop(std::move(victims));
  return Status::OK();
}

Result<ReadLease> HostTier::CommitDetached(WriteLease lease, const std::string& model, uint64_t version) {
  if (!lease) return Status::InvalidArgument("host tier CommitDetached: the write lease is empty (moved from or committed)");
  if (lease.tier_ != this) return Status::InvalidArgument("host tier CommitDetached: the write lease belongs to another tier");
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  VIPER_RETURN_IF_ERROR(ValidateVersion(version).WithContext("model " + model));
  HostPool& pool = *impl_->pool;
  std::lock_guard<std::mutex> lock(pool.mu);
  Segment& seg = pool.segments.at(lease.segment_id_);
  // Retired from the start: no Acquire finds it, and the last lease's release frees it.
  seg.state = SegState::kRetiredLeased;
  seg.model = model;
  seg.version = version;
  ++seg.leases;
  auto token = std::make_shared<LeaseToken>();
  token->pool = impl_->pool;
  token->map = seg.map;
  token->id = lease.segment_id_;
  ReadLease out;
  out.data_ = std::span<const std::byte>(seg.map->base, seg.size);
  out.hold_ = std::move(token);
  out.name_ = seg.map->name;
  out.model_ = model;
  out.version_ = version;
  lease.tier_ = nullptr;  // committed: its destructor must not abort
  return out;
}

void HostTier::Abort(uint64_t segment_id) {
  HostPool& pool = *impl_->pool;
  std::vector<std::shared_ptr<Mapping>> victims;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    auto it = pool.segments.find(segment_id);
    if (it == pool.segments.end() || it->second.state != SegState::kWriting) return;
    pool.MakeFree(segment_id, &victims);
  }
  HostPool::Drop(std::move(victims));
}

const std::string& HostTier::NameOf(uint64_t segment_id) const {
  static const std::string kNone;
  std::lock_guard<std::mutex> lock(impl_->pool->mu);
  auto it = impl_->pool->segments.find(segment_id);
  return it == impl_->pool->segments.end() ? kNone : it->second.map->name;  // Mapping is stable while leased
}

Result<ReadLease> HostTier::Acquire(const std::string& model, uint64_t version) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  VIPER_RETURN_IF_ERROR(ValidateVersion(version).WithContext("model " + model));
  HostPool& pool = *impl_->pool;
  std::lock_guard<std::mutex> lock(pool.mu);
  auto mit = pool.committed.find(model);
  auto vit = mit == pool.committed.end() ? decltype(mit->second.end()){} : mit->second.find(version);
  if (mit == pool.committed.end() || vit == mit->second.end()) {
    return Status::NotFound(fmt::format("host tier: model {} version {} is not held (versions held: {})", model,
                                        version, JoinVersions(mit == pool.committed.end() ? nullptr : &mit->second)));
  }
  Segment& seg = pool.segments.at(vit->second);
  ++seg.leases;
  auto token = std::make_shared<LeaseToken>();
  token->pool = impl_->pool;
  token->map = seg.map;
  token->id = vit->second;
  ReadLease lease;
  lease.data_ = std::span<const std::byte>(seg.map->base, seg.size);
  lease.hold_ = std::move(token);
  lease.name_ = seg.map->name;
  lease.model_ = model;
  lease.version_ = version;
  return lease;
}

std::optional<uint64_t> HostTier::latest(const std::string& model) const {
  std::lock_guard<std::mutex> lock(impl_->pool->mu);
  auto it = impl_->pool->committed.find(model);
  if (it == impl_->pool->committed.end() || it->second.empty()) return std::nullopt;
  return it->second.rbegin()->first;
}

std::vector<uint64_t> HostTier::versions(const std::string& model) const {
  std::lock_guard<std::mutex> lock(impl_->pool->mu);
  std::vector<uint64_t> out;
  auto it = impl_->pool->committed.find(model);
  if (it != impl_->pool->committed.end()) {
    for (const auto& [v, id] : it->second) out.push_back(v);
  }
  return out;
}

std::vector<std::string> HostTier::models() const {
  std::lock_guard<std::mutex> lock(impl_->pool->mu);
  std::vector<std::string> out;
  for (const auto& [model, versions] : impl_->pool->committed) {
    if (!versions.empty()) out.push_back(model);
  }
  return out;
}

HostTierStats HostTier::stats() const {
  std::lock_guard<std::mutex> lock(impl_->pool->mu);
  HostTierStats s;
  for (const auto& [id, seg] : impl_->pool->segments) {
    s.mapped_bytes += seg.map->capacity;
    switch (seg.state) {
      case SegState::kWriting: ++s.writing_segments; break;
      case SegState::kCommitted: ++s.committed_segments; break;
      case SegState::kRetiredLeased: ++s.retired_leased_segments; break;
      case SegState::kFree: ++s.free_segments; break;
    }
  }
  s.recycled_allocations = impl_->pool->recycled_allocations;
  s.fresh_allocations = impl_->pool->fresh_allocations;
  s.spare_segments = impl_->pool->spare_segments;
  return s;
}

}  // namespace viper
