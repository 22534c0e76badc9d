// Record files: the strict reader and the atomic writer. Format and contract:
// include/viper/record_file.h.
#include "viper/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "core/fd.h"
#include "data_util.h"
#include "temp_file.h"
#include "viper/snapshot.h"  // checksum64

namespace viper {
namespace {

static_assert(std::endian::native == std::endian::little, "record files are read by memcpy on little-endian hosts");

constexpr char kMagic[8] = {'V', 'I', 'P', 'E', 'R', 'R', 'E', 'C'};

uint64_t Load64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t Load32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void Store64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }
void Store32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }

struct Header {
  uint64_t count = 0, meta_offset = 0, meta_bytes = 0, index_offset = 0, tail_checksum = 0;
};

// Checks the 64 header bytes against the file size and the limits; every fault has its message.
Result<Header> ParseHeader(std::span<const std::byte> h, uint64_t file_bytes, const RecordFileOptions& o) {
  if (file_bytes < kRecordHeaderBytes) {
    return Status::Corruption(fmt::format("file is {} bytes, shorter than the {}-byte header", file_bytes,
                                          kRecordHeaderBytes));
  }
  if (std::memcmp(h.data(), kMagic, 8) != 0) {
    return Status::Corruption("bad magic: not a Viper record file (expected \"VIPERREC\")");
  }
  if (uint32_t v = Load32(&h[8]); v != kRecordFormatVersion) {
    return Status::Corruption(fmt::format("format version {} is not supported (this reader knows {})", v,
                                          kRecordFormatVersion));
  }
  if (uint32_t n = Load32(&h[12]); n != kRecordHeaderBytes) {
    return Status::Corruption(fmt::format("header length {} is not {}", n, kRecordHeaderBytes));
  }
  uint64_t declared = Load64(&h[56]), actual = checksum64(h.first(56));
  if (declared != actual) {
    return Status::Corruption(fmt::format("header checksum mismatch: stored {:016x}, computed {:016x}", declared, actual));
  }
  Header r{Load64(&h[16]), Load64(&h[24]), Load64(&h[32]), Load64(&h[40]), Load64(&h[48])};
  if (r.count > o.max_records) {
    return Status::Corruption(fmt::format("{} records exceed the limit of {} (RecordFileOptions.max_records)", r.count,
                                          o.max_records));
  }
  if (r.meta_bytes > o.max_metadata_bytes) {
    return Status::Corruption(fmt::format("metadata of {} bytes exceeds the limit of {} (RecordFileOptions.max_metadata_bytes)",
                                          r.meta_bytes, o.max_metadata_bytes));
  }
  if (r.meta_offset < kRecordHeaderBytes || r.meta_offset > file_bytes) {
    return Status::Corruption(fmt::format("metadata offset {} is outside [{}, {}] (the file's size)", r.meta_offset,
                                          kRecordHeaderBytes, file_bytes));
  }
  if (r.index_offset != r.meta_offset + r.meta_bytes) {
    return Status::Corruption(fmt::format("index offset {} is not metadata offset {} + metadata length {}",
                                          r.index_offset, r.meta_offset, r.meta_bytes));
  }
  uint64_t end = r.index_offset + r.count * kRecordIndexEntryBytes;  // no overflow: both bounded above
  if (end > file_bytes) {
    return Status::Corruption(fmt::format("truncated: the index of {} records ends at byte {} but the file has {} bytes",
                                          r.count, end, file_bytes));
  }
  if (end < file_bytes) {
    return Status::Corruption(fmt::format("{} trailing bytes after the index (it ends at byte {} of {})",
                                          file_bytes - end, end, file_bytes));
  }
  return r;
}

// Decodes the index and checks that the records tile [64, meta_offset) in order.
Result<std::vector<RecordEntry>> ParseIndex(std::span<const std::byte> index, const Header& h,
                                            const RecordFileOptions& o) {
  std::vector<RecordEntry> entries(h.count);
  uint64_t expect = kRecordHeaderBytes;
  for (uint64_t i = 0; i < h.count; ++i) {
    const std::byte* p = index.data() + i * kRecordIndexEntryBytes;
    RecordEntry& e = entries[i];
    e = {Load64(p), Load64(p + 8), static_cast<int64_t>(Load64(p + 16)), Load64(p + 24)};
    if (e.offset != expect) {
      return Status::Corruption(fmt::format("record {}: offset {} is not {} (records must follow each other from byte {})",
                                            i, e.offset, expect, kRecordHeaderBytes));
    }
    if (e.length > o.max_record_bytes) {
      return Status::Corruption(fmt::format("record {}: length {} exceeds the limit of {} (RecordFileOptions.max_record_bytes)",
                                            i, e.length, o.max_record_bytes));
    }
    if (e.length > h.meta_offset - e.offset) {
      return Status::Corruption(fmt::format("record {}: [{}, +{}) runs past the end of the records at byte {}", i,
                                            e.offset, e.length, h.meta_offset));
    }
    if (e.label < -1) {
      return Status::Corruption(fmt::format("record {}: label {} is negative (only -1, 'none', is allowed)", i, e.label));
    }
    expect = e.offset + e.length;
  }
  if (expect != h.meta_offset) {
    return Status::Corruption(fmt::format("the records end at byte {} but the metadata begins at {}: {} stray bytes",
                                          expect, h.meta_offset, h.meta_offset - expect));
  }
  return entries;
}

struct Tail {
  std::shared_ptr<const std::vector<RecordEntry>> entries;
  std::shared_ptr<const std::vector<std::byte>> metadata;
};

// Checks the tail (metadata + index) of a file whose header parsed.
Result<Tail> ParseTail(const Header& h, std::span<const std::byte> tail, const RecordFileOptions& options) {
  if (uint64_t c = checksum64(tail); c != h.tail_checksum) {
    return Status::Corruption(fmt::format("metadata and index checksum mismatch: stored {:016x}, computed {:016x}",
                                          h.tail_checksum, c));
  }
  VIPER_ASSIGN_OR_RETURN(auto entries, ParseIndex(tail.subspan(h.meta_bytes), h, options));
  auto meta = tail.first(h.meta_bytes);
  return Tail{std::make_shared<const std::vector<RecordEntry>>(std::move(entries)),
              std::make_shared<const std::vector<std::byte>>(meta.begin(), meta.end())};
}

}  // namespace

Result<RecordFile> RecordFile::Parse(std::span<const std::byte> bytes, const RecordFileOptions& options,
                                     std::string name) {
  RecordFile f;
  f.name_ = std::move(name);
  f.file_bytes_ = bytes.size();
  f.memory_ = bytes;
  auto header = ParseHeader(bytes.first(std::min<uint64_t>(bytes.size(), kRecordHeaderBytes)), bytes.size(), options);
  if (!header.ok()) return header.status().WithContext(f.name_);
  auto t = ParseTail(*header, bytes.subspan(header->meta_offset), options);
  if (!t.ok()) return t.status().WithContext(f.name_);
  f.entries_ = std::move(t->entries);
  f.metadata_ = std::move(t->metadata);
  return f;
}

Result<RecordFile> RecordFile::Open(const std::filesystem::path& path, const RecordFileOptions& options) {
  RecordFile f;
  f.name_ = path.string();
  struct stat st {};
  auto opened = OpenRegularFile(f.name_, &st);
  if (!opened.ok()) return opened.status().WithContext(f.name_);
  auto fd = std::make_shared<Fd>(std::move(opened).value());
  f.file_bytes_ = static_cast<uint64_t>(st.st_size);
  f.fd_ = fd;
  std::byte h[kRecordHeaderBytes] = {};
  uint64_t hn = std::min<uint64_t>(f.file_bytes_, kRecordHeaderBytes);
  VIPER_RETURN_IF_ERROR(data_internal::PreadAll(fd->get(), {h, hn}, 0).WithContext(f.name_));
  auto header = ParseHeader({h, hn}, f.file_bytes_, options);
  if (!header.ok()) return header.status().WithContext(f.name_);
  // The tail's size is bounded by the limits ParseHeader checked (index + metadata).
  std::vector<std::byte> tail(f.file_bytes_ - header->meta_offset);
  VIPER_RETURN_IF_ERROR(data_internal::PreadAll(fd->get(), tail, header->meta_offset).WithContext(f.name_));
  auto t = ParseTail(*header, tail, options);
  if (!t.ok()) return t.status().WithContext(f.name_);
  f.entries_ = std::move(t->entries);
  f.metadata_ = std::move(t->metadata);
  return f;
}

Status RecordFile::ReadInto(uint64_t i, std::span<std::byte> dst) const {
  const RecordEntry& e = entry(i);
  if (dst.size() != e.length) {
    return Status::InvalidArgument(fmt::format("{} record {}: destination of {} bytes for a record of {}", name_, i,
                                               dst.size(), e.length));
  }
  if (fd_) {
    Status st = data_internal::PreadAll(fd_->get(), dst, e.offset);
    if (!st.ok()) return st.WithContext(fmt::format("{} record {}", name_, i));
  } else if (e.length > 0) {
    std::memcpy(dst.data(), memory_.data() + e.offset, e.length);
  }
  if (uint64_t c = checksum64(dst); c != e.checksum) {
    return Status::Corruption(fmt::format("{} record {}: checksum mismatch: the index says {:016x}, the {} bytes hash to {:016x}",
                                          name_, i, e.checksum, e.length, c));
  }
  return Status::OK();
}

// ---------------------------------------------------------------- writer

Result<std::unique_ptr<RecordWriter>> RecordWriter::Create(const std::filesystem::path& path,
                                                           const RecordWriterOptions& options) {
  std::unique_ptr<RecordWriter> w(new RecordWriter());
  w->path_ = path;
  w->options_ = options;
  // Exclusive, O_NOFOLLOW, unpredictable name (temp_file.h): nothing planted next to `path` is written.
  auto temp = internal::CreateTempNextTo(path, options.file_mode);
  if (!temp.ok()) return temp.status().WithContext(fmt::format("record file {}", path.string()));
  w->tmp_ = std::move(temp->path);
  w->fd_ = std::make_unique<Fd>(std::move(temp->fd));
  return w;
}

RecordWriter::~RecordWriter() {
  if (!finished_ && fd_ && fd_->get() >= 0) {
    fd_->Close();
    ::unlink(tmp_.c_str());
  }
}

Status RecordWriter::WriteAt(std::span<const std::byte> bytes, uint64_t offset) {
  Status st = data_internal::PwriteAll(fd_->get(), bytes, offset);
  return st.WithContext(fmt::format("record file {} (writing {})", path_.string(), tmp_.string()));
}

Status RecordWriter::Append(std::span<const std::byte> bytes, int64_t label) {
  if (finished_) return Status::FailedPrecondition(fmt::format("record file {}: Append after Finish", path_.string()));
  if (label < -1) {
    return Status::InvalidArgument(fmt::format("record file {}: label {} is negative (use -1 for none)", path_.string(), label));
  }
  VIPER_RETURN_IF_ERROR(WriteAt(bytes, end_));
  index_.push_back({end_, bytes.size(), label, checksum64(bytes)});
  end_ += bytes.size();
  return Status::OK();
}

Status RecordWriter::Finish(std::span<const std::byte> metadata) {
  if (finished_) return Status::FailedPrecondition(fmt::format("record file {}: Finish called twice", path_.string()));
  std::vector<std::byte> tail(metadata.size() + index_.size() * kRecordIndexEntryBytes);
  if (!metadata.empty()) std::memcpy(tail.data(), metadata.data(), metadata.size());
  std::byte* p = tail.data() + metadata.size();
  for (const RecordEntry& e : index_) {
    Store64(p, e.offset);
    Store64(p + 8, e.length);
    Store64(p + 16, static_cast<uint64_t>(e.label));
    Store64(p + 24, e.checksum);
    p += kRecordIndexEntryBytes;
  }
  std::byte h[kRecordHeaderBytes] = {};
  std::memcpy(h, kMagic, 8);
  Store32(h + 8, kRecordFormatVersion);
  Store32(h + 12, kRecordHeaderBytes);
  Store64(h + 16, index_.size());
  Store64(h + 24, end_);
  Store64(h + 32, metadata.size());
  Store64(h + 40, end_ + metadata.size());
  Store64(h + 48, checksum64(tail));
  Store64(h + 56, checksum64({h, 56}));
  VIPER_RETURN_IF_ERROR(WriteAt(tail, end_));
  VIPER_RETURN_IF_ERROR(WriteAt({h, kRecordHeaderBytes}, 0));
  VIPER_RETURN_IF_ERROR(data_internal::CommitTemp(*fd_, tmp_, path_, options_.fsync));
  finished_ = true;
  return Status::OK();
}

}  // namespace viper
