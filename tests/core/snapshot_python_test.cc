// Files Viper writes are read by an independent reader: tests/core/check_safetensors.py, a
// /usr/bin/python3 script that knows only the published format (json + struct).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/snapshot_bytes.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using nlohmann::json;

struct Sample {
  TensorSpec spec;
  std::vector<std::byte> bytes;
  json values;  // null when struct cannot decode the dtype (BF16, F8)
};

template <typename T>
Sample Typed(std::string name, DType dtype, std::vector<T> values, bool decodable = true) {
  Sample s{{std::move(name), dtype, {2, 2}}, std::vector<std::byte>(values.size() * sizeof(T)), nullptr};
  std::memcpy(s.bytes.data(), values.data(), s.bytes.size());
  if (decodable) {
    s.values = json::array();
    for (T v : values) {
      if constexpr (std::is_same_v<T, float>) {
        s.values.push_back(static_cast<double>(v));
      } else {
        s.values.push_back(v);
      }
    }
  }
  return s;
}

std::vector<Sample> AllDTypeSamples() {
  std::vector<Sample> out;
  out.push_back(Typed<double>("f64", DType::kF64, {0.5, -1.25, 1e300, 3.0}));
  out.push_back(Typed<float>("f32", DType::kF32, {0.5f, -1.25f, 3.0f, 0.1f}));
  Sample f16 = Typed<uint16_t>("f16", DType::kF16, {0x3800, 0xC000, 0x7BFF, 0x3C00}, false);
  f16.values = json::array({0.5, -2.0, 65504.0, 1.0});
  out.push_back(f16);
  out.push_back(Typed<uint16_t>("bf16", DType::kBF16, {0x3F80, 0xC000, 0x4049, 0x0000}, false));
  out.push_back(Typed<int64_t>("i64", DType::kI64, {INT64_MIN, INT64_MAX, -1, 0}));
  out.push_back(Typed<int32_t>("i32", DType::kI32, {INT32_MIN, INT32_MAX, -7, 7}));
  out.push_back(Typed<int16_t>("i16", DType::kI16, {INT16_MIN, INT16_MAX, -3, 3}));
  out.push_back(Typed<int8_t>("i8", DType::kI8, {-128, 127, -1, 1}));
  out.push_back(Typed<uint64_t>("u64", DType::kU64, {UINT64_MAX, 0, 1, 12345}));
  out.push_back(Typed<uint32_t>("u32", DType::kU32, {UINT32_MAX, 0, 1, 54321}));
  out.push_back(Typed<uint16_t>("u16", DType::kU16, {UINT16_MAX, 0, 1, 4321}));
  out.push_back(Typed<uint8_t>("u8", DType::kU8, {255, 0, 1, 42}));
  Sample b = Typed<uint8_t>("bool", DType::kBool, {1, 0, 1, 1}, false);
  b.values = json::array({true, false, true, true});
  out.push_back(b);
  out.push_back(Typed<uint8_t>("f8_e4m3", DType::kF8_E4M3, {0x38, 0xB8, 0x7E, 0x00}, false));
  out.push_back(Typed<uint8_t>("f8_e5m2", DType::kF8_E5M2, {0x3C, 0xBC, 0x7B, 0x00}, false));
  // An odd-sized and an empty tensor make the padding visible.
  Sample odd{{"odd", DType::kU8, {3}}, {std::byte{1}, std::byte{2}, std::byte{3}}, json::array({1, 2, 3})};
  out.push_back(odd);
  out.push_back(Sample{{"empty", DType::kF32, {0, 3}}, {}, json::array()});
  return out;
}

std::string Hex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    out += kDigits[static_cast<unsigned>(b) >> 4];
    out += kDigits[static_cast<unsigned>(b) & 0xf];
  }
  return out;
}

json Expectation(const std::vector<Sample>& samples, const Snapshot& s, uint64_t alignment) {
  json tensors = json::object();
  for (const Sample& sample : samples) {
    json t = {{"dtype", dtype_name(sample.spec.dtype)}, {"shape", sample.spec.shape}, {"hex", Hex(sample.bytes)}};
    if (!sample.values.is_null()) t["values"] = sample.values;
    tensors[sample.spec.name] = t;
  }
  json metadata = {{"viper.model", *s.model()}, {"viper.version", "7"}, {"viper.step", "700"}, {"user", "yes"}};
  return {{"alignment", alignment}, {"metadata", metadata}, {"tensors", tensors}};
}

struct CheckerRun {
  int exit_code;
  std::string output;
};

CheckerRun RunChecker(const std::filesystem::path& file, const json& expect, const testing::TempDir& dir) {
  const auto expect_path = dir.path() / "expect.json";
  std::ofstream(expect_path) << expect.dump();
  std::string command = "/usr/bin/python3 " VIPER_SOURCE_DIR "/tests/core/check_safetensors.py '" + file.string() +
                        "' '" + expect_path.string() + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

class PythonReader : public ::testing::TestWithParam<uint64_t> {};

TEST_P(PythonReader, ReadsEveryDTypeViperWrites) {
  const uint64_t alignment = GetParam();
  auto samples = AllDTypeSamples();
  std::vector<TensorData> tensors;
  for (const Sample& s : samples) tensors.push_back({s.spec, s.bytes});
  VersionStamp stamp{.model = "caf\xc3\xa9 \"q\"", .version = 7, .step = 700, .time_ns = 1, .loss = 0.25};
  auto built = BuildSnapshot(tensors, stamp, {{"user", "yes"}}, alignment);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  testing::TempDir dir;
  const auto file = dir.path() / "viper.safetensors";
  testing::WriteFile(file, built->bytes());

  json expect = Expectation(samples, *built, alignment);
  CheckerRun ok = RunChecker(file, expect, dir);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("ok: 17 tensors"), std::string::npos) << ok.output;

  // The checker can fail: a wrong expected value and non-zero padding are both caught.
  json wrong = expect;
  wrong["tensors"]["i32"]["values"][2] = -8;
  CheckerRun bad_value = RunChecker(file, wrong, dir);
  EXPECT_EQ(bad_value.exit_code, 1) << bad_value.output;
  EXPECT_NE(bad_value.output.find("i32: values"), std::string::npos) << bad_value.output;
  if (alignment > 1) {
    std::vector<std::byte> bytes(built->bytes().begin(), built->bytes().end());
    const TensorInfo& odd = *built->find("odd");
    bytes[built->data_offset() + odd.end] = std::byte{0x5A};  // the first padding byte after "odd"
    testing::WriteFile(file, bytes);
    CheckerRun bad_padding = RunChecker(file, expect, dir);
    EXPECT_EQ(bad_padding.exit_code, 1) << bad_padding.output;
    EXPECT_NE(bad_padding.output.find("padding before it is not zero"), std::string::npos) << bad_padding.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Alignments, PythonReader, ::testing::Values(uint64_t{1}, uint64_t{64}, uint64_t{4096}));

}  // namespace
}  // namespace viper
