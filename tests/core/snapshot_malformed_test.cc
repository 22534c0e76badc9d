// Every malformed buffer is rejected with its own message (Corruption), from bytes and from a file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "core/snapshot_bytes.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using testing::Raw;
using testing::RawWithLength;
using testing::Zeros;

struct BadCase {
  std::string name;                // gtest-friendly
  std::vector<std::byte> bytes;
  std::string expected;            // a distinctive substring of the message
  ParseOptions options = {};
};

std::string Entry(std::string_view name, std::string_view dtype, std::string_view shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + std::string(name) + "\":{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":" + std::string(shape) +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// A Viper-written buffer whose data was changed after sealing.
std::vector<std::byte> TamperedViperBuffer() {
  std::vector<float> values = {1, 2, 3, 4};
  TensorData t{{"w", DType::kF32, {4}}, std::as_bytes(std::span(values))};
  auto snapshot = BuildSnapshot({t}, VersionStamp{.model = "m", .version = 1});
  EXPECT_TRUE(snapshot.ok()) << snapshot.status().ToString();
  std::vector<std::byte> bytes(snapshot->bytes().begin(), snapshot->bytes().end());
  bytes[snapshot->data_offset() + 5] ^= std::byte{0x40};
  return bytes;
}

// The first bytes of what torch.save writes: a zip archive (torch >= 1.6), or a protocol 2 pickle
// that opens with torch's magic number (the legacy format).
std::vector<std::byte> TorchZipStart() {
  return testing::ToBytes(std::string("PK\x03\x04\x00\x00\x08\x08\x00\x00", 10) + std::string(20, '\0') +
                          "archive/data.pkl");
}
std::vector<std::byte> TorchPickleStart() {
  return testing::ToBytes("\x80\x02\x8a\x0a" "l\xfc\x9c" "F\xf9 j\xa8" "P\x19.\x80\x02}q");
}

std::string Deep(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

std::vector<BadCase> Cases() {
  ParseOptions verify{.verify_checksum = true};
  ParseOptions small_limit{.max_header_bytes = 100};
  ParseOptions require{.require_checksum = true};
  const std::string w4 = Entry("w", "F32", "[1]", 0, 4);
  return {
      {"Short", testing::ToBytes("abc"), "buffer is 3 bytes, shorter than the 8-byte header length prefix"},
      {"Empty", {}, "buffer is 0 bytes, shorter than the 8-byte header length prefix"},
      {"HeaderBeyondBuffer", RawWithLength(1000, "{}", "xxxx"),
       "header length 1000 runs past the end of the buffer: only 6 bytes follow the 8-byte prefix"},
      {"TorchSaveZip", TorchZipStart(),
       "not a safetensors file: it begins with a zip archive's signature, as a torch.save file does; convert it with "
       "safetensors.torch.save_file(torch.load(path), \"model.safetensors\")"},
      {"TorchSavePickle", TorchPickleStart(),
       "not a safetensors file: it begins with a pickle's protocol 2 opcode, as a legacy torch.save file does"},
      {"HeaderBeyondDefaultLimit", RawWithLength(200ull << 20, "{}"),
       "header length 209715200 exceeds the limit of 104857600 bytes (ParseOptions.max_header_bytes)"},
      {"HeaderBeyondOptionLimit", Raw("{" + std::string(200, ' ') + "}"),
       "exceeds the limit of 100 bytes (ParseOptions.max_header_bytes)", small_limit},
      {"InvalidUtf8", Raw("{\"a\xff\":{}}"), "header is not valid UTF-8: byte 0xff at header offset 3"},
      {"OverlongUtf8", Raw("{\"\xc0\xaf\":{}}"), "header is not valid UTF-8: byte 0xc0 at header offset 2"},
      {"InvalidJson", Raw("{\"w\": "), "header is not valid JSON: "},
      {"TrailingJson", Raw("{} {}"), "header is not valid JSON: "},
      {"NotAnObject", Raw("[1, 2]"), "header JSON must be an object, got array"},
      {"EntryNotObject", Raw("{\"w\":[1]}"), "tensor \"w\": entry must be an object, got array"},
      {"MissingDtype", Raw(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", Zeros(4)),
       "tensor \"w\": missing field \"dtype\""},
      {"MissingShape", Raw(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", Zeros(4)),
       "tensor \"w\": missing field \"shape\""},
      {"MissingOffsets", Raw(R"({"w":{"dtype":"F32","shape":[1]}})", Zeros(4)),
       "tensor \"w\": missing field \"data_offsets\""},
      {"ExtraField", Raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"foo":1}})", Zeros(4)),
       "tensor \"w\": unknown field \"foo\" (a tensor entry has only dtype, shape, data_offsets)"},
      {"DtypeNotString", Raw(R"({"w":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", Zeros(4)),
       "tensor \"w\": field \"dtype\" must be a string, got number 5"},
      {"ShapeNotArray", Raw(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", Zeros(4)),
       "tensor \"w\": field \"shape\" must be an array, got string"},
      {"ShapeDimFloat", Raw(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", Zeros(4)),
       "tensor \"w\": shape[0] must be a non-negative integer, got number 1.5"},
      {"OffsetsNotPair", Raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", Zeros(8)),
       "tensor \"w\": field \"data_offsets\" must be an array of 2 integers, got an array of 3"},
      {"OffsetNotInteger", Raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", Zeros(4)),
       "tensor \"w\": data_offsets[1] must be a non-negative integer, got string"},
      {"OffsetNegative", Raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", Zeros(4)),
       "tensor \"w\": data_offsets[0] = -4 is negative"},
      {"UnknownDtype", Raw("{" + Entry("w", "F31", "[1]", 0, 4) + "}", Zeros(4)), "tensor \"w\": unknown dtype \"F31\""},
      {"NegativeDim", Raw("{" + Entry("w", "F32", "[1,-2]", 0, 4) + "}", Zeros(4)),
       "tensor \"w\": shape[1] = -2 is negative"},
      {"DimBeyondInt64", Raw("{" + Entry("w", "U8", "[9223372036854775808]", 0, 4) + "}", Zeros(4)),
       "tensor \"w\": shape[0] = 9223372036854775808 is larger than 2^63-1"},
      {"ElementCountOverflow", Raw("{" + Entry("w", "U8", "[4294967296,4294967296,2]", 0, 4) + "}", Zeros(4)),
       "tensor \"w\": shape [4294967296, 4294967296, 2] of U8 is more than 2^63-1 bytes"},
      {"ByteSizeOverflow", Raw("{" + Entry("w", "F64", "[4611686018427387904]", 0, 4) + "}", Zeros(4)),
       "tensor \"w\": shape [4611686018427387904] of F64 is more than 2^63-1 bytes"},
      // Empty, but a view's strides (numpy's, torch's: signed 64-bit) multiply the other dims.
      {"EmptyShapeElementCountOverflow",
       Raw("{" + Entry("w", "U8", "[0,9223372036854775807,9223372036854775807]", 0, 0) + "}"),
       "tensor \"w\": shape [0, 9223372036854775807, 9223372036854775807] of U8 has no elements, but its other dims "
       "span more than 2^63-1 bytes"},
      {"EmptyShapeByteSizeBeyondInt64", Raw("{" + Entry("w", "F32", "[2305843009213693952,0]", 0, 0) + "}"),
       "tensor \"w\": shape [2305843009213693952, 0] of F32 has no elements, but its other dims span more than "
       "2^63-1 bytes"},
      {"ShapeBeyondBuffer", Raw("{" + Entry("w", "F32", "[1000000]", 0, 4) + "}", Zeros(4)),
       "tensor \"w\": shape [1000000] of F32 needs 4000000 bytes but the data region has only 4"},
      {"SizeMismatch", Raw("{" + Entry("w", "F32", "[2,3]", 0, 20) + "}", Zeros(24)),
       "tensor \"w\": shape [2, 3] of F32 is 24 bytes but data_offsets [0, 20] span 20 bytes"},
      {"OffsetsOutOfRange", Raw("{" + Entry("w", "F32", "[10]", 0, 40) + "}", Zeros(32)),
       "tensor \"w\": data_offsets [0, 40] end beyond the data region of 32 bytes"},
      {"BeginAfterEnd", Raw("{" + Entry("w", "F32", "[2]", 16, 8) + "}", Zeros(16)),
       "tensor \"w\": data_offsets [16, 8] have begin > end"},
      {"Overlap", Raw("{" + Entry("a", "F32", "[4]", 0, 16) + "," + Entry("b", "F32", "[4]", 8, 24) + "}", Zeros(24)),
       "tensors \"a\" [0, 16) and \"b\" [8, 24) overlap"},
      {"Gap", Raw("{" + Entry("a", "F32", "[4]", 0, 16) + "," + Entry("b", "F32", "[4]", 24, 40) + "}", Zeros(40)),
       "gap of 8 bytes between tensor \"a\" (ends at 16) and tensor \"b\" (begins at 24); a gap is allowed only "
       "as the padding of a declared viper.alignment"},
      {"GapAtStart", Raw("{" + Entry("b", "F32", "[4]", 8, 24) + "}", Zeros(24)),
       "gap of 8 bytes at the start of the data region, before tensor \"b\" (begins at 8)"},
      {"GapNotAlignmentPadding",
       Raw("{\"__metadata__\":{\"viper.alignment\":\"64\"}," + Entry("a", "F32", "[4]", 0, 16) + "," +
               Entry("b", "F32", "[4]", 32, 48) + "}",
           Zeros(48)),
       "gap of 16 bytes between tensor \"a\" (ends at 16) and tensor \"b\" (begins at 32); with viper.alignment 64 "
       "it must begin at 16 or 64"},
      {"TrailingBytes", Raw("{" + Entry("a", "F32", "[4]", 0, 16) + "}", Zeros(24)),
       "data region has 24 bytes but the tensors cover only the first 16: 8 trailing bytes"},
      {"TrailingBytesNoTensors", Raw("{}", Zeros(8)),
       "data region has 8 bytes but the tensors cover only the first 0: 8 trailing bytes"},
      {"DuplicateTensor", Raw("{" + w4 + "," + w4 + "}", Zeros(4)), "duplicate tensor name \"w\""},
      {"DuplicateField", Raw(R"({"w":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", Zeros(4)),
       "tensor \"w\": duplicate field \"dtype\""},
      {"DuplicateMetadataKey", Raw(R"({"__metadata__":{"k":"1","k":"2"}})"), "__metadata__: duplicate key \"k\""},
      {"DuplicateMetadata", Raw(R"({"__metadata__":{},"__metadata__":{}})"), "duplicate key \"__metadata__\""},
      {"DuplicateKeyInArrayElement", Raw(R"({"__metadata__":{"k":[{"a":1},{"b":2,"b":3}]}})"),
       "duplicate key \"b\" in header JSON"},
      {"MetadataNotObject", Raw(R"({"__metadata__":["k"]})"), "\"__metadata__\" must be an object, got array"},
      {"MetadataValueNotString", Raw(R"({"__metadata__":{"k":3}})"),
       "__metadata__ key \"k\": value must be a string, got number 3"},
      {"ChecksumMismatch", TamperedViperBuffer(), "checksum mismatch: viper.checksum is ", verify},
      {"ChecksumTooShort", Raw(R"({"__metadata__":{"viper.checksum":"xyz"}})"),
       "__metadata__ key \"viper.checksum\": malformed checksum \"xyz\": expected 16 hex digits, got 3 characters"},
      {"ChecksumNotHex", Raw(R"({"__metadata__":{"viper.checksum":"0123456789abcdeg"}})"),
       "__metadata__ key \"viper.checksum\": malformed checksum \"0123456789abcdeg\": not a hex digit"},
      {"AlignmentNotPowerOfTwo", Raw(R"({"__metadata__":{"viper.alignment":"63"}})"),
       "__metadata__ key \"viper.alignment\": \"63\" is not a power of two in [1, 4096]"},
      {"AlignmentTooLarge", Raw(R"({"__metadata__":{"viper.alignment":"8192"}})"),
       "__metadata__ key \"viper.alignment\": \"8192\" is not a power of two in [1, 4096]"},
      {"ChecksumRequired", Raw("{}"), "no viper.checksum in __metadata__ (ParseOptions.require_checksum is set)",
       require},
      {"TooDeep", Raw("{\"__metadata__\":{\"k\":" + Deep(100) + "}}"), "header JSON nests deeper than 64 levels"},
  };
}

class MalformedSnapshot : public ::testing::TestWithParam<BadCase> {};

TEST_P(MalformedSnapshot, RejectedFromBytesWithItsMessage) {
  const BadCase& c = GetParam();
  auto owner = std::make_shared<int>(0);
  auto result = Snapshot::Parse(c.bytes, owner, c.options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kCorruption) << result.status().ToString();
  EXPECT_NE(result.status().message().find(c.expected), std::string::npos)
      << "message: " << result.status().message() << "\nexpected: " << c.expected;
  EXPECT_EQ(owner.use_count(), 1) << "a failed parse must not keep the owner";
}

TEST_P(MalformedSnapshot, RejectedFromFileWithPathAndSameMessage) {
  const BadCase& c = GetParam();
  testing::TempDir dir;
  const auto path = dir.path() / (c.name + ".safetensors");
  testing::WriteFile(path, c.bytes);
  auto from_bytes = Snapshot::Parse(c.bytes, nullptr, c.options);
  auto from_file = Snapshot::OpenFile(path, c.options);
  ASSERT_FALSE(from_file.ok());
  ASSERT_FALSE(from_bytes.ok());
  EXPECT_EQ(from_file.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(from_file.status().message(), path.string() + ": " + from_bytes.status().message());
}

TEST_P(MalformedSnapshot, RejectedFromOwnedBuffer) {
  const BadCase& c = GetParam();
  auto result = Snapshot::FromBuffer(c.bytes, c.options);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(c.expected), std::string::npos) << result.status().message();
}

INSTANTIATE_TEST_SUITE_P(AllFaults, MalformedSnapshot, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(MalformedSnapshotMessages, EveryFaultHasItsOwnMessage) {
  std::set<std::string> messages;
  for (const BadCase& c : Cases()) {
    auto result = Snapshot::Parse(c.bytes, nullptr, c.options);
    ASSERT_FALSE(result.ok()) << c.name;
    EXPECT_TRUE(messages.insert(result.status().message()).second) << c.name << ": " << result.status().message();
  }
}

TEST(MalformedSnapshotMessages, LongHostileNamesAreQuotedShortAndEscaped) {
  std::string name = "\\u001b[31m" + std::string(10000, 'n');  // JSON-escaped ESC: the name holds a raw ESC
  auto bytes = Raw("{" + Entry(name, "F31", "[1]", 0, 4) + "}", Zeros(4));
  auto result = Snapshot::Parse(bytes, nullptr);
  ASSERT_FALSE(result.ok());
  const std::string& message = result.status().message();
  EXPECT_LT(message.size(), 200u) << message;
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
  EXPECT_NE(message.find("\"\\x1b[31mnnn"), std::string::npos) << message;
  EXPECT_NE(message.find("...\": unknown dtype \"F31\""), std::string::npos) << message;
}

TEST(MalformedSnapshotMessages, SurrogatesAndTruncatedSequencesAreNotUtf8) {
  for (std::string bad : {std::string("\xed\xa0\x80"), std::string("\xe2\x82"), std::string("\xf4\x90\x80\x80"),
                          std::string("\x80")}) {
    auto result = Snapshot::Parse(Raw("{\"__metadata__\":{\"k\":\"" + bad + "\"}}"), nullptr);
    ASSERT_FALSE(result.ok());
    EXPECT_NE(result.status().message().find("header is not valid UTF-8"), std::string::npos)
        << result.status().message();
  }
  // Valid multi-byte text is accepted.
  auto ok = Snapshot::Parse(Raw("{\"__metadata__\":{\"k\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x90\x8d\"}}"), nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->meta("k"), "\xc3\xa9\xe2\x82\xac\xf0\x9f\x90\x8d");
}

TEST(MalformedSnapshotFile, MissingFileNamesPathAndErrno) {
  testing::TempDir dir;
  auto result = Snapshot::OpenFile(dir.path() / "absent.safetensors");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(result.status().message(),
            (dir.path() / "absent.safetensors").string() + ": cannot open: No such file or directory");
}

TEST(MalformedSnapshotFile, DirectoryIsNotARegularFile) {
  testing::TempDir dir;
  auto result = Snapshot::OpenFile(dir.path());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), dir.path().string() + ": not a regular file");
}

// A FIFO is refused at once (opening one for reading used to wait for a writer forever).
TEST(MalformedSnapshotFile, FifoIsRefusedWithoutWaitingForAWriter) {
  testing::TempDir dir;
  const auto fifo = dir.path() / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto result = Snapshot::OpenFile(fifo);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), fifo.string() + ": not a regular file");
}

}  // namespace
}  // namespace viper
