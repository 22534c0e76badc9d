// The delta codec: bit-exact round trips for every dtype (NaN payloads, -0.0), bases and targets
// with different tensor sets, shapes, dtypes and metadata, the method each kind of change gets,
// streaming in parts, and a strict decoder (every flipped or missing byte is an error or a target
// whose checksum differs; never a crash: this test also runs under ASan).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "viper/delta.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

Tensor Make(std::string name, DType dtype, int64_t elements, uint64_t seed) {
  return {std::move(name), dtype, {elements}, RandomBytes(static_cast<size_t>(elements) * dtype_size(dtype), seed)};
}

Snapshot Build(const std::vector<Tensor>& tensors, uint64_t version, std::map<std::string, std::string> meta = {},
               uint64_t alignment = 64) {
  std::vector<TensorData> data;
  for (const auto& t : tensors) data.push_back({{t.name, t.dtype, t.shape}, t.bytes});
  VersionStamp stamp;
  stamp.model = "m";
  stamp.version = version;
  auto snap = BuildSnapshot(data, stamp, std::move(meta), alignment);
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  return std::move(snap).value();
}

// Changes `fraction` of the elements of t (each to a different value).
void Change(Tensor& t, double fraction, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u;
  const size_t w = dtype_size(t.dtype);
  for (size_t i = 0; i < t.bytes.size() / w; ++i)
    if (u(rng) < fraction) t.bytes[i * w] ^= static_cast<std::byte>(1 + rng() % 255);
}

std::vector<std::byte> RoundTrip(const Snapshot& base, const Snapshot& target, DeltaBlockStats* stats = nullptr,
                                 DeltaOptions options = {}) {
  auto delta = EncodeDelta(base, base.compute_checksum(), target, target.compute_checksum(), options, stats);
  EXPECT_TRUE(delta.ok()) << delta.status().ToString();
  std::vector<std::byte> out(target.bytes().size(), std::byte{0x5a});
  Status st = DecodeDelta(base.bytes(), base.compute_checksum(), *delta, out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(0, std::memcmp(out.data(), target.bytes().data(), out.size())) << "decoded target differs";
  return std::move(delta).value();
}

TEST(DeltaTest, EveryDtypeRoundTripsBitExact) {
  for (DType dtype : kAllDTypes) {
    for (double fraction : {0.0, 0.003, 0.05, 0.3, 1.0}) {
      Tensor t = Make("w", dtype, 30011, 7);
      Snapshot base = Build({t}, 1);
      Change(t, fraction, 11);
      Snapshot target = Build({t}, 2);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " fraction " + std::to_string(fraction));
      DeltaBlockStats stats;
      RoundTrip(base, target, &stats);
      if (fraction == 0.0) {
        EXPECT_EQ(stats.blocks[static_cast<int>(DeltaMethod::kZero)], 1u);
      }
    }
  }
}

TEST(DeltaTest, NanPayloadsAndSignedZerosSurvive) {
  // Bit patterns a float comparison would call equal (+0/-0) or never equal (NaNs): a codec that
  // looked at values instead of bits would lose them.
  std::vector<uint32_t> f32 = {0x00000000, 0x80000000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x7fbfffff, 0xff800000,
                               0x00000001, 0x80000001, 0x3f800000};
  std::vector<uint16_t> half = {0x0000, 0x8000, 0x7e00, 0xfe01, 0x7c01, 0x7fff, 0xffff, 0x0001};
  std::vector<uint64_t> f64 = {0, 0x8000000000000000ull, 0x7ff8000000000000ull, 0xfff0000000000001ull,
                               0x7ff0000000000123ull};
  auto bytes_of = [](const auto& v) {
    std::vector<std::byte> b(v.size() * sizeof(v[0]));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  std::vector<Tensor> base_t = {{"f32", DType::kF32, {10}, bytes_of(f32)},
                                {"f16", DType::kF16, {8}, bytes_of(half)},
                                {"bf16", DType::kBF16, {8}, bytes_of(half)},
                                {"f64", DType::kF64, {5}, bytes_of(f64)}};
  // The target turns every value into another that compares equal or is another NaN.
  std::vector<Tensor> target_t = base_t;
  for (auto& t : target_t) {
    const size_t w = dtype_size(t.dtype);
    for (size_t i = 0; i < t.bytes.size(); i += w) t.bytes[i + w - 1] ^= std::byte{0x80};  // flip the sign bit
  }
  Snapshot base = Build(base_t, 1);
  Snapshot target = Build(target_t, 2);
  RoundTrip(base, target);
  RoundTrip(target, base);
  float neg_zero;
  std::memcpy(&neg_zero, target.tensor_data(*target.find("f32")).data(), 4);
  EXPECT_TRUE(neg_zero == 0.0f && std::signbit(neg_zero));
}

TEST(DeltaTest, DifferentTensorSetsShapesDtypesAndMetadata) {
  Tensor kept = Make("kept", DType::kF32, 50000, 1);
  Tensor reshaped = Make("reshaped", DType::kF32, 4096, 2);
  Tensor retyped = Make("retyped", DType::kF32, 1000, 3);
  Tensor resized = Make("resized", DType::kBF16, 7000, 4);
  Tensor dropped = Make("dropped", DType::kI64, 333, 5);
  Snapshot base = Build({kept, reshaped, retyped, resized, dropped}, 1, {{"lr", "0.1"}}, 64);
  Change(kept, 0.01, 9);
  reshaped.shape = {64, 64};                      // same bytes, other shape: still XORed
  retyped.dtype = DType::kI32;                    // other dtype: as-is
  resized = Make("resized", DType::kBF16, 7001, 6);  // other length: as-is
  Tensor added = Make("added", DType::kU8, 12345, 7);
  Tensor empty{"empty", DType::kF16, {0}, {}};
  Snapshot target = Build({added, resized, kept, empty, retyped, reshaped}, 2, {{"lr", "0.05"}, {"note", "x"}}, 1);
  DeltaBlockStats stats;
  RoundTrip(base, target, &stats);
  RoundTrip(target, base);
  // Against an empty base, everything is coded as-is.
  Snapshot nothing = Build({}, 1);
  RoundTrip(nothing, target);
  RoundTrip(target, nothing);
}

TEST(DeltaTest, EachKindOfChangeGetsItsMethod) {
  Tensor same = Make("same", DType::kF32, 1 << 18, 1);
  Tensor sparse = Make("sparse", DType::kBF16, 1 << 19, 2);
  Tensor noisy = Make("noisy", DType::kF32, 1 << 18, 3);
  Snapshot base = Build({same, sparse, noisy}, 1);
  Change(sparse, 0.01, 4);
  noisy = Make("noisy", DType::kF32, 1 << 18, 5);  // unrelated random bytes
  Snapshot target = Build({same, sparse, noisy}, 2);
  DeltaBlockStats stats;
  auto delta = RoundTrip(base, target, &stats);
  EXPECT_EQ(stats.target_bytes[static_cast<int>(DeltaMethod::kZero)], same.bytes.size());
  EXPECT_EQ(stats.target_bytes[static_cast<int>(DeltaMethod::kSparse)], sparse.bytes.size());
  EXPECT_EQ(stats.target_bytes[static_cast<int>(DeltaMethod::kRaw)] + stats.target_bytes[static_cast<int>(DeltaMethod::kPlanes)],
            target.bytes().size() - same.bytes.size() - sparse.bytes.size());
  // 1% of the bf16 elements changed: the sparse tensor costs about 3-4 bytes per changed element.
  EXPECT_LT(stats.encoded_bytes[static_cast<int>(DeltaMethod::kSparse)], sparse.bytes.size() / 30);
  // An unchanged tensor costs only block headers.
  EXPECT_LT(stats.encoded_bytes[static_cast<int>(DeltaMethod::kZero)], 100u);
}

TEST(DeltaTest, UnchangedSnapshotCostsHeadersOnly) {
  Tensor a = Make("a", DType::kF32, 1 << 20, 1);
  Snapshot base = Build({a}, 1);
  Snapshot target = Build({a}, 2);
  auto delta = RoundTrip(base, target);
  EXPECT_LT(delta.size(), 4096u) << "4 MiB unchanged tensor";
}

// Encodes block by block and feeds the decoder one record-aligned part at a time.
TEST(DeltaTest, StreamsInParts) {
  Tensor a = Make("a", DType::kF32, 300000, 1), b = Make("b", DType::kBF16, 500000, 2);
  Snapshot base = Build({a, b}, 1);
  Change(a, 0.2, 3);
  Change(b, 0.001, 4);
  Snapshot target = Build({a, b}, 2);
  DeltaOptions options;
  options.block_bytes = 64 << 10;
  auto enc = DeltaEncoder::Make(base, base.compute_checksum(), target, target.compute_checksum(), options);
  ASSERT_TRUE(enc.ok());
  std::vector<std::byte> out(target.bytes().size());
  DeltaDecoder decoder(base.bytes(), base.compute_checksum(), out);
  DeltaScratch scratch;
  std::vector<std::byte> part;
  enc->AppendHeader(&part);
  uint64_t last = 0;
  for (size_t i = 0; i < enc->blocks(); ++i) {
    enc->EncodeBlock(i, scratch, &part);
    if (i % 3 == 2 || i + 1 == enc->blocks()) {
      ASSERT_TRUE(decoder.Feed(part).ok());
      part.clear();
      EXPECT_EQ(decoder.decoded_bytes(), enc->target_end_of(i + 1));
      EXPECT_GT(decoder.decoded_bytes(), last);
      last = decoder.decoded_bytes();
    }
  }
  EXPECT_TRUE(decoder.complete());
  EXPECT_EQ(0, std::memcmp(out.data(), target.bytes().data(), out.size()));
}

TEST(DeltaTest, RefusesAnotherBase) {
  Tensor a = Make("a", DType::kF32, 1000, 1);
  Snapshot base = Build({a}, 1);
  Change(a, 0.5, 2);
  Snapshot target = Build({a}, 2);
  auto delta = EncodeDelta(base, base.compute_checksum(), target, target.compute_checksum());
  ASSERT_TRUE(delta.ok());
  std::vector<std::byte> out(target.bytes().size());
  Status st = DecodeDelta(target.bytes(), target.compute_checksum(), *delta, out);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("made against a base"), std::string::npos) << st.message();
  std::vector<std::byte> small(target.bytes().size() - 1);
  st = DecodeDelta(base.bytes(), base.compute_checksum(), *delta, small);
  EXPECT_NE(st.message().find("target of"), std::string::npos) << st.message();
}

// Every single flipped byte and every truncation of a delta that uses all four methods: the
// decoder reports an error, or what it wrote has another checksum than the target (the caller's
// check rejects it), or it is the target (a flip in a payload byte zstd never reads back). Never
// anything else, and never an access outside the buffers (ASan).
TEST(DeltaTest, CorruptedStreamsAreRejectedOrFailTheChecksum) {
  Tensor same = Make("same", DType::kF32, 2000, 1), sparse = Make("sparse", DType::kBF16, 20000, 2),
         dense = Make("dense", DType::kF32, 3000, 3), fresh = Make("fresh", DType::kU8, 500, 4);
  Snapshot base = Build({same, sparse, dense}, 1);
  Change(sparse, 0.01, 5);
  Change(dense, 0.5, 6);
  Snapshot target = Build({same, sparse, dense, fresh}, 2);
  const uint64_t want = target.compute_checksum();
  DeltaBlockStats stats;
  auto delta = RoundTrip(base, target, &stats);
  for (int m = 0; m < 4; ++m) EXPECT_GT(stats.blocks[m], 0u) << delta_method_name(static_cast<DeltaMethod>(m));
  std::vector<std::byte> out(target.bytes().size());
  const uint64_t data_offset = target.data_offset();
  int errors = 0, wrong = 0;
  for (size_t i = 0; i < delta.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      auto bad = delta;
      bad[i] ^= static_cast<std::byte>(flip);
      Status st = DecodeDelta(base.bytes(), base.compute_checksum(), bad, out);
      if (!st.ok()) {
        EXPECT_EQ(st.code(), StatusCode::kCorruption);
        errors++;
        continue;
      }
      bool same_bytes = std::memcmp(out.data(), target.bytes().data(), out.size()) == 0;
      uint64_t got = checksum64(std::span<const std::byte>(out).subspan(data_offset));
      // A flip in the header region's bytes changes the target header: Parse or the header
      // comparison of the caller catches those; in the data region the checksum does.
      bool header_differs = std::memcmp(out.data(), target.bytes().data(), data_offset) != 0;
      EXPECT_TRUE(same_bytes || got != want || header_differs) << "flip at " << i;
      wrong += !same_bytes;
    }
  }
  EXPECT_GT(errors, 0);
  for (size_t cut = 0; cut < delta.size(); cut += 7) {
    Status st = DecodeDelta(base.bytes(), base.compute_checksum(), std::span(delta).first(cut), out);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << "truncated at " << cut;
  }
  auto longer = delta;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(DecodeDelta(base.bytes(), base.compute_checksum(), longer, out).ok());
}

// An SGD-like step: every fp32 element moves by ~1e-4 of itself (the bench's case (b) in small).
Tensor SgdStep(const Tensor& w, uint64_t seed) {
  Tensor out = w;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (size_t i = 0; i < w.bytes.size() / 4; ++i) {
    float f;
    std::memcpy(&f, w.bytes.data() + i * 4, 4);
    f += f * 1e-4f * noise(rng);
    std::memcpy(out.bytes.data() + i * 4, &f, 4);
  }
  return out;
}

Tensor Weights(std::string name, int64_t elements, uint64_t seed) {
  Tensor t{std::move(name), DType::kF32, {elements}, std::vector<std::byte>(static_cast<size_t>(elements) * 4)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> init(0.0f, 0.02f);
  for (int64_t i = 0; i < elements; ++i) {
    float f = init(rng);
    std::memcpy(t.bytes.data() + i * 4, &f, 4);
  }
  return t;
}

// Plane kinds (0 zero, 1 raw, 2 zstd, 3 bitmap) of every PLANES block, by walking the stream
// (docs/PROTOCOL.md "Delta stream"); *bitmap_at gets the stream offset of the first BITMAP plane.
std::vector<int> PlaneKinds(const std::vector<std::byte>& delta, size_t* bitmap_at = nullptr) {
  std::vector<int> kinds(4);
  size_t pos = kDeltaHeaderRecordBytes;
  while (pos + 28 <= delta.size()) {
    const auto method = static_cast<uint8_t>(delta[pos]);
    const auto width = static_cast<uint8_t>(delta[pos + 1]);
    uint32_t payload = 0;
    std::memcpy(&payload, delta.data() + pos + 24, 4);
    pos += 28;
    if (method == static_cast<uint8_t>(DeltaMethod::kPlanes)) {
      size_t at = pos;
      for (size_t k = 0; k < width; ++k) {
        const auto kind = static_cast<uint8_t>(delta[at]);
        uint32_t bytes = 0;
        std::memcpy(&bytes, delta.data() + at + 1, 4);
        if (kind < 4) kinds[kind]++;
        if (kind == 3 && bitmap_at != nullptr && *bitmap_at == 0) *bitmap_at = at;
        at += 5 + bytes;
      }
    }
    pos += payload;
  }
  return kinds;
}

TEST(DeltaTest, MostlyZeroPlanesAreCodedAsBitmaps) {
  // Odd lengths exercise the kernels' tails.
  for (int64_t elements : {int64_t{1} << 18, int64_t{4099}, int64_t{17}}) {
    Tensor w = Weights("w", elements, 1);
    Snapshot base = Build({w}, 1);
    Snapshot target = Build({SgdStep(w, 2)}, 2);
    DeltaBlockStats stats;
    auto delta = RoundTrip(base, target, &stats);
    if (elements < 1000) continue;  // too few samples to say what a plane looks like
    std::vector<int> kinds = PlaneKinds(delta);
    EXPECT_GT(kinds[3], 0) << elements << " elements: the mantissa plane above the lowest is mostly zero";
    EXPECT_LT(delta.size(), w.bytes.size() / 2) << elements;
  }
}

TEST(DeltaTest, CorruptedBitmapPlanesAreRejected) {
  Tensor w = Weights("w", 4096, 1);
  Snapshot base = Build({w}, 1);
  Snapshot target = Build({SgdStep(w, 2)}, 2);
  auto delta = RoundTrip(base, target);
  size_t at = 0;
  ASSERT_GT(PlaneKinds(delta, &at)[3], 0);
  std::vector<std::byte> out(target.bytes().size());
  const uint64_t bck = base.compute_checksum();
  // The BITMAP header after the plane's 5 bytes: u32 count, u8 codings x2, u16 reserved, u32 bitmap bytes.
  for (size_t field : {size_t{0}, size_t{4}, size_t{5}, size_t{6}, size_t{8}}) {
    for (uint8_t flip : {0x01, 0x02, 0x80}) {
      auto bad = delta;
      bad[at + 5 + field] ^= static_cast<std::byte>(flip);
      Status st = DecodeDelta(base.bytes(), bck, bad, out);
      EXPECT_EQ(st.code(), StatusCode::kCorruption) << "field at +" << field << " flipped by " << int{flip};
      EXPECT_NE(st.message().find("BITMAP"), std::string::npos) << st.ToString();
    }
  }
  // Every byte of the plane flipped: an error, the same target (a zstd frame has bits that do not
  // change its output), or a target whose checksum differs. Never a crash (ASan).
  uint32_t plane_bytes = 0;
  std::memcpy(&plane_bytes, delta.data() + at + 1, 4);
  const uint64_t want = target.compute_checksum();
  for (size_t i = at; i < at + 5 + plane_bytes; ++i) {
    auto bad = delta;
    bad[i] ^= std::byte{0x10};
    if (Status st = DecodeDelta(base.bytes(), bck, bad, out); st.ok()) {
      const bool same = std::memcmp(out.data(), target.bytes().data(), out.size()) == 0;
      EXPECT_TRUE(same || checksum64(std::span<const std::byte>(out).subspan(target.data_offset())) != want)
          << "flip at +" << i - at;
    }
  }
}

TEST(DeltaTest, ReadsVersionOneStreamsButNotBitmapsInThem) {
  Tensor w = Weights("w", 4096, 1);
  Tensor s = Make("s", DType::kBF16, 20000, 2);
  Snapshot base = Build({w, s}, 1);
  Tensor s2 = s;
  Change(s2, 0.01, 3);
  Snapshot sparse_only = Build({w, s2}, 2);
  Snapshot stepped = Build({SgdStep(w, 2), s}, 3);
  std::vector<std::byte> out(base.bytes().size());
  const uint64_t bck = base.compute_checksum();
  auto v1 = RoundTrip(base, sparse_only);
  ASSERT_EQ(PlaneKinds(v1)[3], 0);
  v1[4] = std::byte{1};  // u16 version at offset 4
  EXPECT_TRUE(DecodeDelta(base.bytes(), bck, v1, out).ok());
  auto bitmaps = RoundTrip(base, stepped);
  ASSERT_GT(PlaneKinds(bitmaps)[3], 0);
  bitmaps[4] = std::byte{1};
  EXPECT_EQ(DecodeDelta(base.bytes(), bck, bitmaps, out).code(), StatusCode::kCorruption);
  bitmaps[4] = std::byte{3};
  Status st = DecodeDelta(base.bytes(), bck, bitmaps, out);
  EXPECT_NE(st.message().find("format version 3"), std::string::npos) << st.ToString();
}

TEST(DeltaTest, OptionsAreChecked) {
  Snapshot s = Build({}, 1);
  DeltaOptions options;
  options.block_bytes = 100;
  EXPECT_EQ(DeltaEncoder::Make(s, 0, s, 0, options).status().code(), StatusCode::kInvalidArgument);
  options.block_bytes = 1 << 20;
  options.zstd_level = 1000;
  EXPECT_EQ(DeltaEncoder::Make(s, 0, s, 0, options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace viper
