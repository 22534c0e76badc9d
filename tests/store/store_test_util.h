// Helpers for the store tests: sealed snapshot buffers, unique names, temp dirs, /dev/shm listing.
#pragma once

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "viper/snapshot.h"

namespace viper::testing {

// Fills `dst` with a pattern that differs per `seed` (word-wise, fast enough for hundreds of MB).
inline void FillPattern(std::span<std::byte> dst, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t words = dst.size() / 8;
  auto* w = reinterpret_cast<uint64_t*>(dst.data());
  for (size_t i = 0; i < words; ++i) w[i] = x + i * 0xD1B54A32D192ED03ull;
  for (size_t i = words * 8; i < dst.size(); ++i) dst[i] = std::byte(static_cast<uint8_t>(x + i));
}

// Writes a sealed snapshot of one U8 tensor of `data_bytes` into `dst` (which must be
// SnapshotBytes(data_bytes) long). The data pattern depends on `seed`.
inline void WriteSnapshot(std::span<std::byte> dst, const std::string& model, uint64_t version,
                          uint64_t data_bytes, uint64_t seed) {
  auto layout = SnapshotLayout::Make({{"w", DType::kU8, {static_cast<int64_t>(data_bytes)}}});
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(dst.size(), layout->total_bytes());
  FillPattern(dst.subspan(layout->data_offset()), seed);
  VersionStamp stamp;
  stamp.model = model;
  stamp.version = version;
  stamp.step = version * 10;
  Status st = layout->Seal(dst, &stamp);
  ASSERT_TRUE(st.ok()) << st.ToString();
}

inline uint64_t SnapshotBytes(uint64_t data_bytes) {
  return SnapshotLayout::Make({{"w", DType::kU8, {static_cast<int64_t>(data_bytes)}}}).value().total_bytes();
}

inline std::vector<std::byte> MakeSnapshot(const std::string& model, uint64_t version, uint64_t data_bytes,
                                           uint64_t seed) {
  std::vector<std::byte> buf(SnapshotBytes(data_bytes));
  WriteSnapshot(buf, model, version, data_bytes, seed);
  return buf;
}

// A name unique to this process and call: for segment prefixes and model names.
inline std::string UniqueName(const std::string& stem) {
  static std::atomic<int> n{0};
  return stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// Entries of /dev/shm named "<prefix>.*".
inline std::vector<std::string> ShmEntries(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (const dirent* e = ::readdir(dir)) {
    if (std::string_view(e->d_name).starts_with(prefix + ".")) out.emplace_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

// A fresh directory on the real disk, removed with everything in it at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "viper-store-test-XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) ADD_FAILURE() << "mkdtemp failed: " << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace viper::testing
