// FileTier: atomic safetensors files with recovery. See src/store/file_tier.h for the contract.
#include "store/file_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "core/fd.h"
#include "store_util.h"
#include "viper/log.h"

namespace viper {
namespace {

namespace fs = std::filesystem;
using store_internal::FormatBytes;

constexpr std::string_view kLog = "file_tier";
constexpr std::string_view kSuffix = ".safetensors";
constexpr std::string_view kTempMarker = ".safetensors.tmp.";
constexpr std::string_view kLockName = ".viper.lock";  // not a valid model name: never scanned
// Sequential I/O unit: large enough that syscall overhead vanishes, small enough to stay well
// under the kernel's 2 GiB per-call limit.
constexpr uint64_t kReadChunk = 8ull << 20;
constexpr uint64_t kWriteChunk = 64ull << 20;

std::atomic<uint64_t> g_temp_seq{0};

// Every path below the store is opened relative to a descriptor of the store directory, one
// component at a time and O_NOFOLLOW: a model directory or a version file that is a symbolic link
// is refused, never written, read or deleted through.

// The model directory `model` under `store_fd` (shown as `dir`), opened O_NOFOLLOW; created 0700
// first with `create` (the store directory is then fsynced when `sync`, so that it survives a crash).
Result<Fd> OpenModelDir(int store_fd, const fs::path& store, const std::string& model, bool create, bool sync) {
  const fs::path dir = store / model;
  if (create) {
    if (::mkdirat(store_fd, model.c_str(), 0700) == 0) {
      if (sync && ::fsync(store_fd) != 0) return Status::FromErrno(fmt::format("fsync of directory {}", store.string()));
    } else if (errno != EEXIST) {
      return Status::FromErrno(fmt::format("cannot create directory {}", dir.string()));
    }
  }
  Fd fd(::openat(store_fd, model.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() >= 0) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(fmt::format("cannot stat directory {}", dir.string()));
    if (st.st_uid != ::geteuid()) {
      return Status::PermissionDenied(fmt::format(
          "model directory {} is owned by uid {}, not by this process's uid {}: the file tier neither serves nor "
          "writes another user's directory (move it out of the store)",
          dir.string(), st.st_uid, ::geteuid()));
    }
    return fd;
  }
  struct stat st {};
  // O_DIRECTORY | O_NOFOLLOW on a link fails with ENOTDIR (or ELOOP): which one it is, lstat says.
  if ((errno == ELOOP || errno == ENOTDIR) && ::fstatat(store_fd, model.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISLNK(st.st_mode)) {
    errno = ELOOP;
  }
  if (errno == ELOOP) {
    return Status::InvalidArgument(fmt::format(
        "file tier: model directory {} is a symbolic link; the file tier writes, reads and deletes only in real "
        "directories of its store (replace the link with a directory)",
        dir.string()));
  }
  if (errno == ENOTDIR) return Status::InvalidArgument(fmt::format("{} exists but is not a directory", dir.string()));
  return Status::FromErrno(fmt::format("cannot open directory {}", dir.string()));
}

// The regular file `name` in `dir_fd`, opened read-only with O_NOFOLLOW; InvalidArgument for a
// link or anything but a regular file.
Result<Fd> OpenRegular(int dir_fd, const std::string& name, const fs::path& path, struct stat* st) {
  Fd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0 && errno == ELOOP) return Status::InvalidArgument(fmt::format("{} is a symbolic link", path.string()));
  if (fd.get() < 0) return Status::FromErrno(fmt::format("cannot open {}", path.string()));
  if (::fstat(fd.get(), st) != 0) return Status::FromErrno(fmt::format("cannot stat {}", path.string()));
  if (!S_ISREG(st->st_mode)) return Status::InvalidArgument(fmt::format("{} is not a regular file", path.string()));
  if (st->st_uid != ::geteuid()) {
    return Status::PermissionDenied(fmt::format(
        "{} is owned by uid {}, not by this process's uid {}: another user's file is never served (move it out of "
        "the store)",
        path.string(), st->st_uid, ::geteuid()));
  }
  return fd;
}

// Snapshot::OpenFile, through the directory descriptor (O_NOFOLLOW): the file mapped read-only.
Result<Snapshot> OpenVersionFile(int dir_fd, const std::string& name, const fs::path& path, const ParseOptions& options) {
  struct stat st {};
  VIPER_ASSIGN_OR_RETURN(Fd fd, OpenRegular(dir_fd, name, path, &st));
  const size_t size = static_cast<size_t>(st.st_size);
  std::shared_ptr<const void> owner;
  if (size > 0) {
    void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (addr == MAP_FAILED) return Status::FromErrno(fmt::format("{}: mmap of {} failed", path.string(), FormatBytes(size)));
    owner = std::shared_ptr<const void>(addr, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  }
  std::span<const std::byte> view(static_cast<const std::byte*>(owner.get()), size);
  auto snapshot = Snapshot::Parse(view, std::move(owner), options);
  if (!snapshot.ok()) return snapshot.status().WithContext(path.string());
  return snapshot;
}

std::string VersionFileName(uint64_t version) { return std::to_string(version) + std::string(kSuffix); }

// renameat that never replaces `to` (EEXIST if it exists): renameat2(RENAME_NOREPLACE), or, where
// the file system does not support it (EINVAL, e.g. NFS), link then unlink, which also fails with
// EEXIST. 0 or -1 with errno.
int RenameNoReplace(int dir_fd, const char* from, const char* to) {
  constexpr unsigned kNoReplace = 1;  // RENAME_NOREPLACE (linux/fs.h); the syscall needs no glibc wrapper
  if (::syscall(SYS_renameat2, dir_fd, from, dir_fd, to, kNoReplace) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  if (::linkat(dir_fd, from, dir_fd, to, 0) != 0) return -1;
  ::unlinkat(dir_fd, from, 0);
  return 0;
}

// Writes all of `bytes` at the current offset, in large chunks straight from the caller's buffer.
// With `start_writeback`, each chunk's writeback to the device starts as soon as the chunk is in
// the page cache (sync_file_range, asynchronous), so that copying the next chunk overlaps with
// the device writing this one and the final fsync has little left to do.
Status WriteAll(int fd, std::span<const std::byte> bytes, const fs::path& path, bool start_writeback) {
  uint64_t done = 0;
  while (done < bytes.size()) {
    uint64_t n = std::min<uint64_t>(kWriteChunk, bytes.size() - done);
    ssize_t w = ::write(fd, bytes.data() + done, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return Status::FromErrno(fmt::format("writing {} to {} failed after {}", FormatBytes(bytes.size()),
                                           path.string(), FormatBytes(done)),
                               w < 0 ? errno : EIO);
    }
    if (start_writeback) {
      // Only a hint: errors (e.g. a file system without it) surface at fsync, which always runs.
      (void)::sync_file_range(fd, static_cast<off_t>(done), w, SYNC_FILE_RANGE_WRITE);
    }
    done += static_cast<uint64_t>(w);
  }
  return Status::OK();
}

// A temporary file's name parts: <version>.safetensors.tmp.<pid>.<seq>.<host>.
struct TempName {
  uint64_t pid = 0;
  std::string host;
};

std::optional<TempName> ParseTempName(std::string_view name) {
  size_t at = name.find(kTempMarker);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = name.substr(at + kTempMarker.size());
  size_t d1 = rest.find('.');
  size_t d2 = d1 == std::string_view::npos ? d1 : rest.find('.', d1 + 1);
  TempName out;
  if (d2 == std::string_view::npos) return out;  // not ours or mangled: age decides
  out.pid = store_internal::ParseDecimal(rest.substr(0, d1)).value_or(0);
  out.host = std::string(rest.substr(d2 + 1));
  return out;
}

// Checks a file found on disk (or being indexed) and returns its entry; never serves bad bytes.
Result<FileEntry> ValidateFile(int dir_fd, const fs::path& path, const std::string& model, uint64_t version,
                               bool verify) {
  ParseOptions opts;
  opts.verify_checksum = verify;
  opts.require_checksum = true;
  VIPER_ASSIGN_OR_RETURN(Snapshot snap, OpenVersionFile(dir_fd, VersionFileName(version), path, opts));
  auto declared = snap.declared_checksum();
  if (!declared) return Status::Corruption(fmt::format("{}: has no {}", path.string(), kMetaChecksum));
  if (auto m = snap.model(); m && *m != model) {
    return Status::Corruption(fmt::format("{}: {} is '{}', not '{}' as its directory says", path.string(),
                                          kMetaModel, *m, model));
  }
  if (auto v = snap.version(); v && *v != version) {
    return Status::Corruption(fmt::format("{}: {} is {}, not {} as its name says", path.string(), kMetaVersion,
                                          *v, version));
  }
  FileEntry e;
  e.model = model;
  e.version = version;
  e.size = snap.bytes().size();
  e.checksum = *declared;
  e.path = path;
  return e;
}

// Creates `dir` and each missing parent with mode 0700, chmod'ed after mkdir so that neither the
// umask nor its absence decides: a parent other users could write would let them swap the store.
Status CreateDirs(const fs::path& dir) {
  fs::path at;
  for (const fs::path& part : dir) {
    at /= part;
    struct stat st {};
    if (::lstat(at.c_str(), &st) == 0) continue;
    if (errno != ENOENT) return Status::FromErrno(fmt::format("file tier: cannot create {}: stat of {}", dir.string(), at.string()));
    if (::mkdir(at.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::FromErrno(fmt::format("file tier: cannot create {}", at.string()));
    }
    if (::chmod(at.c_str(), 0700) != 0) return Status::FromErrno(fmt::format("file tier: chmod 0700 {}", at.string()));
  }
  return Status::OK();
}

// The store directory, created 0700 if missing, and refused unless this process's effective uid
// owns it and neither group nor others may write it: whoever can write the store can plant
// versions that the node seals with the fleet token and serves, or delete and swap its files. It
// is opened O_NOFOLLOW, but for a link that root or this uid owns (systemd's StateDirectory with
// DynamicUser is /var/lib/<name> -> private/<name>): the checks then apply to its target.
Result<Fd> OpenStoreDir(const fs::path& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return Status::FromErrno(fmt::format("file tier: cannot stat {}", dir.string()));
    VIPER_RETURN_IF_ERROR(CreateDirs(dir));
    if (::lstat(dir.c_str(), &st) != 0) return Status::FromErrno(fmt::format("file tier: cannot stat {}", dir.string()));
  }
  const bool trusted_link = S_ISLNK(st.st_mode) && (st.st_uid == ::geteuid() || st.st_uid == 0);
  if (S_ISLNK(st.st_mode) && !trusted_link) {
    return Status::PermissionDenied(fmt::format(
        "file tier: store directory {} is a symbolic link owned by uid {} (neither this process's uid {} nor root), "
        "who could point it elsewhere; give the directory itself",
        dir.string(), st.st_uid, ::geteuid()));
  }
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (trusted_link ? 0 : O_NOFOLLOW)));
  if (fd.get() < 0) {
    if (errno == ELOOP) {
      return Status::PermissionDenied(fmt::format("file tier: store directory {} is a symbolic link; give the "
                                                  "directory itself", dir.string()));
    }
    if (errno == ENOTDIR) return Status::InvalidArgument(fmt::format("file tier: {} is not a directory", dir.string()));
    return Status::FromErrno(fmt::format("file tier: cannot open directory {}", dir.string()));
  }
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(fmt::format("file tier: cannot stat {}", dir.string()));
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    return Status::PermissionDenied(fmt::format(
        "file tier: store directory {} is owned by uid {} with mode {:04o}; a store must be owned by this process's "
        "uid {} and not writable by group or others, or another local user could plant, replace or delete versions "
        "that this node then seals and serves. Use a directory of your own (e.g. $HOME/viper-store or "
        "/var/lib/viper), or, if it is yours: chown {} {} && chmod 0700 {}",
        dir.string(), st.st_uid, st.st_mode & 07777, ::geteuid(), ::geteuid(), dir.string(), dir.string()));
  }
  return fd;
}

using Index = std::map<std::string, std::map<uint64_t, FileEntry>>;

std::string ListVersions(const Index& index, const std::string& model) {
  auto it = index.find(model);
  if (it == index.end() || it->second.empty()) return "none";
  std::string out;
  for (const auto& [v, e] : it->second) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

}  // namespace

struct FileTier::Impl {
  explicit Impl(const FileTierOptions& o) : options(o) {}

  const FileTierOptions options;
  Fd store;  // the store directory (options.dir), opened at Open
  const std::string host = store_internal::HostName();
  mutable std::mutex mu;
  Index index;                                         // guarded by mu
  // Per model, the highest version whose <version>.safetensors name this instance has seen on disk
  // (files skipped at a scan included) or written; guarded by mu. Never lowered.
  std::map<std::string, uint64_t> named;
  Fd lock_file;  // <dir>/.viper.lock, flock'ed exclusively for the tier's life
  std::set<std::pair<std::string, uint64_t>> writing;  // guarded by mu

  fs::path PathFor(const std::string& model, uint64_t version) const {
    return options.dir / model / (std::to_string(version) + std::string(kSuffix));
  }
  void ScanModel(const std::string& model, Index* index, std::map<std::string, uint64_t>* named) const;
  Status Lock();
  void HandleTemp(int dir_fd, const std::string& name, const fs::path& path) const;
  // The declared checksum of `bytes` if they may be written as (model, version).
  Result<uint64_t> CheckWritable(const std::string& model, uint64_t version, std::span<const std::byte> bytes) const;
  Result<FileEntry> WriteFile(const std::string& model, uint64_t version, std::span<const std::byte> bytes,
                              uint64_t checksum) const;
  // The indexed entry, or (not indexed) the file on disk checked at header level; `indexed`
  // says which. A file found on disk joins the index only once a read has verified it.
  Result<FileEntry> Lookup(const std::string& model, uint64_t version, bool* indexed) const;
  Result<Fd> OpenDir(const std::string& model, bool create) const {
    return OpenModelDir(store.get(), options.dir, model, create, options.fsync);
  }
  void AddVerified(const FileEntry& e);
};

FileTier::FileTier(const FileTierOptions& options) : options_(options), impl_(std::make_shared<Impl>(options)) {}

Result<std::unique_ptr<FileTier>> FileTier::Open(const FileTierOptions& options) {
  if (options.dir.empty()) return Status::InvalidArgument("file tier: no directory given");
  if (options.keep_versions < 1) return Status::InvalidArgument("file tier keep_versions must be >= 1");
  if ((options.file_mode & ~static_cast<mode_t>(0777)) != 0 || (options.file_mode & 0600) != 0600) {
    return Status::InvalidArgument(fmt::format(
        "file tier file_mode {:o} must be permission bits (<= 0777) that include owner read-write (0600)",
        options.file_mode));
  }
  std::unique_ptr<FileTier> tier(new FileTier(options));
  VIPER_ASSIGN_OR_RETURN(tier->impl_->store, OpenStoreDir(options.dir));
  VIPER_RETURN_IF_ERROR(tier->impl_->Lock());
  VIPER_RETURN_IF_ERROR(tier->Rescan());
  return tier;
}

// One writer per store: two would number versions independently and write over each other's
// files. flock(LOCK_EX) on <dir>/.viper.lock, held until the tier is destroyed (or its process
// dies); the holder writes its pid and host into the file for the next one's error message.
Status FileTier::Impl::Lock() {
  const fs::path path = options.dir / kLockName;
  Fd fd(::openat(store.get(), std::string(kLockName).c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) return Status::FromErrno(fmt::format("file tier: cannot open lock file {}", path.string()));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return Status::FromErrno(fmt::format("file tier: cannot lock {}", path.string()));
    char buf[256] = {};
    ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
    std::string holder(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return Status::FailedPrecondition(fmt::format(
        "file tier: store directory {} is in use by another node ({}; {} is locked); two nodes on one store would "
        "number versions independently and overwrite each other's files: stop that node, or give this one its own "
        "store directory",
        options.dir.string(), holder.empty() ? "holder unknown" : holder, path.string()));
  }
  const std::string me = fmt::format("pid {} on host {}\n", ::getpid(), host);
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    log(LogLevel::kWarn, kLog, "cannot write the holder into {}: {}", path.string(), std::strerror(errno));
  }
  lock_file = std::move(fd);
  return Status::OK();
}

fs::path FileTier::PathFor(const std::string& model, uint64_t version) const {
  return impl_->PathFor(model, version);
}

Status FileTier::Rescan() {
  Index index;
  int listing = ::dup(impl_->store.get());
  DIR* dir = listing < 0 ? nullptr : ::fdopendir(listing);
  if (dir == nullptr) {
    Status st = Status::FromErrno(fmt::format("file tier: cannot list {}", options_.dir.string()));
    if (listing >= 0) ::close(listing);
    return st;
  }
  ::rewinddir(dir);
  std::vector<std::string> models;
  while (const dirent* entry = ::readdir(dir)) {
    std::string name(entry->d_name);
    if (name == "." || name == "..") continue;
    struct stat st {};
    bool is_dir = ::fstatat(::dirfd(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    if (ValidateModelName(name).ok() && S_ISLNK(st.st_mode)) {
      log(LogLevel::kWarn, kLog, "not serving {}: a model directory that is a symbolic link is never followed",
          (options_.dir / name).string());
      continue;
    }
    if (!ValidateModelName(name).ok() || !is_dir) {
      log(LogLevel::kDebug, kLog, "ignoring {}: not a model directory", (options_.dir / name).string());
      continue;
    }
    models.push_back(std::move(name));
  }
  ::closedir(dir);
  std::map<std::string, uint64_t> named;
  for (const std::string& model : models) impl_->ScanModel(model, &index, &named);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->index = std::move(index);
  for (const auto& [model, version] : named) impl_->named[model] = std::max(impl_->named[model], version);
  return Status::OK();
}

void FileTier::Impl::ScanModel(const std::string& model, Index* index, std::map<std::string, uint64_t>* named) const {
  const fs::path dir = options.dir / model;
  auto dir_fd = OpenModelDir(store.get(), options.dir, model, /*create=*/false, /*sync=*/false);
  if (!dir_fd.ok()) {
    log(LogLevel::kWarn, kLog, "not serving {}: {}", dir.string(), dir_fd.status().message());
    return;
  }
  int listing = ::dup(dir_fd->get());
  DIR* entries = listing < 0 ? nullptr : ::fdopendir(listing);
  if (entries == nullptr) {
    log(LogLevel::kWarn, kLog, "cannot list {}: {}", dir.string(), std::strerror(errno));
    if (listing >= 0) ::close(listing);
    return;
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(entries)) names.emplace_back(entry->d_name);
  ::closedir(entries);
  for (const std::string& name : names) {
    const fs::path path = dir / name;
    if (name == "." || name == "..") continue;
    if (name.find(kTempMarker) != std::string::npos) {
      HandleTemp(dir_fd->get(), name, path);
      continue;
    }
    if (!name.ends_with(kSuffix)) continue;
    auto version = store_internal::ParseDecimal(std::string_view(name).substr(0, name.size() - kSuffix.size()));
    if (!version || *version == 0) {
      log(LogLevel::kWarn, kLog, "skipping {}: not <version>.safetensors with a canonical version >= 1",
          path.string());
      continue;
    }
    // Counted whether or not the file is served: its number is never handed out again.
    (*named)[model] = std::max((*named)[model], *version);
    auto file = ValidateFile(dir_fd->get(), path, model, *version, options.verify_on_open);
    if (!file.ok()) {
      // The status message starts with the path.
      log(LogLevel::kWarn, kLog, "not serving {}", file.status().message());
      continue;
    }
    (*index)[model][*version] = *std::move(file);
  }
}

// A temporary file is a write in progress or a crashed writer's leftover. Remove it only when
// its writer is surely gone: same host and pid dead, or not modified for stale_temp_age.
void FileTier::Impl::HandleTemp(int dir_fd, const std::string& name, const fs::path& path) const {
  auto temp = ParseTempName(name);
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;  // renamed or removed meanwhile
  if (!S_ISREG(st.st_mode)) {
    log(LogLevel::kWarn, kLog, "leaving {} alone: named like a temporary file but not a regular file", path.string());
    return;
  }
  auto age = std::chrono::system_clock::now() - std::chrono::system_clock::from_time_t(st.st_mtime);
  bool ours = temp && temp->host == host && temp->pid != 0;
  bool dead = ours && static_cast<int64_t>(temp->pid) != ::getpid() &&
              !store_internal::ProcessAlive(static_cast<int64_t>(temp->pid));
  if (dead || age > options.stale_temp_age) {
    log(LogLevel::kWarn, kLog, "removing {}: leftover of an interrupted write ({}); never served", path.string(),
        dead ? fmt::format("writer pid {} is dead", temp->pid) : "not modified for a long time");
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      log(LogLevel::kWarn, kLog, "cannot remove {}: {}", path.string(), std::strerror(errno));
    }
    return;
  }
  log(LogLevel::kWarn, kLog, "skipping {}: a write in progress (or interrupted); never served", path.string());
}

Status FileTier::Write(const std::string& model, uint64_t version, std::span<const std::byte> bytes) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  VIPER_RETURN_IF_ERROR(ValidateVersion(version).WithContext("model " + model));
  VIPER_ASSIGN_OR_RETURN(uint64_t checksum, impl_->CheckWritable(model, version, bytes));
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->index.find(model);
    if (it != impl_->index.end() && it->second.contains(version)) {
      return Status::AlreadyExists(fmt::format("file tier: model {} version {} is already stored at {}", model,
                                               version, it->second.at(version).path.string()));
    }
    if (!impl_->writing.emplace(model, version).second) {
      return Status::AlreadyExists(fmt::format("file tier: model {} version {} is being written", model, version));
    }
  }
  auto written = impl_->WriteFile(model, version, bytes, checksum);
  std::vector<uint64_t> victims;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->writing.erase({model, version});
    if (written.ok() || written.status().code() == StatusCode::kAlreadyExists) {
      impl_->named[model] = std::max(impl_->named[model], version);
    }
    if (!written.ok()) return written.status();
    auto& versions = impl_->index[model];
    versions[version] = *std::move(written);
    while (versions.size() > options_.keep_versions) {
      victims.push_back(versions.begin()->first);
      versions.erase(versions.begin());
    }
  }
  if (victims.empty()) return Status::OK();
  // Retention deletes only what the tier writes: regular files named <version>.safetensors in the
  // model's real directory (never a link, never through one).
  auto dir_fd = impl_->OpenDir(model, /*create=*/false);
  if (!dir_fd.ok()) {
    log(LogLevel::kWarn, kLog, "retention: {}", dir_fd.status().message());
    return Status::OK();
  }
  for (uint64_t victim : victims) {
    const std::string name = VersionFileName(victim);
    const fs::path path = options_.dir / model / name;
    struct stat st {};
    if (::fstatat(dir_fd->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone already
    if (!S_ISREG(st.st_mode)) {
      log(LogLevel::kWarn, kLog, "retention: leaving {} alone: not a regular file", path.string());
      continue;
    }
    log(LogLevel::kDebug, kLog, "retention: removing {}", path.string());
    if (::unlinkat(dir_fd->get(), name.c_str(), 0) != 0 && errno != ENOENT) {
      log(LogLevel::kWarn, kLog, "retention: cannot remove {}: {}", path.string(), std::strerror(errno));
    }
  }
  return Status::OK();
}

// The bytes must be a sealed snapshot of this (model, version): a file the tier would refuse to
// serve after a restart must not be written in the first place. O(header); no checksum pass.
Result<uint64_t> FileTier::Impl::CheckWritable(const std::string& model, uint64_t version,
                                               std::span<const std::byte> bytes) const {
  auto what = fmt::format("file tier: writing model {} version {}", model, version);
  auto snap = Snapshot::Parse(bytes, nullptr);
  if (!snap.ok()) return Status::InvalidArgument(fmt::format("{}: not a valid snapshot: {}", what, snap.status().message()));
  if (!snap->declared_checksum()) {
    return Status::InvalidArgument(fmt::format("{}: the snapshot has no {} (seal it first)", what, kMetaChecksum));
  }
  if (auto m = snap->model(); m && *m != model) {
    return Status::InvalidArgument(fmt::format("{}: the snapshot says {} = '{}'", what, kMetaModel, *m));
  }
  if (auto v = snap->version(); v && *v != version) {
    return Status::InvalidArgument(fmt::format("{}: the snapshot says {} = {}", what, kMetaVersion, *v));
  }
  return *snap->declared_checksum();
}

// tmp file, write from the caller's buffer, fsync, rename, fsync the directory.
Result<FileEntry> FileTier::Impl::WriteFile(const std::string& model, uint64_t version,
                                            std::span<const std::byte> bytes, uint64_t checksum) const {
  const fs::path dir = options.dir / model;
  VIPER_ASSIGN_OR_RETURN(Fd dir_fd, OpenDir(model, /*create=*/true));
  const fs::path final_path = PathFor(model, version);
  const std::string tmp_name = fmt::format("{}{}{}.{}.{}", version, kTempMarker, ::getpid(), ++g_temp_seq, host);
  const fs::path tmp = dir / tmp_name;
  Fd fd(::openat(dir_fd.get(), tmp_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                 options.file_mode));
  if (fd.get() < 0) return Status::FromErrno(fmt::format("file tier: cannot create {}", tmp.string()));
  auto fail = [&](Status st) {
    ::unlinkat(dir_fd.get(), tmp_name.c_str(), 0);
    return st;
  };
  if (::fchmod(fd.get(), options.file_mode) != 0) {
    return fail(Status::FromErrno(fmt::format("file tier: fchmod {:o} of {}", options.file_mode, tmp.string())));
  }
  Status st = WriteAll(fd.get(), bytes, tmp, options.fsync);
  if (!st.ok()) return fail(st);
  if (options.fsync && ::fsync(fd.get()) != 0) {
    return fail(Status::FromErrno(fmt::format("file tier: fsync of {} ({})", tmp.string(), FormatBytes(bytes.size()))));
  }
  if (fd.Close() != 0) return fail(Status::FromErrno(fmt::format("file tier: close of {}", tmp.string())));
  if (RenameNoReplace(dir_fd.get(), tmp_name.c_str(), VersionFileName(version).c_str()) != 0) {
    if (errno == EEXIST) {
      return fail(Status::AlreadyExists(fmt::format(
          "file tier: {} already exists but is not indexed (it failed validation at start-up, or another process "
          "wrote it); versions are immutable, so model {} version {} is not written over it (move the file away "
          "if it is not wanted)",
          final_path.string(), model, version)));
    }
    return fail(Status::FromErrno(fmt::format("file tier: rename {} -> {}", tmp.string(), final_path.string())));
  }
  if (options.fsync && ::fsync(dir_fd.get()) != 0) {
    return Status::FromErrno(fmt::format("fsync of directory {}", dir.string()));
  }
  FileEntry e;
  e.model = model;
  e.version = version;
  e.size = bytes.size();
  e.checksum = checksum;
  e.path = final_path;
  return e;
}

Result<FileEntry> FileTier::Impl::Lookup(const std::string& model, uint64_t version, bool* indexed) const {
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  VIPER_RETURN_IF_ERROR(ValidateVersion(version).WithContext("model " + model));
  std::string have;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = index.find(model);
    if (it != index.end()) {
      auto vit = it->second.find(version);
      if (vit != it->second.end()) {
        *indexed = true;
        return vit->second;
      }
    }
    have = ListVersions(index, model);
  }
  // Not indexed: another process sharing the directory may have written it since Open().
  const fs::path path = PathFor(model, version);
  auto dir_fd = OpenDir(model, /*create=*/false);
  struct stat st {};
  if (dir_fd.ok() && ::fstatat(dir_fd->get(), VersionFileName(version).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    dir_fd = Status::NotFound("");
  }
  if (!dir_fd.ok() && dir_fd.status().code() != StatusCode::kInvalidArgument) {
    return Status::NotFound(fmt::format("file tier {}: model {} version {} is not stored (versions: {})",
                                        options.dir.string(), model, version, have));
  }
  if (!dir_fd.ok()) return dir_fd.status();  // a link or not a directory: say so
  *indexed = false;
  return ValidateFile(dir_fd->get(), path, model, version, /*verify=*/false);
}

void FileTier::Impl::AddVerified(const FileEntry& e) {
  std::lock_guard<std::mutex> lock(mu);
  index[e.model].emplace(e.version, e);
}

Result<Snapshot> FileTier::Read(const std::string& model, uint64_t version) const {
  bool indexed = false;
  VIPER_ASSIGN_OR_RETURN(FileEntry e, impl_->Lookup(model, version, &indexed));
  ParseOptions opts;
  opts.verify_checksum = true;
  opts.require_checksum = true;
  VIPER_ASSIGN_OR_RETURN(Fd dir_fd, impl_->OpenDir(model, /*create=*/false));
  auto snap = OpenVersionFile(dir_fd.get(), VersionFileName(version), e.path, opts);
  if (snap.ok() && !indexed) impl_->AddVerified(e);
  return snap;
}

Result<uint64_t> FileTier::ReadInto(const std::string& model, uint64_t version, std::span<std::byte> dst) const {
  bool indexed = false;
  VIPER_ASSIGN_OR_RETURN(FileEntry e, impl_->Lookup(model, version, &indexed));
  VIPER_ASSIGN_OR_RETURN(Fd dir_fd, impl_->OpenDir(model, /*create=*/false));
  struct stat st {};
  auto opened = OpenRegular(dir_fd.get(), VersionFileName(version), e.path, &st);
  if (!opened.ok()) return opened.status().WithContext("file tier");
  Fd fd = *std::move(opened);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (dst.size() < size) {
    return Status::InvalidArgument(fmt::format("file tier: {} is {} but the destination holds only {}",
                                               e.path.string(), FormatBytes(size), FormatBytes(dst.size())));
  }
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  uint64_t done = 0;
  while (done < size) {
    ssize_t r = ::read(fd.get(), dst.data() + done, std::min<uint64_t>(kReadChunk, size - done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(fmt::format("file tier: reading {} failed after {}", e.path.string(), FormatBytes(done)));
    if (r == 0) {
      return Status::Corruption(fmt::format("file tier: {} ended after {} of {}", e.path.string(), FormatBytes(done),
                                            FormatBytes(size)));
    }
    done += static_cast<uint64_t>(r);
  }
  ParseOptions opts;
  opts.verify_checksum = true;
  opts.require_checksum = true;
  auto snap = Snapshot::Parse(dst.first(size), nullptr, opts);
  if (!snap.ok()) return snap.status().WithContext("file tier: " + e.path.string());
  if (!indexed) impl_->AddVerified(e);
  return size;
}

std::optional<FileEntry> FileTier::Find(const std::string& model, uint64_t version) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->index.find(model);
  if (it == impl_->index.end()) return std::nullopt;
  auto vit = it->second.find(version);
  if (vit == it->second.end()) return std::nullopt;
  return vit->second;
}

std::optional<FileEntry> FileTier::Latest(const std::string& model) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->index.find(model);
  if (it == impl_->index.end() || it->second.empty()) return std::nullopt;
  return it->second.rbegin()->second;
}

uint64_t FileTier::HighestVersionNamed(const std::string& model) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->named.find(model);
  return it == impl_->named.end() ? 0 : it->second;
}

std::vector<uint64_t> FileTier::versions(const std::string& model) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<uint64_t> out;
  auto it = impl_->index.find(model);
  if (it == impl_->index.end()) return out;
  out.reserve(it->second.size());
  for (const auto& [v, e] : it->second) out.push_back(v);
  return out;
}

std::vector<FileEntry> FileTier::List() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<FileEntry> out;
  for (const auto& [model, versions] : impl_->index) {
    for (const auto& [v, e] : versions) out.push_back(e);
  }
  return out;
}

}  // namespace viper
