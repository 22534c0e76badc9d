#include "net/protocol.h"

#include <cstring>
#include <type_traits>

namespace viper::proto {
namespace {

// Appends little-endian fields to a byte vector.
class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(uint16_t v) { raw(&v, sizeof v); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void i64(int64_t v) { raw(&v, sizeof v); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void blob(const std::string& s) { str(s); }  // u32 length + bytes, with its own limit on decode
  std::vector<std::byte>& bytes() { return out_; }

 private:
  void raw(const void* p, size_t n) {  // little-endian host (x86-64, aarch64)
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<std::byte> out_;
};

// Reads fields with bounds checks; the first fault sticks and names the field.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}

  uint8_t u8(const char* field) { uint8_t v = 0; raw(&v, 1, field); return v; }
  uint16_t u16(const char* field) { uint16_t v = 0; raw(&v, 2, field); return v; }
  uint32_t u32(const char* field) { uint32_t v = 0; raw(&v, 4, field); return v; }
  uint64_t u64(const char* field) { uint64_t v = 0; raw(&v, 8, field); return v; }
  int64_t i64(const char* field) { int64_t v = 0; raw(&v, 8, field); return v; }
  std::string str(const char* field) {
    uint32_t n = u32(field);
    if (!ok()) return {};
    if (n > kMaxStringBytes) return fail(field, "string of " + std::to_string(n) + " bytes exceeds the limit of " +
                                                    std::to_string(kMaxStringBytes)), std::string();
    if (n > remaining()) return fail(field, "string of " + std::to_string(n) + " bytes but only " +
                                                std::to_string(remaining()) + " remain"), std::string();
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // u32 length + bytes, at most `limit` (beyond kMaxStringBytes: e.g. a snapshot header).
  std::string blob(const char* field, uint32_t limit) {
    uint32_t n = u32(field);
    if (!ok()) return {};
    if (n > limit) return fail(field, std::to_string(n) + " bytes exceed the limit of " + std::to_string(limit)), std::string();
    if (n > remaining()) return fail(field, std::to_string(n) + " bytes but only " + std::to_string(remaining()) +
                                                " remain"), std::string();
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // A count of entries each at least `min_entry_bytes` long: checked against the limit and the
  // bytes left, so a lying count cannot make us allocate.
  uint32_t count(const char* field, uint32_t limit, size_t min_entry_bytes) {
    uint32_t n = u32(field);
    if (!ok()) return 0;
    if (n > limit) return fail(field, "count " + std::to_string(n) + " exceeds the limit of " + std::to_string(limit)), 0;
    if (static_cast<uint64_t>(n) * min_entry_bytes > remaining())
      return fail(field, "count " + std::to_string(n) + " does not fit in the " + std::to_string(remaining()) +
                             " bytes left"), 0;
    return n;
  }
  bool ok() const { return error_.empty(); }
  size_t remaining() const { return in_.size() - pos_; }
  const std::string& error() const { return error_; }
  void fail(const char* field, const std::string& why) {
    if (error_.empty()) error_ = std::string(field) + ": " + why;
  }

 private:
  void raw(void* dst, size_t n, const char* field) {
    if (!ok()) return;
    if (n > remaining()) {
      fail(field, "truncated (needs " + std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left)");
      return;
    }
    std::memcpy(dst, in_.data() + pos_, n);
    pos_ += n;
  }
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  std::string error_;
};

void put(Writer& w, const Replica& r) {
  w.u8(static_cast<uint8_t>(r.kind));
  w.str(r.host_key);
  w.str(r.locator);
}
void put(Writer& w, const VersionInfo& v) {
  w.str(v.model);
  w.u64(v.version);
  w.u64(v.size);
  w.u64(v.checksum);
  w.u64(v.step);
  w.i64(v.publish_ns);
  w.i64(v.completed_ns);
  w.u32(static_cast<uint32_t>(v.metadata.size()));
  for (const auto& [k, val] : v.metadata) {
    w.str(k);
    w.str(val);
  }
  w.u32(static_cast<uint32_t>(v.replicas.size()));
  for (const auto& r : v.replicas) put(w, r);
}

Replica get_replica(Reader& r) {
  Replica out;
  uint8_t kind = r.u8("replica.kind");
  if (r.ok() && (kind < 1 || kind > 5)) r.fail("replica.kind", "unknown replica kind " + std::to_string(kind));
  out.kind = static_cast<ReplicaKind>(kind);
  out.host_key = r.str("replica.host_key");
  out.locator = r.str("replica.locator");
  return out;
}
VersionInfo get_version_info(Reader& r) {
  VersionInfo v;
  v.model = r.str("model");
  v.version = r.u64("version");
  v.size = r.u64("size");
  v.checksum = r.u64("checksum");
  v.step = r.u64("step");
  v.publish_ns = r.i64("publish_ns");
  v.completed_ns = r.i64("completed_ns");
  uint32_t n = r.count("metadata", kMaxMetadataEntries, 8);
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    std::string key = r.str("metadata.key");
    std::string value = r.str("metadata.value");
    if (r.ok() && !v.metadata.emplace(std::move(key), std::move(value)).second)
      r.fail("metadata", "duplicate key");
  }
  uint32_t m = r.count("replicas", kMaxReplicas, 9);
  for (uint32_t i = 0; i < m && r.ok(); ++i) v.replicas.push_back(get_replica(r));
  return v;
}
Encoding get_encoding(Reader& r) {
  uint8_t e = r.u8("encoding");
  if (r.ok() && (e < 1 || e > 3)) r.fail("encoding", "unknown encoding " + std::to_string(e));
  return static_cast<Encoding>(e);
}
FetchMode get_fetch_mode(Reader& r) {
  uint8_t m = r.u8("mode");
  if (r.ok() && (m < 1 || m > 3)) r.fail("mode", "unknown fetch mode " + std::to_string(m));
  return static_cast<FetchMode>(m);
}

// Payload encoders, one per message.
void put_payload(Writer& w, const Hello& m) { w.str(m.token); w.str(m.client_name); w.str(m.host_key); w.u32(m.pid); }
void put_payload(Writer& w, const HelloOk& m) { w.str(m.node_name); w.str(m.host_key); w.u32(m.pid); }
void put_payload(Writer& w, const Subscribe& m) { w.str(m.model); w.u8(m.flags); }
void put_payload(Writer& w, const Unsubscribe& m) { w.str(m.model); }
void put_payload(Writer& w, const Notify& m) { put(w, m.info); }
void put_payload(Writer& w, const Fetch& m) {
  w.u64(m.request_id); w.str(m.model); w.u64(m.version); w.u8(static_cast<uint8_t>(m.mode)); w.u64(m.tag);
  w.u32(m.chunk_bytes); w.u64(m.base_version); w.u64(m.base_checksum);
  if (m.offset != 0) w.u64(m.offset);  // optional trailing field: absent means 0
}
void put_payload(Writer& w, const FetchOk& m) {
  w.u64(m.request_id); w.u8(static_cast<uint8_t>(m.mode)); put(w, m.info); w.str(m.segment); w.u32(m.chunk_bytes);
  w.u32(m.chunks); w.u8(static_cast<uint8_t>(m.encoding)); w.u64(m.base_version); w.str(m.detail);
}
void put_payload(Writer& w, const DeltaPart& m) { w.u64(m.request_id); w.u32(m.index); w.u32(m.bytes); w.u8(m.last ? 1 : 0); }
void put_payload(Writer& w, const Release& m) { w.str(m.model); w.u64(m.version); }
void put_payload(Writer& w, const Ack& m) { w.str(m.model); w.u64(m.version); }
void put_payload(Writer& w, const Error& m) { w.u64(m.request_id); w.u16(static_cast<uint16_t>(m.code)); w.str(m.text); }
void put_payload(Writer& w, const Publish& m) {
  w.u64(m.request_id); w.str(m.model); w.u64(m.size); w.u64(m.step); w.i64(m.publish_ns); w.u32(m.chunk_bytes);
}
void put_payload(Writer& w, const PublishReady& m) { w.u64(m.request_id); w.u64(m.tag); }
void put_payload(Writer& w, const PublishOk& m) { w.u64(m.request_id); w.u64(m.version); }
void put_payload(Writer& w, const List& m) { w.u64(m.request_id); }
void put_payload(Writer& w, const ListReply& m) {
  w.u64(m.request_id);
  w.u32(static_cast<uint32_t>(m.versions.size()));
  for (const auto& v : m.versions) put(w, v);
}

void put_payload(Writer& w, const ReplicaAnnounce& m) { w.str(m.model); w.u64(m.version); put(w, m.replica); }
void put_payload(Writer& w, const Incoming& m) { put(w, m.info); }
void put_payload(Writer& w, const Stats& m) { w.u64(m.request_id); }
void put_payload(Writer& w, const Sealed& m) { w.u64(m.request_id); put(w, m.info); w.blob(m.header); }
void put_payload(Writer& w, const StatsReply& m) {
  w.u64(m.request_id);
  w.u32(static_cast<uint32_t>(m.counters.size()));
  for (const auto& [name, value] : m.counters) {
    w.str(name);
    w.u64(value);
  }
}

// Payload decoders.
Message get_payload(Reader& r, MessageType type) {
  switch (type) {
    case MessageType::kHello: {
      Hello m; m.token = r.str("token"); m.client_name = r.str("client_name"); m.host_key = r.str("host_key");
      m.pid = r.u32("pid"); return m;
    }
    case MessageType::kHelloOk: {
      HelloOk m; m.node_name = r.str("node_name"); m.host_key = r.str("host_key"); m.pid = r.u32("pid"); return m;
    }
    case MessageType::kSubscribe: {
      Subscribe m; m.model = r.str("model"); m.flags = r.u8("flags");
      if (r.ok() && (m.flags & ~(kSubscribeIncoming | kSubscribeDevice)) != 0) r.fail("flags", "unknown subscribe flags " + std::to_string(m.flags));
      return m;
    }
    case MessageType::kUnsubscribe: return Unsubscribe{r.str("model")};
    case MessageType::kNotify: return Notify{get_version_info(r)};
    case MessageType::kFetch: {
      Fetch m; m.request_id = r.u64("request_id"); m.model = r.str("model"); m.version = r.u64("version");
      m.mode = get_fetch_mode(r); m.tag = r.u64("tag"); m.chunk_bytes = r.u32("chunk_bytes");
      m.base_version = r.u64("base_version"); m.base_checksum = r.u64("base_checksum");
      if (r.ok() && r.remaining() > 0) {
        m.offset = r.u64("offset");
        if (r.ok() && m.offset == 0) r.fail("offset", "0 is sent by omitting the field");
        if (r.ok() && m.mode != FetchMode::kSend)
          r.fail("offset", "an offset resumes a SEND; fetch mode " + std::to_string(static_cast<int>(m.mode)) + " has none");
        if (r.ok() && m.base_version != 0) r.fail("offset", "an offset resumes a full transfer; it cannot go with a delta base");
      }
      return m;
    }
    case MessageType::kFetchOk: {
      FetchOk m; m.request_id = r.u64("request_id"); m.mode = get_fetch_mode(r); m.info = get_version_info(r);
      m.segment = r.str("segment"); m.chunk_bytes = r.u32("chunk_bytes"); m.chunks = r.u32("chunks");
      m.encoding = get_encoding(r); m.base_version = r.u64("base_version"); m.detail = r.str("detail");
      if (r.ok() && m.encoding == Encoding::kFullSealedLater && m.mode != FetchMode::kSend)
        r.fail("encoding", "full, sealed later (3) is a SEND's; fetch mode " + std::to_string(static_cast<int>(m.mode)) + " has none");
      if (r.ok() && m.mode == FetchMode::kDevice && m.segment.size() != kGpuVersionMessageBytes)
        r.fail("segment", "a kDevice FETCH_OK carries the " + std::to_string(kGpuVersionMessageBytes) +
                              "-byte GPU version message, not " + std::to_string(m.segment.size()) + " bytes");
      return m;
    }
    case MessageType::kRelease: { Release m; m.model = r.str("model"); m.version = r.u64("version"); return m; }
    case MessageType::kAck: { Ack m; m.model = r.str("model"); m.version = r.u64("version"); return m; }
    case MessageType::kError: {
      Error m; m.request_id = r.u64("request_id"); m.code = static_cast<ErrorCode>(r.u16("code"));
      m.text = r.str("text"); return m;
    }
    case MessageType::kPublish: {
      Publish m; m.request_id = r.u64("request_id"); m.model = r.str("model"); m.size = r.u64("size");
      m.step = r.u64("step"); m.publish_ns = r.i64("publish_ns"); m.chunk_bytes = r.u32("chunk_bytes"); return m;
    }
    case MessageType::kPublishReady: { PublishReady m; m.request_id = r.u64("request_id"); m.tag = r.u64("tag"); return m; }
    case MessageType::kPublishOk: { PublishOk m; m.request_id = r.u64("request_id"); m.version = r.u64("version"); return m; }
    case MessageType::kList: return List{r.u64("request_id")};
    case MessageType::kListReply: {
      ListReply m; m.request_id = r.u64("request_id");
      uint32_t n = r.count("versions", kMaxListEntries, 60);
      for (uint32_t i = 0; i < n && r.ok(); ++i) m.versions.push_back(get_version_info(r));
      return m;
    }
    case MessageType::kDeltaPart: {
      DeltaPart m; m.request_id = r.u64("request_id"); m.index = r.u32("index"); m.bytes = r.u32("bytes");
      uint8_t last = r.u8("last");
      if (r.ok() && last > 1) r.fail("last", "not a boolean (" + std::to_string(last) + ")");
      if (r.ok() && m.bytes > kMaxDeltaPartBytes)
        r.fail("bytes", std::to_string(m.bytes) + " exceeds the limit of " + std::to_string(kMaxDeltaPartBytes));
      m.last = last == 1;
      return m;
    }
    case MessageType::kReplica: {
      ReplicaAnnounce m; m.model = r.str("model"); m.version = r.u64("version"); m.replica = get_replica(r);
      return m;
    }
    case MessageType::kIncoming: return Incoming{get_version_info(r)};
    case MessageType::kStats: return Stats{r.u64("request_id")};
    case MessageType::kSealed: {
      Sealed m; m.request_id = r.u64("request_id"); m.info = get_version_info(r);
      m.header = r.blob("header", kMaxSealedHeaderBytes);
      if (r.ok() && (m.header.size() < 8 || m.header.size() > m.info.size))
        r.fail("header", std::to_string(m.header.size()) + " bytes: a snapshot header is at least 8 bytes and within the version's " +
                             std::to_string(m.info.size));
      return m;
    }
    case MessageType::kStatsReply: {
      StatsReply m; m.request_id = r.u64("request_id");
      uint32_t n = r.count("counters", kMaxCounters, 12);
      for (uint32_t i = 0; i < n && r.ok(); ++i) {
        std::string name = r.str("counter.name");
        uint64_t value = r.u64("counter.value");
        if (r.ok() && !m.counters.emplace(std::move(name), value).second) r.fail("counters", "duplicate name");
      }
      return m;
    }
  }
  r.fail("type", "unknown message type " + std::to_string(static_cast<unsigned>(type)));
  return Error{};
}

bool known_type(uint16_t t) { return t >= 1 && t <= 21; }

Status malformed(const std::string& why) { return Status::InvalidArgument("malformed message: " + why); }

}  // namespace

std::string_view message_type_name(MessageType type) {
  static constexpr std::string_view kNames[] = {
      "?", "HELLO", "HELLO_OK", "SUBSCRIBE", "UNSUBSCRIBE", "NOTIFY", "FETCH", "FETCH_OK", "RELEASE", "ACK",
      "ERROR", "PUBLISH", "PUBLISH_READY", "PUBLISH_OK", "LIST", "LIST_REPLY", "REPLICA", "DELTA_PART",
      "INCOMING", "STATS", "STATS_REPLY", "SEALED"};
  auto i = static_cast<uint16_t>(type);
  return known_type(i) ? kNames[i] : kNames[0];
}

MessageType type_of(const Message& message) {
  return static_cast<MessageType>(message.index() + 1);  // variant order == enum order
}

std::vector<std::byte> Encode(const Message& message) {
  Writer w;
  w.u32(kMagic);
  w.u16(kProtocolVersion);
  w.u16(static_cast<uint16_t>(type_of(message)));
  w.u32(0);  // payload length, patched below
  std::visit([&](const auto& m) { put_payload(w, m); }, message);
  auto& bytes = w.bytes();
  uint32_t payload = static_cast<uint32_t>(bytes.size() - kFrameHeaderBytes);
  std::memcpy(bytes.data() + 8, &payload, sizeof payload);
  return std::move(bytes);
}

Result<Message> Decode(std::span<const std::byte> frame) {
  if (frame.size() < kFrameHeaderBytes)
    return malformed("frame of " + std::to_string(frame.size()) + " bytes is shorter than the 12-byte header");
  if (frame.size() > kMaxFrameBytes)
    return malformed("frame of " + std::to_string(frame.size()) + " bytes exceeds the limit of " +
                     std::to_string(kMaxFrameBytes));
  Reader header(frame.first(kFrameHeaderBytes));
  uint32_t magic = header.u32("magic");
  uint16_t version = header.u16("version");
  uint16_t type = header.u16("type");
  uint32_t payload = header.u32("length");
  if (magic != kMagic) return malformed("bad magic (not a Viper message)");
  if (payload != frame.size() - kFrameHeaderBytes)
    return malformed("length field says " + std::to_string(payload) + " payload bytes but the frame carries " +
                     std::to_string(frame.size() - kFrameHeaderBytes));
  if (version != kProtocolVersion)
    return Status::FailedPrecondition("protocol version " + std::to_string(version) +
                                      " not supported (this side speaks " + std::to_string(kProtocolVersion) + ")");
  if (!known_type(type)) return malformed("unknown message type " + std::to_string(type));
  Reader body(frame.subspan(kFrameHeaderBytes));
  Message message = get_payload(body, static_cast<MessageType>(type));
  if (!body.ok()) return malformed(std::string(message_type_name(static_cast<MessageType>(type))) + " " + body.error());
  if (body.remaining() != 0)
    return malformed(std::string(message_type_name(static_cast<MessageType>(type))) + " has " +
                     std::to_string(body.remaining()) + " trailing bytes");
  return message;
}

}  // namespace viper::proto
