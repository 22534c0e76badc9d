// libFuzzer target: record files (include/viper/record_file.h) and the rehearsal state stored in
// a spill's metadata (src/data/rehearsal_state.h): both are read from files a user or a crashed
// job left behind. Checks that a file that parses is consistent (records tile the data region,
// every record reads back or fails its checksum cleanly) and that a state that decodes re-encodes
// to the same bytes. Each input is tried as it is and with both checksums recomputed, so that
// mutations of the fields behind them reach the index and metadata checks.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "data/rehearsal_state.h"
#include "viper/record_file.h"
#include "viper/snapshot.h"  // checksum64

namespace {

using viper::RecordFile;
using viper::StatusCode;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void FuzzState(std::span<const std::byte> bytes, const RecordFile* file) {
  auto state = viper::data_internal::DecodeRehearsalState(bytes);
  if (!state.ok()) {
    Check(state.status().code() == StatusCode::kCorruption);
    return;
  }
  auto again = viper::data_internal::EncodeRehearsalState(*state);  // >= 48 bytes: memcmp gets no null
  Check(again.size() == bytes.size() && std::memcmp(again.data(), bytes.data(), bytes.size()) == 0);
  if (file != nullptr) (void)viper::data_internal::CheckRehearsalState(*state, *file);
}

void FuzzFile(std::span<const std::byte> bytes) {
  viper::RecordFileOptions limits;
  limits.max_records = 4096;
  limits.max_record_bytes = 1 << 16;
  limits.max_metadata_bytes = 1 << 16;
  auto file = RecordFile::Parse(bytes, limits, "fuzz");
  if (!file.ok()) {
    Check(file.status().code() == StatusCode::kCorruption);
    return;
  }
  uint64_t expect = viper::kRecordHeaderBytes;
  std::vector<std::byte> buf;
  for (uint64_t i = 0; i < file->size(); ++i) {
    const auto& e = file->entry(i);
    Check(e.offset == expect && e.length <= bytes.size() - e.offset && e.label >= -1);
    expect = e.offset + e.length;
    buf.resize(e.length);
    auto st = file->ReadInto(i, buf);
    Check(st.ok() || st.code() == StatusCode::kCorruption);
    if (st.ok() && e.length > 0) Check(std::memcmp(buf.data(), bytes.data() + e.offset, e.length) == 0);
  }
  Check(expect + file->metadata().size() + viper::kRecordIndexEntryBytes * file->size() == bytes.size());
  FuzzState(file->metadata(), &*file);
}

std::vector<std::byte> Restamped(std::span<const std::byte> in) {
  std::vector<std::byte> b(in.begin(), in.end());
  uint64_t meta;
  std::memcpy(&meta, &b[24], 8);
  if (meta <= b.size()) {
    uint64_t tail = viper::checksum64(std::span(b).subspan(meta));
    std::memcpy(&b[48], &tail, 8);
  }
  uint64_t head = viper::checksum64(std::span(b).first(56));
  std::memcpy(&b[56], &head, 8);
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  FuzzState(bytes, nullptr);
  FuzzFile(bytes);
  if (size >= viper::kRecordHeaderBytes) FuzzFile(Restamped(bytes));
  return 0;
}
