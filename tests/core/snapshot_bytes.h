// Test helpers for tests/core: raw safetensors buffers assembled by hand, straight from the
// published format (8-byte LE length, JSON, data), independent of Viper's writer.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace viper::testing {

inline std::vector<std::byte> ToBytes(std::string_view text) {
  std::vector<std::byte> out(text.size());
  if (!text.empty()) std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// [declared_length LE][header][data]: declared_length may lie about the header.
inline std::vector<std::byte> RawWithLength(uint64_t declared_length, std::string_view header,
                                            std::string_view data = {}) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((declared_length >> (8 * i)) & 0xff);
  out.append(header);
  out.append(data);
  return ToBytes(out);
}

// A well-framed buffer: the header padded with spaces to `pad_to` (0: no padding), then `data`.
inline std::vector<std::byte> Raw(std::string header, std::string_view data = {}, size_t pad_to = 8) {
  if (pad_to > 0) {
    while ((8 + header.size()) % pad_to != 0) header += ' ';
  }
  return RawWithLength(header.size(), header, data);
}

// A bytes buffer of `n` zero bytes, as a string (for Raw's data).
inline std::string Zeros(size_t n) { return std::string(n, '\0'); }

// A fresh directory under TMPDIR, removed when the object goes.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("viper-core-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void WriteFile(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<std::byte> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ToBytes(text);
}

}  // namespace viper::testing
