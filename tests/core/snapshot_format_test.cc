// Snapshot round trips, layout and header rules, zero copy, checksums, and files from an
// independent (hand-assembled) writer.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/snapshot_bytes.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using testing::Raw;

// Deterministic bytes that differ per tensor: catches swapped or shifted data.
std::vector<std::byte> Pattern(size_t n, int seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 131 + seed * 17 + 7) & 0xff);
  return out;
}

bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

bool Inside(std::span<const std::byte> inner, std::span<const std::byte> outer) {
  return inner.data() >= outer.data() && inner.data() + inner.size() <= outer.data() + outer.size();
}

std::string Text(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST(DType, NamesSizesAndParsingAgree) {
  const std::map<std::string, size_t> expected = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
      {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  ASSERT_EQ(std::size(kAllDTypes), expected.size());
  std::set<std::string> seen;
  for (DType dtype : kAllDTypes) {
    std::string name(dtype_name(dtype));
    ASSERT_TRUE(expected.contains(name)) << name;
    EXPECT_EQ(dtype_size(dtype), expected.at(name)) << name;
    auto parsed = parse_dtype(name);
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, dtype);
    seen.insert(name);
  }
  EXPECT_EQ(seen.size(), expected.size());
  auto bad = parse_dtype("f32");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown dtype \"f32\"");
}

TEST(SnapshotDefault, EmptySnapshotIsHarmless) {
  Snapshot s;
  EXPECT_TRUE(s.tensors().empty());
  EXPECT_TRUE(s.bytes().empty());
  EXPECT_EQ(s.header_size(), 0u);
  EXPECT_EQ(s.find("x"), nullptr);
  EXPECT_EQ(s.version(), std::nullopt);
  EXPECT_EQ(s.VerifyChecksum().code(), StatusCode::kNotFound);
}

TEST(Checksum, MatchesPublishedXxh3AndRoundTripsAsHex) {
  // XXH3_64bits of the empty input, from the xxHash test vectors.
  EXPECT_EQ(checksum64({}), 0x2D06800538D394C2ull);
  EXPECT_EQ(checksum_hex(0x2D06800538D394C2ull), "2d06800538d394c2");
  EXPECT_EQ(checksum_hex(0), "0000000000000000");
  auto parsed = parse_checksum_hex("2D06800538D394C2");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, 0x2D06800538D394C2ull);
  EXPECT_FALSE(parse_checksum_hex("2d06800538d394c").ok());
  EXPECT_FALSE(parse_checksum_hex("2d06800538d394c2 ").ok());
  EXPECT_FALSE(parse_checksum_hex("+d06800538d394c2").ok());
}

// Whatever implementation checksum64 picks (AVX2 on this machine), it equals the reference
// library's XXH3_64bits on every length class (the algorithm has separate code for <=16, <=128,
// <=240 bytes, whole stripes and blocks, and tails) and on unaligned starts.
TEST(Checksum, EqualsTheReferenceLibraryAtEveryLength) {
  std::vector<std::byte> bytes = Pattern((1 << 20) + 77, 3);
  for (size_t size : {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 4096, 65536, 65600, (1 << 20) + 70}) {
    for (size_t offset : {0, 1, 7}) {
      std::span<const std::byte> span = std::span<const std::byte>(bytes).subspan(offset, size);
      EXPECT_EQ(checksum64(span), XXH3_64bits(span.data(), span.size())) << "size " << size << " offset " << offset;
    }
  }
  // In pieces of every awkward size, the stream gives the one-shot value.
  for (size_t piece : {1, 7, 64, 4095, 65536, 300000}) {
    Checksum64Stream stream;
    for (size_t at = 0; at < bytes.size(); at += piece)
      stream.Update(std::span<const std::byte>(bytes).subspan(at, std::min(piece, bytes.size() - at)));
    EXPECT_EQ(stream.Digest(), XXH3_64bits(bytes.data(), bytes.size())) << "piece " << piece;
  }
  Checksum64Stream moved = Checksum64Stream();
  EXPECT_EQ(moved.Digest(), 0x2D06800538D394C2ull);
}

class DTypeRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(DTypeRoundTrip, BytesShapeAndDtypeSurviveBuildAndFile) {
  const DType dtype = GetParam();
  const std::vector<int64_t> shape = {3, 5};
  auto data = Pattern(15 * dtype_size(dtype), static_cast<int>(dtype));
  auto odd = Pattern(7 * dtype_size(dtype), 99);  // an odd size forces padding before the next tensor
  std::vector<TensorData> tensors = {{{"odd", dtype, {7}}, odd}, {{"t", dtype, shape}, data}};
  auto built = BuildSnapshot(tensors, VersionStamp{.model = "rt", .version = 3});
  ASSERT_TRUE(built.ok()) << built.status().ToString();

  testing::TempDir dir;
  const auto path = dir.path() / "rt.safetensors";
  testing::WriteFile(path, built->bytes());
  auto opened = Snapshot::OpenFile(path, ParseOptions{.verify_checksum = true, .require_checksum = true});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  for (const Snapshot* s : {&*built, &*opened}) {
    const TensorInfo* t = s->find("t");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, dtype);
    EXPECT_EQ(t->shape, shape);
    EXPECT_EQ(t->num_elements(), 15u);
    EXPECT_EQ(t->begin % 64, 0u);
    EXPECT_TRUE(SameBytes(s->tensor_data(*t), data));
    EXPECT_TRUE(SameBytes(s->tensor_data(*s->find("odd")), odd));
    EXPECT_EQ(s->data_offset() % 8, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, DTypeRoundTrip, ::testing::ValuesIn(kAllDTypes),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

TEST(SnapshotRoundTrip, EmptyTensorsAndScalars) {
  double scalar = 2.5;
  auto vec = Pattern(12, 1);
  std::vector<TensorData> tensors = {
      {{"empty_first", DType::kF32, {0}}, {}},
      {{"scalar", DType::kF64, {}}, std::as_bytes(std::span(&scalar, 1))},
      {{"empty_mid", DType::kI16, {3, 0, 2}}, {}},
      {{"vec", DType::kU8, {12}}, vec},
      {{"empty_last", DType::kBF16, {0, 4}}, {}},
  };
  for (uint64_t alignment : {uint64_t{1}, uint64_t{64}}) {
    auto built = BuildSnapshot(tensors, VersionStamp{}, {}, alignment);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    auto reparsed = Snapshot::Parse(built->bytes(), built->owner(), ParseOptions{.verify_checksum = true});
    ASSERT_TRUE(reparsed.ok()) << reparsed.status().ToString();
    const TensorInfo* s = reparsed->find("scalar");
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->shape.empty());
    EXPECT_EQ(s->num_elements(), 1u);
    double back;
    std::memcpy(&back, reparsed->tensor_data(*s).data(), sizeof back);
    EXPECT_EQ(back, 2.5);
    for (const char* name : {"empty_first", "empty_mid", "empty_last"}) {
      const TensorInfo* e = reparsed->find(name);
      ASSERT_NE(e, nullptr) << name;
      EXPECT_EQ(e->num_elements(), 0u);
      EXPECT_EQ(e->nbytes(), 0u);
      EXPECT_TRUE(reparsed->tensor_data(*e).empty());
    }
    EXPECT_EQ(reparsed->find("empty_mid")->shape, (std::vector<int64_t>{3, 0, 2}));
    EXPECT_TRUE(SameBytes(reparsed->tensor_data(*reparsed->find("vec")), vec));
  }
}

TEST(SnapshotRoundTrip, NoTensorsAtAll) {
  auto built = BuildSnapshot({}, VersionStamp{.model = "none", .version = 1}, {{"note", "empty"}});
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_TRUE(built->tensors().empty());
  EXPECT_TRUE(built->data_region().empty());
  EXPECT_EQ(built->meta("note"), "empty");
  EXPECT_TRUE(built->VerifyChecksum().ok());
}

TEST(SnapshotRoundTrip, ManyTensorsFindAndDataOrder) {
  std::vector<std::vector<std::byte>> storage;
  std::vector<TensorData> tensors;
  for (int i = 0; i < 300; ++i) {
    storage.push_back(Pattern(static_cast<size_t>(i % 17) * 4, i));
  }
  for (int i = 0; i < 300; ++i) {
    // Names in reverse alphabetical order relative to data order.
    tensors.push_back({{"layer." + std::to_string(999 - i), DType::kF32, {i % 17}}, storage[i]});
  }
  auto built = BuildSnapshot(tensors, VersionStamp{});
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  ASSERT_EQ(built->tensors().size(), 300u);
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(built->tensors()[i].name, "layer." + std::to_string(999 - i)) << "tensors() is in data order";
    const TensorInfo* t = built->find("layer." + std::to_string(999 - i));
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(SameBytes(built->tensor_data(*t), storage[i]));
  }
  EXPECT_EQ(built->find("layer.1"), nullptr);
  EXPECT_EQ(built->find(""), nullptr);
}

TEST(SnapshotMetadata, StampAndUserMetadataRoundTrip) {
  VersionStamp stamp{.model = "nt3", .version = UINT64_MAX, .step = 12345, .time_ns = 1700000000123456789ull,
                     .loss = 0.1};
  auto built = BuildSnapshot({}, stamp, {{"framework", "torch"}, {"quote\"key", "line\nbreak"}});
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_EQ(built->model(), "nt3");
  EXPECT_EQ(built->version(), UINT64_MAX);
  EXPECT_EQ(built->step(), 12345u);
  EXPECT_EQ(built->time_ns(), 1700000000123456789ull);
  EXPECT_EQ(built->loss(), 0.1);
  EXPECT_EQ(built->meta(kMetaLoss), "0.1");
  EXPECT_EQ(built->meta(kMetaAlignment), "64");
  EXPECT_EQ(built->meta("framework"), "torch");
  EXPECT_EQ(built->meta("quote\"key"), "line\nbreak");
  EXPECT_EQ(built->meta("absent"), std::nullopt);
  EXPECT_EQ(built->declared_checksum(), built->compute_checksum());
  EXPECT_EQ(built->meta(kMetaChecksum), checksum_hex(built->compute_checksum()));
}

TEST(SnapshotMetadata, LossEdgeValuesAndAbsentLoss) {
  for (double loss : {1e-300, -2.2250738585072014e-308, std::numeric_limits<double>::infinity(), 123456789.125}) {
    auto built = BuildSnapshot({}, VersionStamp{.loss = loss});
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    EXPECT_EQ(built->loss(), loss);
  }
  auto nan = BuildSnapshot({}, VersionStamp{.loss = std::nan("")});
  ASSERT_TRUE(nan.ok());
  ASSERT_TRUE(nan->loss().has_value());
  EXPECT_TRUE(std::isnan(*nan->loss()));
  auto none = BuildSnapshot({}, VersionStamp{});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->loss(), std::nullopt);
  EXPECT_EQ(none->model(), std::nullopt) << "an empty model name is not written";
}

TEST(SnapshotLayoutTest, WidestStampFitsAndHeaderIsSpacePadded) {
  auto layout = SnapshotLayout::Make({{"w", DType::kF32, {2}}}, {{"k", "v"}});
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->data_offset() % 8, 0u);
  EXPECT_LT(layout->data_offset(), 2048u) << "header overhead stays small";
  std::vector<std::byte> buffer(layout->total_bytes());
  // 128 bytes of control characters: the worst case for JSON escaping.
  VersionStamp widest{.model = std::string(kMaxModelNameBytes, '\x01'), .version = UINT64_MAX, .step = UINT64_MAX,
                      .time_ns = UINT64_MAX, .loss = -2.2250738585072014e-308};
  ASSERT_TRUE(layout->Seal(buffer, &widest).ok());
  auto parsed = Snapshot::Parse(buffer, nullptr, ParseOptions{.verify_checksum = true});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->model(), widest.model);
  EXPECT_EQ(parsed->data_offset(), layout->data_offset());

  VersionStamp small{.model = "m"};
  ASSERT_TRUE(layout->Seal(buffer, &small).ok());
  std::string header = Text(std::span(buffer).subspan(8, layout->data_offset() - 8));
  size_t close = header.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding is spaces only";
  EXPECT_GT(header.size() - close - 1, 700u) << "the narrow stamp leaves the reserve as spaces";
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"k\":\"v\",\"viper.model\":\"m\",", 0), 0u) << header;
}

TEST(SnapshotLayoutTest, ProducerWritesInPlaceThenSeals) {
  auto layout = SnapshotLayout::Make({{"a", DType::kF32, {3}}, {"b", DType::kU8, {5}}, {"c", DType::kI64, {2}}});
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->tensors().size(), 3u);
  EXPECT_EQ(layout->tensors()[0].begin, 0u);
  EXPECT_EQ(layout->tensors()[1].begin, 64u);
  EXPECT_EQ(layout->tensors()[2].begin, 128u);
  EXPECT_EQ(layout->data_bytes(), 144u);
  EXPECT_EQ(layout->find("b"), &layout->tensors()[1]);
  EXPECT_EQ(layout->find("z"), nullptr);

  std::vector<std::byte> buffer(layout->total_bytes(), std::byte{0xAA});  // garbage in the padding
  for (const TensorInfo& t : layout->tensors()) {
    auto bytes = Pattern(t.nbytes(), static_cast<int>(t.begin));
    std::memcpy(buffer.data() + layout->data_offset() + t.begin, bytes.data(), bytes.size());
  }
  VersionStamp stamp{.model = "m", .version = 9, .step = 90};
  ASSERT_TRUE(layout->Seal(buffer, &stamp).ok());
  EXPECT_NE(stamp.checksum, 0u);
  auto parsed = Snapshot::Parse(buffer, nullptr, ParseOptions{.verify_checksum = true, .require_checksum = true});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->declared_checksum(), stamp.checksum);
  EXPECT_EQ(parsed->version(), 9u);
  for (uint64_t i = 12; i < 64; ++i) EXPECT_EQ(buffer[layout->data_offset() + i], std::byte{0}) << i;
  for (const TensorInfo& t : layout->tensors()) {
    EXPECT_TRUE(SameBytes(parsed->tensor_data(*parsed->find(t.name)), Pattern(t.nbytes(), static_cast<int>(t.begin))));
  }
}

// A GPU-resident version's header, read alone (the data stays on the device): the layout Make
// computed, the stamp, and the parser's refusals naming what is wrong.
TEST(SnapshotHeaderTest, TheHeaderAloneGivesTheLayout) {
  auto layout = SnapshotLayout::Make({{"a", DType::kF32, {3}}, {"b", DType::kU8, {5}}});
  ASSERT_TRUE(layout.ok());
  std::vector<std::byte> header(layout->data_offset());
  ASSERT_TRUE(layout->WriteHeader(header, VersionStamp{.model = "m", .version = 4, .step = 40}).ok());
  auto h = ParseSnapshotHeader(header, layout->data_bytes());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_offset, layout->data_offset());
  ASSERT_EQ(h->tensors.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(h->tensors[i].name, layout->tensors()[i].name);
    EXPECT_EQ(h->tensors[i].begin, layout->tensors()[i].begin);
    EXPECT_EQ(h->tensors[i].end, layout->tensors()[i].end);
  }
  EXPECT_EQ(h->metadata.at("viper.version"), "4");
  // A data region shorter than the tensors declare, a cut header, garbage.
  auto short_data = ParseSnapshotHeader(header, layout->data_bytes() - 1);
  ASSERT_FALSE(short_data.ok());
  EXPECT_EQ(short_data.status().code(), StatusCode::kCorruption);
  EXPECT_NE(short_data.status().message().find("\"b\""), std::string::npos) << short_data.status().message();
  auto cut = ParseSnapshotHeader(std::span(header).first(header.size() - 1), layout->data_bytes());
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("exceeds the"), std::string::npos) << cut.status().message();
  std::vector<std::byte> junk(16, std::byte{0x7f});
  EXPECT_EQ(ParseSnapshotHeader(junk, 0).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseSnapshotHeader(std::span(junk).first(4), 0).status().code(), StatusCode::kCorruption);
}

// A node re-stamps a client's snapshot in place: Of() recovers the layout Viper wrote, and the
// new stamp changes the header only (the checksum of the data still holds).
TEST(SnapshotLayoutTest, OfRecoversViperLayoutAndRefusesForeignOnes) {
  std::vector<std::byte> a(12, std::byte{1}), b(5, std::byte{2});
  auto built = BuildSnapshot({{{"a", DType::kF32, {3}}, a}, {{"b", DType::kU8, {5}}, b}}, VersionStamp{.step = 4},
                             {{"note", "x"}});
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  auto layout = SnapshotLayout::Of(*built);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->total_bytes(), built->bytes().size());
  std::vector<std::byte> copy(built->bytes().begin(), built->bytes().end());
  VersionStamp stamp{.model = "m", .version = 12, .step = 4, .checksum = *built->declared_checksum()};
  ASSERT_TRUE(layout->WriteHeader(copy, stamp).ok());
  auto restamped = Snapshot::Parse(copy, nullptr, ParseOptions{.verify_checksum = true, .require_checksum = true});
  ASSERT_TRUE(restamped.ok()) << restamped.status().ToString();
  EXPECT_EQ(restamped->version(), 12u);
  EXPECT_EQ(restamped->meta("note"), "x");

  // A plain safetensors file (no viper.alignment) has no Viper layout.
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  std::vector<std::byte> foreign(8 + header.size() + 2, std::byte{0});
  uint64_t n = header.size();
  std::memcpy(foreign.data(), &n, 8);
  std::memcpy(foreign.data() + 8, header.data(), header.size());
  auto parsed = Snapshot::Parse(foreign, nullptr);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  auto none = SnapshotLayout::Of(*parsed);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("not laid out by Viper"), std::string::npos) << none.status().message();
}

TEST(SnapshotLayoutTest, AlignmentOneIsGapFree) {
  auto layout = SnapshotLayout::Make({{"a", DType::kU8, {3}}, {"b", DType::kF16, {5}}, {"c", DType::kI64, {2}}}, {}, 1);
  ASSERT_TRUE(layout.ok());
  uint64_t pos = 0;
  for (const TensorInfo& t : layout->tensors()) {
    EXPECT_EQ(t.begin, pos);
    pos = t.end;
  }
  EXPECT_EQ(layout->data_bytes(), 3u + 10u + 16u);
}

TEST(SnapshotLayoutTest, MakeRejectsBadArguments) {
  struct Bad {
    std::vector<TensorSpec> tensors;
    std::map<std::string, std::string> metadata;
    uint64_t alignment;
    std::string expected;
  };
  const std::vector<Bad> cases = {
      {{}, {}, 0, "alignment 0 is not a power of two in [1, 4096]"},
      {{}, {}, 48, "alignment 48 is not a power of two in [1, 4096]"},
      {{}, {}, 8192, "alignment 8192 is not a power of two in [1, 4096]"},
      {{{"", DType::kF32, {1}}}, {}, 64, "tensor name is empty"},
      {{{"__metadata__", DType::kF32, {1}}}, {}, 64, "tensor \"__metadata__\": name is reserved"},
      {{{"a", DType::kF32, {1}}, {"a", DType::kU8, {1}}}, {}, 64, "duplicate tensor name \"a\""},
      {{{"a", DType::kF32, {2, -1}}}, {}, 64, "tensor \"a\": shape[1] = -1 is negative"},
      {{{"a\xff", DType::kF32, {1}}}, {}, 64, "name is not valid UTF-8"},
      {{{"a", DType::kF64, {INT64_MAX, 4}}}, {}, 64, "tensor \"a\": shape [9223372036854775807, 4] of F64 overflows"},
      {{{"a", DType::kU8, {0, INT64_MAX, INT64_MAX}}}, {}, 64,
       "tensor \"a\": shape [0, 9223372036854775807, 9223372036854775807] of U8 overflows"},
      {{}, {{"viper.step", "1"}}, 64, "user metadata key \"viper.step\" starts with \"viper.\", which is reserved"},
      {{}, {{"k", "\xc0"}}, 64, "user metadata value of key \"k\" is not valid UTF-8"},
  };
  for (const Bad& c : cases) {
    auto layout = SnapshotLayout::Make(c.tensors, c.metadata, c.alignment);
    ASSERT_FALSE(layout.ok()) << c.expected;
    EXPECT_EQ(layout.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(layout.status().message().find(c.expected), std::string::npos) << layout.status().message();
  }
}

TEST(SnapshotLayoutTest, WriteHeaderRejectsSmallBufferAndLongModel) {
  auto layout = SnapshotLayout::Make({{"w", DType::kF32, {2}}});
  ASSERT_TRUE(layout.ok());
  std::vector<std::byte> small(layout->data_offset() - 1);
  auto st = layout->WriteHeader(small, VersionStamp{});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("but the destination has"), std::string::npos) << st.message();
  std::vector<std::byte> buffer(layout->total_bytes());
  st = layout->WriteHeader(buffer, VersionStamp{.model = std::string(kMaxModelNameBytes + 1, 'm')});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("is 129 bytes; at most 128 fit the snapshot header"), std::string::npos) << st.message();
  st = layout->WriteHeader(buffer, VersionStamp{.model = "bad\xff"});
  EXPECT_EQ(st.message(), "model name is not valid UTF-8");
  VersionStamp stamp;
  EXPECT_EQ(layout->Seal(small, &stamp).code(), StatusCode::kInvalidArgument);
}

TEST(BuildSnapshotTest, RejectsWrongByteCount) {
  auto bytes = Pattern(10, 0);
  auto built = BuildSnapshot({{{"w", DType::kF32, {3}}, bytes}}, VersionStamp{});
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().message(), "tensor \"w\": 10 bytes given but shape [3] of F32 is 12 bytes");
}

TEST(SnapshotZeroCopy, TensorDataPointsIntoTheGivenBytes) {
  auto a = Pattern(100, 1);
  auto built = BuildSnapshot({{{"a", DType::kU8, {100}}, a}}, VersionStamp{});
  ASSERT_TRUE(built.ok());
  // Parse over a caller-owned buffer: views point inside it, and the owner is held.
  auto storage = std::make_shared<std::vector<std::byte>>(built->bytes().begin(), built->bytes().end());
  std::span<const std::byte> view(*storage);
  auto parsed = Snapshot::Parse(view, storage);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(storage.use_count(), 2);
  EXPECT_EQ(parsed->bytes().data(), view.data());
  const TensorInfo* t = parsed->find("a");
  EXPECT_EQ(parsed->tensor_data(*t).data(), view.data() + parsed->data_offset() + t->begin);
  EXPECT_TRUE(Inside(parsed->tensor_data(*t), view));
  Snapshot copy = *parsed;
  parsed = Status::Cancelled("drop");
  EXPECT_EQ(storage.use_count(), 2) << "a copy shares the owner";
  copy = Snapshot();
  EXPECT_EQ(storage.use_count(), 1);

  // FromBuffer keeps the vector's own storage.
  std::vector<std::byte> owned(built->bytes().begin(), built->bytes().end());
  const std::byte* where = owned.data();
  auto from_buffer = Snapshot::FromBuffer(std::move(owned));
  ASSERT_TRUE(from_buffer.ok());
  EXPECT_EQ(from_buffer->bytes().data(), where);
}

TEST(SnapshotZeroCopy, OpenFileViewsTheMapping) {
  auto a = Pattern(4096 * 3, 2);
  auto built = BuildSnapshot({{{"a", DType::kU8, {4096 * 3}}, a}}, VersionStamp{});
  ASSERT_TRUE(built.ok());
  testing::TempDir dir;
  testing::WriteFile(dir.path() / "f.safetensors", built->bytes());
  auto opened = Snapshot::OpenFile(dir.path() / "f.safetensors");
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ASSERT_NE(opened->owner(), nullptr);
  EXPECT_EQ(opened->bytes().data(), static_cast<const std::byte*>(opened->owner().get()));
  EXPECT_EQ(opened->bytes().size(), built->bytes().size());
  EXPECT_TRUE(Inside(opened->tensor_data(opened->tensors()[0]), opened->bytes()));
  EXPECT_TRUE(SameBytes(opened->tensor_data(opened->tensors()[0]), a));
}

TEST(SnapshotChecksum, VerifyReportsOkMismatchAndAbsent) {
  auto a = Pattern(64, 3);
  auto built = BuildSnapshot({{{"a", DType::kU8, {64}}, a}}, VersionStamp{});
  ASSERT_TRUE(built.ok());
  EXPECT_TRUE(built->VerifyChecksum().ok());

  std::vector<std::byte> bytes(built->bytes().begin(), built->bytes().end());
  bytes.back() ^= std::byte{1};
  auto tampered = Snapshot::FromBuffer(bytes);
  ASSERT_TRUE(tampered.ok()) << "without verify_checksum the structure alone is checked";
  Status st = tampered->VerifyChecksum();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_EQ(st.message(), "checksum mismatch: viper.checksum is " + checksum_hex(built->compute_checksum()) +
                              " but the data region (64 bytes) hashes to " + checksum_hex(tampered->compute_checksum()));
  auto verified = Snapshot::FromBuffer(bytes, ParseOptions{.verify_checksum = true});
  ASSERT_FALSE(verified.ok());
  EXPECT_EQ(verified.status().message(), st.message());

  auto plain = Snapshot::FromBuffer(Raw("{}"), ParseOptions{.verify_checksum = true});
  ASSERT_TRUE(plain.ok()) << "verify_checksum without require_checksum accepts a file without checksum";
  EXPECT_EQ(plain->VerifyChecksum().code(), StatusCode::kNotFound);
  EXPECT_EQ(plain->VerifyChecksum().message(), "no viper.checksum in __metadata__");
}

// A file from an independent writer, assembled by hand from the published format: key order
// differs from data order, the header is padded with spaces, no Viper metadata at all.
TEST(IndependentWriter, HandAssembledFileReadsCorrectly) {
  const float b_values[2] = {1.5f, -2.0f};
  const int16_t a_values[4] = {1, -2, 300, -32768};
  std::string data(8 + 8, '\0');
  std::memcpy(data.data(), a_values, 8);
  std::memcpy(data.data() + 8, b_values, 8);
  std::string header =
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("__metadata__":{"format":"pt"},)"
      R"( "a" : { "shape" : [2, 2], "data_offsets" : [0, 8], "dtype" : "I16" } })";
  header += std::string(13, ' ');
  testing::TempDir dir;
  testing::WriteFile(dir.path() / "hf.safetensors", Raw(header, data, 0));
  auto s = Snapshot::OpenFile(dir.path() / "hf.safetensors", ParseOptions{.verify_checksum = true});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->tensors().size(), 2u);
  EXPECT_EQ(s->tensors()[0].name, "a");
  EXPECT_EQ(s->tensors()[1].name, "b");
  EXPECT_EQ(s->data_offset(), 8 + header.size()) << "a data region at any offset is accepted";
  EXPECT_EQ(s->find("a")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(s->find("a")->dtype, DType::kI16);
  int16_t a_back[4];
  float b_back[2];
  std::memcpy(a_back, s->tensor_data(*s->find("a")).data(), 8);
  std::memcpy(b_back, s->tensor_data(*s->find("b")).data(), 8);
  EXPECT_EQ(std::vector<int16_t>(a_back, a_back + 4), std::vector<int16_t>(a_values, a_values + 4));
  EXPECT_EQ(std::vector<float>(b_back, b_back + 2), std::vector<float>(b_values, b_values + 2));
  EXPECT_EQ(s->meta("format"), "pt");
  EXPECT_EQ(s->version(), std::nullopt);
  EXPECT_EQ(s->declared_checksum(), std::nullopt);
}

TEST(IndependentWriter, DeclaredAlignmentPaddingIsAccepted) {
  std::string header =
      R"({"__metadata__":{"viper.alignment":"32"},)"
      R"("x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
      R"("y":{"dtype":"U8","shape":[0],"data_offsets":[32,32]},)"
      R"("z":{"dtype":"U8","shape":[2],"data_offsets":[32,34]}})";
  auto s = Snapshot::FromBuffer(Raw(header, std::string(34, 'q')));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->tensors().size(), 3u);
  // Without padding the same tensors may also sit back to back.
  std::string packed =
      R"({"__metadata__":{"viper.alignment":"32"},)"
      R"("x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
      R"("z":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})";
  EXPECT_TRUE(Snapshot::FromBuffer(Raw(packed, std::string(5, 'q'))).ok());
}

// A header of 640 bytes: the length prefix begins 0x80 0x02 like a pickle, and is not taken for one.
TEST(IndependentWriter, HeaderLengthThatBeginsLikeAPickleIsRead) {
  std::string header = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  header += std::string(640 - header.size(), ' ');
  auto bytes = Raw(header, "q", 0);
  ASSERT_EQ(bytes[0], std::byte{0x80});
  ASSERT_EQ(bytes[1], std::byte{0x02});
  auto s = Snapshot::FromBuffer(bytes);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->tensors().size(), 1u);
}

// An empty tensor's other dims may be large while they span at most 2^63-1 bytes (numpy's limit).
TEST(IndependentWriter, EmptyTensorWithLargeOtherDimsIsAccepted) {
  auto s = Snapshot::FromBuffer(Raw(R"({"w":{"dtype":"F32","shape":[0,2305843009213693951],"data_offsets":[0,0]}})"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->find("w")->num_elements(), 0u);
  EXPECT_EQ(s->find("w")->nbytes(), 0u);
}

TEST(IndependentWriter, UnknownViperKeysAndNonNumericValuesAreMetadataOnly) {
  auto s = Snapshot::FromBuffer(Raw(R"({"__metadata__":{"viper.version":"x12","viper.future":"?"}})"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->version(), std::nullopt);
  EXPECT_EQ(s->meta("viper.future"), "?");
}

}  // namespace
}  // namespace viper
