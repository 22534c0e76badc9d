// Round trips for every control message and one clear error for each kind of malformed frame.
#include "net/protocol.h"
#include "viper/metrics.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace viper::proto {
namespace {

VersionInfo SampleInfo() {
  VersionInfo v;
  v.model = "nt3";
  v.version = 42;
  v.size = 600'000'000;
  v.checksum = 0x0123456789abcdefULL;
  v.step = 4200;
  v.publish_ns = 1'700'000'000'000'000'000;
  v.completed_ns = 1'700'000'000'100'000'000;
  v.metadata = {{"loss", "0.25"}, {"viper.model", "nt3"}};
  v.replicas = {{ReplicaKind::kHostSegment, "host-a", "viper.123.4"},
                {ReplicaKind::kNode, "host-a", "127.0.0.1:7000"},
                {ReplicaKind::kFile, "host-a", "/pfs/nt3/42.safetensors"},
                {ReplicaKind::kRelay, "host-b", "10.0.0.2:7301"}};
  return v;
}

std::vector<Message> AllMessages() {
  return {
      Hello{"secret", "consumer-1", "boot:ns", 1234},
      HelloOk{"node-a", "boot:ns", 99},
      Subscribe{"nt3", kSubscribeIncoming},
      Unsubscribe{"nt3"},
      Notify{SampleInfo()},
      Fetch{7, "nt3", 42, FetchMode::kSend, 1ull << 40, 4 << 20},
      Fetch{7, "nt3", 42, FetchMode::kSend, 1ull << 40, 4 << 20, 41, 0xfeedfacecafebeefULL},
      Fetch{7, "nt3", 42, FetchMode::kSend, 1ull << 40, 4 << 20, 0, 0, 123'456'789},
      FetchOk{7, FetchMode::kLease, SampleInfo(), "viper.123.4", 0, 0, Encoding::kFull, 0, ""},
      FetchOk{7, FetchMode::kSend, SampleInfo(), "", 0, 0, Encoding::kDelta, 41, "delta against 41"},
      Release{"nt3", 42},
      Ack{"nt3", 42},
      Error{7, ErrorCode::kNotFound, "model nt3 has no version 41"},
      Publish{8, "nt3", 1 << 20, 5, 17, 4 << 20},
      PublishReady{8, 99},
      PublishOk{8, 43},
      List{9},
      ListReply{9, {SampleInfo(), SampleInfo()}},
      ReplicaAnnounce{"nt3", 42, {ReplicaKind::kNode, "boot:ns2", "10.0.0.2:7301"}},
      DeltaPart{7, 3, 1 << 20, false},
      DeltaPart{7, 4, 17, true},
      Incoming{SampleInfo()},
      Stats{10},
      StatsReply{10, {{"bytes_sent", 600'000'000}, {"peers", 3}}},
      FetchOk{7, FetchMode::kSend, SampleInfo(), "", 4 << 20, 143, Encoding::kFullSealedLater, 0, ""},
      Sealed{7, SampleInfo(), std::string("\x10\0\0\0\0\0\0\0{\"a\":{}}       ", 24)},
  };
}

TEST(Protocol, EveryMessageRoundTrips) {
  for (const Message& m : AllMessages()) {
    auto bytes = Encode(m);
    auto decoded = Decode(bytes);
    ASSERT_TRUE(decoded.ok()) << message_type_name(type_of(m)) << ": " << decoded.status().ToString();
    EXPECT_EQ(*decoded, m) << message_type_name(type_of(m));
    EXPECT_EQ(type_of(*decoded), type_of(m));
  }
}

TEST(Protocol, EveryTruncationIsRejected) {
  for (const Message& m : AllMessages()) {
    auto bytes = Encode(m);
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      auto decoded = Decode(std::span(bytes).first(cut));
      ASSERT_FALSE(decoded.ok()) << message_type_name(type_of(m)) << " cut at " << cut;
      EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

void SetLength(std::vector<std::byte>& frame, uint32_t length) { std::memcpy(frame.data() + 8, &length, 4); }

Status DecodeStatus(const std::vector<std::byte>& frame) { return Decode(frame).status(); }

TEST(Protocol, ShortFrame) {
  std::vector<std::byte> frame(5);
  EXPECT_NE(DecodeStatus(frame).message().find("shorter than the 12-byte header"), std::string::npos);
}

TEST(Protocol, BadMagic) {
  auto frame = Encode(Subscribe{"nt3"});
  frame[0] = std::byte{'X'};
  EXPECT_NE(DecodeStatus(frame).message().find("bad magic"), std::string::npos);
}

TEST(Protocol, WrongProtocolVersion) {
  auto frame = Encode(Subscribe{"nt3"});
  frame[4] = std::byte{9};
  Status st = DecodeStatus(frame);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("protocol version 9 not supported"), std::string::npos);
}

TEST(Protocol, UnknownType) {
  auto frame = Encode(Subscribe{"nt3"});
  frame[6] = std::byte{200};
  EXPECT_NE(DecodeStatus(frame).message().find("unknown message type 200"), std::string::npos);
}

TEST(Protocol, LengthFieldDisagreesWithFrame) {
  auto frame = Encode(Subscribe{"nt3"});
  SetLength(frame, 1000);
  EXPECT_NE(DecodeStatus(frame).message().find("length field says 1000"), std::string::npos);
}

TEST(Protocol, TrailingBytes) {
  auto frame = Encode(Subscribe{"nt3"});
  frame.push_back(std::byte{0});
  SetLength(frame, static_cast<uint32_t>(frame.size() - kFrameHeaderBytes));
  EXPECT_NE(DecodeStatus(frame).message().find("1 trailing bytes"), std::string::npos);
}

TEST(Protocol, StringLongerThanFrame) {
  auto frame = Encode(Subscribe{"nt3"});
  uint32_t huge = 1000;
  std::memcpy(frame.data() + kFrameHeaderBytes, &huge, 4);
  Status st = DecodeStatus(frame);
  EXPECT_NE(st.message().find("model: string of 1000 bytes but only 4 remain"), std::string::npos) << st.message();
}

TEST(Protocol, StringBeyondLimit) {
  auto frame = Encode(Subscribe{"nt3"});
  uint32_t huge = kMaxStringBytes + 1;
  std::memcpy(frame.data() + kFrameHeaderBytes, &huge, 4);
  EXPECT_NE(DecodeStatus(frame).message().find("exceeds the limit"), std::string::npos);
}

TEST(Protocol, LyingCountDoesNotAllocate) {
  ListReply reply{1, {}};
  auto frame = Encode(reply);
  uint32_t count = kMaxListEntries;  // within the limit but far beyond the bytes present
  std::memcpy(frame.data() + kFrameHeaderBytes + 8, &count, 4);
  EXPECT_NE(DecodeStatus(frame).message().find("does not fit"), std::string::npos);
}

TEST(Protocol, UnknownEnumValues) {
  auto fetch = Encode(Fetch{1, "m", 0, FetchMode::kLease, 0, 0});
  // request_id(8) + model(4+1) + version(8) then mode.
  fetch[kFrameHeaderBytes + 8 + 5 + 8] = std::byte{7};
  EXPECT_NE(DecodeStatus(fetch).message().find("unknown fetch mode 7"), std::string::npos);

  Notify n{SampleInfo()};
  n.info.metadata.clear();
  n.info.replicas = {{ReplicaKind::kNode, "", ""}};
  auto frame = Encode(n);
  frame[frame.size() - 9] = std::byte{9};  // kind byte of the only replica (then two empty strings)
  EXPECT_NE(DecodeStatus(frame).message().find("unknown replica kind 9"), std::string::npos);

  auto subscribe = Encode(Subscribe{"m", 0});
  subscribe.back() = std::byte{6};  // flags: only kSubscribeIncoming (1) and kSubscribeDevice (2) are defined
  EXPECT_NE(DecodeStatus(subscribe).message().find("unknown subscribe flags 6"), std::string::npos);
  subscribe.back() = std::byte{3};
  auto both = Decode(subscribe);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(std::get<Subscribe>(*both).flags, kSubscribeIncoming | kSubscribeDevice);
}

// SEALED's header is a snapshot header: at least the 8-byte length, within the version's size and
// the limit; FETCH_OK's "sealed later" encoding belongs to a SEND.
TEST(Protocol, SealedHeaderAndEncodingAreChecked) {
  Sealed short_header{7, SampleInfo(), "1234567"};
  EXPECT_NE(DecodeStatus(Encode(short_header)).message().find("SEALED header: 7 bytes"), std::string::npos);
  Sealed beyond{7, SampleInfo(), std::string(64, ' ')};
  beyond.info.size = 32;
  EXPECT_NE(DecodeStatus(Encode(beyond)).message().find("within the version's 32"), std::string::npos);
  auto huge = Encode(Sealed{7, SampleInfo(), std::string(16, ' ')});
  uint32_t lying = kMaxSealedHeaderBytes + 1;
  std::memcpy(huge.data() + huge.size() - 16 - 4, &lying, 4);
  EXPECT_NE(DecodeStatus(huge).message().find("exceed the limit of"), std::string::npos);
  FetchOk lease{7, FetchMode::kLease, SampleInfo(), "viper.1.2", 0, 0, Encoding::kFullSealedLater, 0, ""};
  EXPECT_NE(DecodeStatus(Encode(lease)).message().find("is a SEND's"), std::string::npos);
}

// FETCH's offset (resume a broken SEND) is an optional trailing field: absent means 0, so a FETCH
// without one is byte for byte the older frame; an explicit 0, an offset on a LEASE or with a delta
// base are refused by name.
TEST(Protocol, FetchOffsetIsOptionalAndChecked) {
  Fetch plain{7, "nt3", 42, FetchMode::kSend, 1ull << 40, 4 << 20};
  Fetch resumed = plain;
  resumed.offset = 4096;
  EXPECT_EQ(Encode(resumed).size(), Encode(plain).size() + 8);
  auto with_offset = [&](Fetch f, uint64_t offset) {  // f's frame with the 8 offset bytes appended
    auto frame = Encode(f);
    frame.resize(frame.size() + 8);
    std::memcpy(frame.data() + frame.size() - 8, &offset, 8);
    SetLength(frame, static_cast<uint32_t>(frame.size() - kFrameHeaderBytes));
    return frame;
  };
  EXPECT_NE(DecodeStatus(with_offset(plain, 0)).message().find("FETCH offset: 0 is sent by omitting the field"),
            std::string::npos)
      << DecodeStatus(with_offset(plain, 0)).message();
  Fetch lease{7, "nt3", 42, FetchMode::kLease, 0, 0};
  EXPECT_NE(DecodeStatus(with_offset(lease, 64)).message().find("offset: an offset resumes a SEND"), std::string::npos);
  Fetch delta = plain;
  delta.base_version = 41;
  EXPECT_NE(DecodeStatus(with_offset(delta, 64)).message().find("cannot go with a delta base"), std::string::npos);
  auto partial = Encode(plain);  // 4 of the 8 offset bytes: truncated, named
  partial.resize(partial.size() + 4);
  SetLength(partial, static_cast<uint32_t>(partial.size() - kFrameHeaderBytes));
  EXPECT_NE(DecodeStatus(partial).message().find("offset: truncated"), std::string::npos);
}

TEST(Protocol, DuplicateCounterName) {
  auto frame = Encode(StatsReply{1, {{"a", 1}, {"b", 2}}});
  auto it = std::find(frame.rbegin(), frame.rend(), std::byte{'b'});
  ASSERT_NE(it, frame.rend());
  *it = std::byte{'a'};
  EXPECT_NE(DecodeStatus(frame).message().find("counters: duplicate name"), std::string::npos);
}

// Histograms travel as ordinary counters (hist_NAME_us_le_BOUND, hist_NAME_us_sum): the frame
// layout of STATS_REPLY is the one older peers decode, and they come back out by name.
TEST(Protocol, StatsReplyCarriesHistogramsAsCounters) {
  LatencyRecorder r;
  r.Record(int64_t{4} * 1'000'000);
  std::map<std::string, uint64_t> counters = {{"bytes_sent", 7}};
  AddHistogramCounters(counters, "fetch_send", r.Snapshot());
  auto frame = Encode(StatsReply{3, counters});
  auto decoded = Decode(frame);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  const auto& reply = std::get<StatsReply>(*decoded);
  EXPECT_EQ(reply.counters, counters);
  auto hs = HistogramsFromCounters(reply.counters);
  ASSERT_EQ(hs.size(), 1u);
  EXPECT_EQ(hs[0].count(), 1u);
  EXPECT_EQ(hs[0].sum_us, 4000u);
}

TEST(Protocol, DuplicateMetadataKey) {
  Notify n{SampleInfo()};
  n.info.replicas.clear();
  n.info.metadata = {{"a", "1"}, {"b", "2"}};
  auto frame = Encode(n);
  // Turn key "b" into "a": find the second key's byte.
  auto it = std::find(frame.rbegin(), frame.rend(), std::byte{'b'});
  ASSERT_NE(it, frame.rend());
  *it = std::byte{'a'};
  EXPECT_NE(DecodeStatus(frame).message().find("duplicate key"), std::string::npos);
}

}  // namespace
}  // namespace viper::proto

// The fuzz seeds are frames assembled by fuzz/make_protocol_seeds.py straight from
// docs/PROTOCOL.md, independently of Encode: each must decode to its type and re-encode to the
// same bytes (the document and the codec agree), and the other-version seed must be refused.
namespace viper::proto {
namespace {

std::vector<std::byte> ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

TEST(ProtocolDocument, HandAssembledFramesDecodeAndReEncodeIdentically) {
  std::filesystem::path dir = std::filesystem::path(VIPER_SOURCE_DIR) / "fuzz" / "corpus" / "protocol";
  int checked = 0;
  for (int type = 1; type <= 21; ++type) {
    std::filesystem::path found;
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().filename().string().rfind((type < 10 ? "0" : "") + std::to_string(type) + "_", 0) == 0)
        found = entry.path();
    ASSERT_FALSE(found.empty()) << "no seed for message type " << type << " in " << dir;
    auto bytes = ReadAll(found);
    auto decoded = Decode(bytes);
    ASSERT_TRUE(decoded.ok()) << found << ": " << decoded.status().ToString();
    EXPECT_EQ(static_cast<int>(type_of(*decoded)), type) << found;
    EXPECT_EQ(Encode(*decoded), bytes) << found;
    ++checked;
  }
  EXPECT_EQ(checked, 21);
  auto other = Decode(ReadAll(dir / "99_other_version"));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace viper::proto
