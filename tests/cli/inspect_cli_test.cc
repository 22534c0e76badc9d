// `viper inspect` end to end: runs the built bin/viper on real files and checks stdout, stderr
// and the exit code.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/run_viper.h"
#include "core/snapshot_bytes.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using nlohmann::json;

using testing::Outcome;
using testing::RunViper;

size_t Lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

class InspectCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<float> w = {1, 2, 3, 4, 5, 6};
    std::vector<int64_t> ids = {7, 8, 9};
    std::vector<TensorData> tensors = {{{"layer.w", DType::kF32, {2, 3}}, std::as_bytes(std::span(w))},
                                       {{"ids", DType::kI64, {3}}, std::as_bytes(std::span(ids))}};
    VersionStamp stamp{.model = "nt3", .version = 42, .step = 4200, .time_ns = 5, .loss = 0.5};
    auto built = BuildSnapshot(tensors, stamp, {{"framework", "torch"}});
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    good_ = std::vector<std::byte>(built->bytes().begin(), built->bytes().end());
    data_offset_ = built->data_offset();
    checksum_ = checksum_hex(*built->declared_checksum());
    good_path_ = Write("good.safetensors", good_);
  }

  std::string Write(const std::string& name, std::span<const std::byte> bytes) {
    auto path = dir_.path() / name;
    testing::WriteFile(path, bytes);
    return path.string();
  }

  testing::TempDir dir_;
  testing::TempDir run_dir_;
  std::vector<std::byte> good_;
  uint64_t data_offset_ = 0;
  std::string checksum_;
  std::string good_path_;
};

TEST_F(InspectCli, TextListsTensorsMetadataAndChecksum) {
  Outcome r = RunViper({"inspect", good_path_}, run_dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("file      " + good_path_ + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("size      {} bytes: header {}, data 88 (data region at byte {})", good_.size(),
                                   data_offset_ - 8, data_offset_)),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("checksum  " + checksum_ + " (declared, not verified; use --verify)"), std::string::npos);
  EXPECT_NE(r.out.find("tensors   2"), std::string::npos);
  EXPECT_NE(r.out.find("  NAME     DTYPE  SHAPE   BYTES  OFFSET\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  layer.w  F32    [2, 3]     24       0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  ids      I64    [3]        24      64\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  framework = torch\n"), std::string::npos);
  EXPECT_NE(r.out.find("  viper.model = nt3\n"), std::string::npos);
  EXPECT_NE(r.out.find("  viper.version = 42\n"), std::string::npos);

  Outcome verified = RunViper({"inspect", "--verify", good_path_}, run_dir_.path());
  EXPECT_EQ(verified.exit_code, 0) << verified.err;
  EXPECT_NE(verified.out.find("checksum  " + checksum_ + " (verified ok)"), std::string::npos) << verified.out;
}

TEST_F(InspectCli, JsonIsOneObjectWithEverything) {
  Outcome r = RunViper({"inspect", "--json", "--verify", good_path_}, run_dir_.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);  // throws (fails the test) unless stdout is exactly one JSON value
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["path"], good_path_);
  EXPECT_EQ(j["file_bytes"], good_.size());
  EXPECT_EQ(j["data_offset"], data_offset_);
  EXPECT_EQ(j["header_bytes"], data_offset_ - 8);
  EXPECT_EQ(j["data_bytes"], 88);
  EXPECT_EQ(j["checksum"], json({{"status", "ok"}, {"declared", checksum_}, {"computed", checksum_}}));
  ASSERT_EQ(j["tensors"].size(), 2u);
  EXPECT_EQ(j["tensors"][0], json({{"name", "layer.w"}, {"dtype", "F32"}, {"shape", {2, 3}}, {"bytes", 24},
                                   {"data_offsets", {0, 24}}, {"file_offset", data_offset_}}));
  EXPECT_EQ(j["tensors"][1]["name"], "ids");
  EXPECT_EQ(j["tensors"][1]["data_offsets"], json({64, 88}));
  EXPECT_EQ(j["metadata"]["framework"], "torch");
  EXPECT_EQ(j["metadata"]["viper.step"], "4200");
  EXPECT_EQ(j["metadata"]["viper.loss"], "0.5");

  Outcome unverified = RunViper({"inspect", "--json", good_path_}, run_dir_.path());
  ASSERT_EQ(unverified.exit_code, 0);
  EXPECT_EQ(json::parse(unverified.out)["checksum"],
            json({{"status", "declared"}, {"declared", checksum_}, {"computed", nullptr}}));
}

TEST_F(InspectCli, VerifyReportsMismatchAndFails) {
  std::vector<std::byte> bad = good_;
  bad[data_offset_ + 70] ^= std::byte{0x01};
  std::string path = Write("tampered.safetensors", bad);
  Outcome quick = RunViper({"inspect", path}, run_dir_.path());
  EXPECT_EQ(quick.exit_code, 0) << "without --verify the data is not read";

  Outcome r = RunViper({"inspect", "--verify", path}, run_dir_.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("checksum  MISMATCH: declared " + checksum_ + ", data hashes to "), std::string::npos) << r.out;
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("viper inspect: " + path + ": checksum mismatch: viper.checksum is " + checksum_, 0), 0u)
      << r.err;

  Outcome j = RunViper({"inspect", "--verify", "--json", path}, run_dir_.path());
  EXPECT_EQ(j.exit_code, 1);
  EXPECT_EQ(json::parse(j.out)["checksum"]["status"], "mismatch");
}

TEST_F(InspectCli, FileWithoutChecksumSaysNotDeclared) {
  std::string path = Write("plain.safetensors",
                           testing::Raw(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "ab"));
  Outcome r = RunViper({"inspect", "--verify", path}, run_dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("checksum  not declared\n"), std::string::npos) << r.out;
  Outcome j = RunViper({"inspect", "--json", path}, run_dir_.path());
  EXPECT_EQ(json::parse(j.out)["checksum"]["status"], "absent");
}

TEST_F(InspectCli, MalformedFilesGiveOneLineWithPathAndReason) {
  const std::string entry = R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::vector<std::pair<std::vector<std::byte>, std::string>> cases = {
      {std::vector<std::byte>(good_.begin(), good_.begin() + 5), "buffer is 5 bytes, shorter than the 8-byte"},
      {std::vector<std::byte>(good_.begin(), good_.begin() + 100), "runs past the end of the buffer"},
      {std::vector<std::byte>(good_.begin(), good_.end() - 4),
       "tensor \"ids\": data_offsets [64, 88] end beyond the data region of 84 bytes"},
      {testing::Raw("{not json}"), "header is not valid JSON"},
      {testing::Raw("{" + entry + "," + entry + "}", testing::Zeros(4)), "duplicate tensor name \"w\""},
      {testing::Raw(R"({"w":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}})", testing::Zeros(1)),
       "tensor \"w\": unknown dtype \"Q8\""},
      {testing::Raw(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                    R"("b":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}})",
                    testing::Zeros(5)),
       "gap of 3 bytes between tensor \"a\" (ends at 1) and tensor \"b\" (begins at 4)"},
      {testing::ToBytes(std::string("PK\x03\x04\x00\x00\x08\x08", 8) + std::string(40, '\0')),
       "not a safetensors file: it begins with a zip archive's signature, as a torch.save file does"},
  };
  int n = 0;
  for (const auto& [bytes, reason] : cases) {
    std::string path = Write("bad" + std::to_string(n++) + ".safetensors", bytes);
    for (bool as_json : {false, true}) {
      std::vector<std::string> args = {"inspect", path};
      if (as_json) args.push_back("--json");
      Outcome r = RunViper(args, run_dir_.path());
      EXPECT_EQ(r.exit_code, 1) << reason;
      EXPECT_EQ(r.out, "") << reason;
      EXPECT_EQ(Lines(r.err), 1u) << r.err;
      EXPECT_EQ(r.err.rfind("viper inspect: " + path + ": ", 0), 0u) << r.err;
      EXPECT_NE(r.err.find(reason), std::string::npos) << r.err;
    }
  }
}

TEST_F(InspectCli, MissingFileAndBadUsage) {
  std::string missing = (dir_.path() / "absent.safetensors").string();
  Outcome r = RunViper({"inspect", missing}, run_dir_.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "viper inspect: " + missing + ": cannot open: No such file or directory\n");

  Outcome dir = RunViper({"inspect", dir_.path().string()}, run_dir_.path());
  EXPECT_EQ(dir.exit_code, 1);
  EXPECT_EQ(dir.err, "viper inspect: " + dir_.path().string() + ": not a regular file\n");

  Outcome no_file = RunViper({"inspect"}, run_dir_.path());
  EXPECT_EQ(no_file.exit_code, 2);
  EXPECT_NE(no_file.err.find("file is required"), std::string::npos) << no_file.err;
  Outcome bad_flag = RunViper({"inspect", "--frobnicate", good_path_}, run_dir_.path());
  EXPECT_EQ(bad_flag.exit_code, 2);
  EXPECT_EQ(Lines(bad_flag.err), 1u) << bad_flag.err;
}

TEST_F(InspectCli, HostileNamesAreEscapedInText) {
  std::string header = R"({"\u001b[2Jx":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("__metadata__":{"k":"a\u0007b"}})";
  std::string path = Write("hostile.safetensors", testing::Raw(header, "z"));
  Outcome r = RunViper({"inspect", path}, run_dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
  EXPECT_EQ(r.out.find('\x07'), std::string::npos);
  EXPECT_NE(r.out.find("\\x1b[2Jx"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("k = a\\x07b"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace viper
