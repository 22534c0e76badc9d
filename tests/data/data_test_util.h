// Helpers for the data-layer tests: sample files with known contents, record files, byte patching.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "store/store_test_util.h"  // TempDir, FillPattern
#include "viper/record_file.h"

namespace viper::testing {

// The bytes of sample `id` in every test: a pattern of `size` bytes seeded by the id.
inline std::vector<std::byte> SampleBytes(uint64_t id, size_t size) {
  std::vector<std::byte> b(size);
  FillPattern(b, id + 1);
  return b;
}

inline void WriteFile(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "writing " << path;
}

inline std::vector<std::byte> ReadFile(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

// `classes` subdirectories c0, c1, ... each with `per_class` files of `size` bytes; file k of class
// c holds SampleBytes(c * per_class + k, size). Paths sort in that order, so the ids match.
inline void MakeSampleTree(const std::filesystem::path& dir, int classes, int per_class, size_t size) {
  for (int c = 0; c < classes; ++c) {
    for (int k = 0; k < per_class; ++k) {
      uint64_t id = static_cast<uint64_t>(c * per_class + k);
      char name[64];
      std::snprintf(name, sizeof(name), "c%d/%06d.bin", c, k);
      WriteFile(dir / name, SampleBytes(id, size));
    }
  }
}

// A record file of `n` records: record i holds SampleBytes(i, size_of(i)) with label i % labels.
template <typename SizeOf>
inline void MakeRecordFile(const std::filesystem::path& path, uint64_t n, SizeOf size_of, int64_t labels = 3,
                           std::span<const std::byte> metadata = {}) {
  auto w = RecordWriter::Create(path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (uint64_t i = 0; i < n; ++i) {
    Status st = (*w)->Append(SampleBytes(i, size_of(i)), static_cast<int64_t>(i) % labels);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  Status st = (*w)->Finish(metadata);
  ASSERT_TRUE(st.ok()) << st.ToString();
}

}  // namespace viper::testing
