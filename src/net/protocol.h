// The control protocol between Viper processes: small, versioned, length-checked messages carried
// as UCX active messages (docs/PROTOCOL.md is the reference for every field). In-tree only (the
// wire layer); the catalog types it carries, VersionInfo and Replica, are public in
// include/viper/version_info.h.
//
// Frame: u32 magic 'VIPR' | u16 protocol version | u16 type | u32 payload length | payload.
// Integers little-endian; strings and byte arrays are u32 length + bytes; maps and lists are u32
// count + entries. Decode() accepts only a frame whose every length is consistent with the buffer,
// whose counts are within kLimits, and whose payload is consumed exactly; anything else is an
// error naming the first fault. Decode never reads past the buffer and never allocates more than
// the buffer's size justifies. Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "viper/status.h"
#include "viper/version_info.h"

namespace viper::proto {

inline constexpr uint32_t kMagic = 0x52504956;  // "VIPR" as little-endian bytes
inline constexpr uint16_t kProtocolVersion = 2;  // 2: delta transfers (FETCH base, FETCH_OK encoding, DELTA_PART), fan-out (SUBSCRIBE flags, INCOMING, STATS)
inline constexpr size_t kFrameHeaderBytes = 12;
// kMaxStringBytes, kMaxMetadataEntries, kMaxReplicas: include/viper/version_info.h.
inline constexpr uint32_t kMaxListEntries = 65536;
inline constexpr uint32_t kMaxCounters = 256;
inline constexpr uint32_t kMaxFrameBytes = 64 * 1024 * 1024;
// The bulk chunk of a FETCH (SEND) or PUBLISH: what the client asked (0: the node's own), clamped
// to [64 KiB, 256 MiB]. A PUBLISH's client cuts its bytes with the same rule, so its chunks are
// the receives the node posted.
inline uint32_t ClampChunkBytes(uint32_t asked, uint32_t fallback) {
  return std::clamp<uint32_t>(asked == 0 ? fallback : asked, 64u << 10, 256u << 20);
}

enum class MessageType : uint16_t {
  kHello = 1, kHelloOk = 2, kSubscribe = 3, kUnsubscribe = 4, kNotify = 5, kFetch = 6, kFetchOk = 7,
  kRelease = 8, kAck = 9, kError = 10, kPublish = 11, kPublishReady = 12, kPublishOk = 13,
  kList = 14, kListReply = 15, kReplica = 16, kDeltaPart = 17, kIncoming = 18, kStats = 19, kStatsReply = 20,
  kSealed = 21,
};
std::string_view message_type_name(MessageType type);

struct Hello {
  // Unused, always sent empty and ignored: a node's engine admits only peers that proved the
  // token in the bootstrap handshake (src/net/bootstrap.h), which never sends it.
  std::string token;
  std::string client_name;
  std::string host_key;     // identifies the client's host (same key = shared memory reachable)
  uint32_t pid = 0;
  bool operator==(const Hello&) const = default;
};
struct HelloOk {
  std::string node_name;
  std::string host_key;
  uint32_t pid = 0;
  bool operator==(const HelloOk&) const = default;
};
// flags: kSubscribeIncoming = also send INCOMING for versions the node is still receiving (a relay
// downstream of it, or a consumer on another host, fetches them chunk by chunk as they land).
inline constexpr uint8_t kSubscribeIncoming = 1;
// kSubscribeDevice = also send a device-only NOTIFY (its only replica kDevice, checksum 0) as soon
// as the producer's GPU copy of a version completes, before its host copy is committed (a same-host
// consumer that places versions on a GPU; ignored for peers on another host). The usual NOTIFY of
// the same version follows once the host tier has it.
inline constexpr uint8_t kSubscribeDevice = 2;
struct Subscribe {
  std::string model;
  uint8_t flags = 0;
  bool operator==(const Subscribe&) const = default;
};
struct Unsubscribe { std::string model; bool operator==(const Unsubscribe&) const = default; };
struct Notify { VersionInfo info; bool operator==(const Notify&) const = default; };
// A version the node is receiving now (a relay's transfer from its upstream): not complete here,
// but a FETCH in SEND mode of it is served chunk by chunk as the chunks land. `info` is the
// upstream's (size, checksum of the complete version); its replicas name this node first, as kRelay.
// Sent only to subscribers that asked (kSubscribeIncoming). The NOTIFY follows once it is complete.
struct Incoming { VersionInfo info; bool operator==(const Incoming&) const = default; };

enum class FetchMode : uint8_t {
  kLease = 1,  // grant a lease on the node's segment; the client maps it (same host only)
  kSend = 2,   // send the bytes over UCX in tagged chunks starting at `tag`
  // lease the version's GPU-resident copy (a kDevice replica; same host only): FETCH_OK's
  // `segment` is the 128-byte GPU version message (CUDA IPC handle + layout extent); RELEASE ends
  // the lease (a peer's device leases are released before its host leases of the same version)
  kDevice = 3,
};
inline constexpr size_t kGpuVersionMessageBytes = 128;  // FETCH_OK kDevice: segment's exact size
struct Fetch {
  uint64_t request_id = 0;
  std::string model;
  uint64_t version = 0;      // 0 = the latest
  FetchMode mode = FetchMode::kLease;
  uint64_t tag = 0;          // kSend: chunk i is sent with tag + i
  uint32_t chunk_bytes = 0;  // kSend: requested chunk size
  // kSend: the version the client holds and would take a delta against (0 = none), and the
  // checksum of that version's data region (the node sends a delta only against these bytes).
  uint64_t base_version = 0;
  uint64_t base_checksum = 0;
  // kSend, full: resume a broken transfer at this byte of the snapshot (0 = from the start). The
  // node sends only [offset, size): chunk i covers [offset + i * chunk, ...) with tag + i. On the
  // wire the field follows base_checksum only when nonzero (a node that predates it refuses such a
  // FETCH as Malformed, and the client fetches from the start); an explicit 0 is Malformed.
  uint64_t offset = 0;
  bool operator==(const Fetch&) const = default;
};
enum class Encoding : uint8_t {
  kFull = 1,   // the snapshot's bytes in `chunks` tagged chunks
  kDelta = 2,  // a delta stream (include/viper/delta.h) against base_version, in DELTA_PART messages
  // The snapshot's bytes in `chunks` tagged chunks, of a version still being written at the node
  // (the producer's cut-through): info.checksum is 0 (not known yet) and the header bytes that
  // arrive are provisional. A SEALED for the request follows once the version is sealed; the
  // receiver applies it only after every chunk completed.
  kFullSealedLater = 3,
};
struct FetchOk {
  uint64_t request_id = 0;
  FetchMode mode = FetchMode::kLease;
  VersionInfo info;
  std::string segment;       // kLease: the segment to map read-only
  uint32_t chunk_bytes = 0;  // kSend, kFull: chunk size used
  uint32_t chunks = 0;       // kSend, kFull: number of chunks that follow
  Encoding encoding = Encoding::kFull;
  uint64_t base_version = 0;  // kDelta: the base (the FETCH's base_version)
  std::string detail;         // kSend: why this encoding (e.g. "base 3 is not kept here"); may be empty
  bool operator==(const FetchOk&) const = default;
};
// One part of a delta stream: `bytes` bytes follow as a tagged send with tag = the FETCH's tag +
// `index`. Parts are numbered from 0 and sent in order; `last` marks the final one. An ERROR with
// the request id ends the stream early (e.g. the base was evicted while the delta was encoded).
struct DeltaPart {
  uint64_t request_id = 0;
  uint32_t index = 0;
  uint32_t bytes = 0;
  bool last = false;
  bool operator==(const DeltaPart&) const = default;
};
inline constexpr uint32_t kMaxDeltaPartBytes = 64u << 20;
struct Release {
  std::string model;
  uint64_t version = 0;
  bool operator==(const Release&) const = default;
};
struct Ack {
  std::string model;
  uint64_t version = 0;
  bool operator==(const Ack&) const = default;
};
enum class ErrorCode : uint16_t {
  kMalformed = 1, kBadVersion = 2, kUnauthorized = 3, kNotFound = 4, kBadRequest = 5, kInternal = 6,
  kBusy = 7,
  kAborted = 8,  // a SEND announced by FETCH_OK will not complete: abandon its receives
  kExhausted = 9,  // the node's budget (shared memory, models held) is spent; older peers read it as kInternal
};
struct Error {
  uint64_t request_id = 0;  // 0 if not about a request
  ErrorCode code = ErrorCode::kInternal;
  std::string text;
  bool operator==(const Error&) const = default;
};
// A client hands a complete snapshot buffer to the node: the node answers PublishReady with the
// tag base, the client sends `size` bytes in chunks of chunk_bytes, the node verifies and answers
// PublishOk with the version it assigned.
struct Publish {
  uint64_t request_id = 0;
  std::string model;
  uint64_t size = 0;
  uint64_t step = 0;
  int64_t publish_ns = 0;
  uint32_t chunk_bytes = 0;
  bool operator==(const Publish&) const = default;
};
struct PublishReady {
  uint64_t request_id = 0;
  uint64_t tag = 0;
  bool operator==(const PublishReady&) const = default;
};
struct PublishOk {
  uint64_t request_id = 0;
  uint64_t version = 0;
  bool operator==(const PublishOk&) const = default;
};
struct List {
  uint64_t request_id = 0;
  bool operator==(const List&) const = default;
};
struct ListReply {
  uint64_t request_id = 0;
  std::vector<VersionInfo> versions;  // every version the node holds, by model then version
  bool operator==(const ListReply&) const = default;
};

// A relay node tells its upstream that it now holds (model, version) too: `replica` is of kind
// kNode (the relay's own "host:port" and host key). The upstream lists it among the version's
// replicas (LIST, NOTIFY) until the announcing peer disconnects. No reply.
struct ReplicaAnnounce {
  std::string model;
  uint64_t version = 0;
  Replica replica;
  bool operator==(const ReplicaAnnounce&) const = default;
};

// The end of a FETCH_OK kFullSealedLater transfer: the version is sealed at the node. `info` is
// the complete version's (its checksum, seal and completion time); `header` is the snapshot's
// final bytes [0, 8 + N) (its length prefix and JSON header), which replace the provisional ones
// received. The receiver checks model, version and size against FETCH_OK's and that `header` is
// exactly as long as the header it received, then verifies the whole against info.checksum.
inline constexpr uint32_t kMaxSealedHeaderBytes = 32u << 20;
struct Sealed {
  uint64_t request_id = 0;
  VersionInfo info;
  std::string header;
  bool operator==(const Sealed&) const = default;
};

// Counters of a node (NodeStats by name, e.g. "bytes_sent"), for tools and benchmarks.
struct Stats {
  uint64_t request_id = 0;
  bool operator==(const Stats&) const = default;
};
struct StatsReply {
  uint64_t request_id = 0;
  std::map<std::string, uint64_t> counters;
  bool operator==(const StatsReply&) const = default;
};

using Message = std::variant<Hello, HelloOk, Subscribe, Unsubscribe, Notify, Fetch, FetchOk, Release,
                             Ack, Error, Publish, PublishReady, PublishOk, List, ListReply, ReplicaAnnounce,
                             DeltaPart, Incoming, Stats, StatsReply, Sealed>;

MessageType type_of(const Message& message);
std::vector<std::byte> Encode(const Message& message);
// Errors: kInvalidArgument with "malformed message: <fault>", or kFailedPrecondition with
// "protocol version N not supported (this side speaks 2)" for a well-framed message of another version.
Result<Message> Decode(std::span<const std::byte> frame);

}  // namespace viper::proto
