// The two SampleSource backends: a directory tree of files and a record file.
// Contract: include/viper/sample_source.h.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <system_error>

#include <fmt/format.h>

#include "core/fd.h"
#include "data_util.h"
#include "viper/sample_source.h"

namespace viper {
namespace {

namespace fs = std::filesystem;

class DirectorySource final : public SampleSource {
 public:
  struct File {
    std::string path;
    uint64_t bytes;
    int64_t label;
  };
  DirectorySource(DirectorySourceOptions options, std::vector<File> files, std::vector<std::string> classes)
      : options_(std::move(options)), files_(std::move(files)), classes_(std::move(classes)) {}

  uint64_t size() const override { return files_.size(); }
  uint64_t bytes(uint64_t id) const override { return files_[id].bytes; }
  int64_t label(uint64_t id) const override { return files_[id].label; }
  std::vector<std::string> class_names() const override { return classes_; }
  std::string Describe(uint64_t id) const override { return fmt::format("sample {} ({})", id, files_[id].path); }

  Status Check(uint64_t id) const override { return CheckSize(id, files_[id].bytes, "at the scan"); }

  Status ReadInto(uint64_t id, std::span<std::byte> dst) const override {
    const File& f = files_[id];
    struct stat st {};
    auto fd = OpenRegularFile(f.path, &st);  // a file replaced by a FIFO since the scan is refused, not waited on
    if (!fd.ok() && fd.status().code() == StatusCode::kInvalidArgument)
      return Status::Corruption(fmt::format("{}: no longer a regular file", Describe(id)));
    if (!fd.ok()) return fd.status().WithContext(Describe(id));
    uint64_t now = static_cast<uint64_t>(st.st_size);
    if (now != f.bytes) {
      return Status::Corruption(fmt::format("{}: {}: the file is {} bytes now, {} at the scan", Describe(id),
                                            now < f.bytes ? "truncated" : "grew", now, f.bytes));
    }
    Status read = data_internal::PreadAll(fd->get(), dst, 0);
    return read.WithContext(Describe(id));
  }

 private:
  Status CheckSize(uint64_t id, uint64_t bytes, const char* when) const {
    if (options_.sample_bytes != 0 && bytes != options_.sample_bytes) {
      return Status::Corruption(fmt::format("{}: {} bytes {}, expected {} (DirectorySourceOptions.sample_bytes)",
                                            Describe(id), bytes, when, options_.sample_bytes));
    }
    if (bytes > options_.max_sample_bytes) {
      return Status::Corruption(fmt::format("{}: {} bytes, more than the limit of {} (DirectorySourceOptions.max_sample_bytes)",
                                            Describe(id), bytes, options_.max_sample_bytes));
    }
    return Status::OK();
  }

  DirectorySourceOptions options_;
  std::vector<File> files_;
  std::vector<std::string> classes_;
};

bool Hidden(const fs::path& p) { return p.filename().string().starts_with("."); }

bool Wanted(const fs::path& p, const DirectorySourceOptions& o) {
  if (o.skip_hidden && Hidden(p)) return false;
  if (o.extensions.empty()) return true;
  std::string name = p.filename().string();
  return std::any_of(o.extensions.begin(), o.extensions.end(), [&](const std::string& e) { return name.ends_with(e); });
}

// Every wanted regular file under options.dir, sorted, with its size (no symlinks followed).
Result<std::vector<DirectorySource::File>> Scan(const DirectorySourceOptions& o) {
  std::error_code ec;
  fs::recursive_directory_iterator it(o.dir, fs::directory_options::none, ec);
  if (ec) return Status::FromErrno(fmt::format("data directory {}: cannot list", o.dir.string()), ec.value());
  std::vector<DirectorySource::File> files;
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(st)) {
      if (o.skip_hidden && Hidden(it->path())) it.disable_recursion_pending();
      continue;
    }
    if (!fs::is_regular_file(st) || !Wanted(it->path(), o)) continue;
    uint64_t size = it->file_size(ec);
    if (ec) break;
    files.push_back({it->path().string(), size, -1});
  }
  if (ec) return Status::FromErrno(fmt::format("data directory {}: scan failed", o.dir.string()), ec.value());
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return files;
}

// ImageFolder labels: the sorted names of the top-level subdirectories that hold samples.
std::vector<std::string> LabelByTopDirectory(const fs::path& dir, std::vector<DirectorySource::File>& files) {
  std::map<std::string, int64_t> classes;
  auto top = [&](const std::string& path) -> std::optional<std::string> {
    fs::path rel = fs::path(path).lexically_relative(dir);
    if (std::distance(rel.begin(), rel.end()) < 2) return std::nullopt;  // directly in dir
    return rel.begin()->string();
  };
  for (const auto& f : files) {
    if (auto t = top(f.path)) classes.emplace(*t, 0);
  }
  std::vector<std::string> names;
  for (auto& [name, label] : classes) {
    label = static_cast<int64_t>(names.size());
    names.push_back(name);
  }
  for (auto& f : files) {
    if (auto t = top(f.path)) f.label = classes[*t];
  }
  return names;
}

class RecordSource final : public SampleSource {
 public:
  explicit RecordSource(RecordFile file) : file_(std::move(file)) {}
  uint64_t size() const override { return file_.size(); }
  uint64_t bytes(uint64_t id) const override { return file_.entry(id).length; }
  int64_t label(uint64_t id) const override { return file_.entry(id).label; }
  std::string Describe(uint64_t id) const override { return fmt::format("sample {} ({} record {})", id, file_.name(), id); }
  Status ReadInto(uint64_t id, std::span<std::byte> dst) const override {
    return file_.ReadInto(id, dst).WithContext(fmt::format("sample {}", id));
  }

 private:
  RecordFile file_;
};

}  // namespace

Result<std::shared_ptr<const SampleSource>> OpenDirectorySource(const DirectorySourceOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(options.dir, ec)) {
    return Status::NotFound(fmt::format("data directory {}: {}", options.dir.string(),
                                        fs::exists(options.dir, ec) ? "not a directory" : "does not exist"));
  }
  VIPER_ASSIGN_OR_RETURN(auto files, Scan(options));
  if (files.empty()) {
    return Status::InvalidArgument(fmt::format("data directory {}: no sample files{}", options.dir.string(),
                                               options.extensions.empty() ? "" : " with the requested extensions"));
  }
  std::vector<std::string> classes;
  if (options.labels_from_subdirs) classes = LabelByTopDirectory(options.dir, files);
  return std::shared_ptr<const SampleSource>(
      std::make_shared<DirectorySource>(options, std::move(files), std::move(classes)));
}

Result<std::shared_ptr<const SampleSource>> OpenRecordSource(const std::filesystem::path& path,
                                                             const RecordFileOptions& options) {
  VIPER_ASSIGN_OR_RETURN(RecordFile file, RecordFile::Open(path, options));
  return std::shared_ptr<const SampleSource>(std::make_shared<RecordSource>(std::move(file)));
}

}  // namespace viper
