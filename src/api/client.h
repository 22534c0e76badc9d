// Client: one connection from a process to a node, used by Subscriber and the CLI.
//
// Owns its own UCX engine. Requests (FETCH, LIST, PUBLISH) are matched to replies by request id
// and block the calling thread until the reply, an ERROR, the connection's loss or the timeout.
// NOTIFY messages are handed to `on_notify` on the engine's progress thread (must not block).
//
// Thread-safety: all methods are thread-safe and may run concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "net/protocol.h"
#include "viper/status.h"

namespace viper {

struct ClientOptions {
  std::string connect = "127.0.0.1:7300";  // node address "host:port"
  std::string token;                       // sent in HELLO; empty = none
  std::string name;                        // default "client-<pid>"
  std::chrono::milliseconds timeout{30000};  // per request
  uint32_t chunk_bytes = 4u << 20;         // bulk chunk size asked of the node
};

struct ClientHandlers {
  std::function<void(const proto::VersionInfo&)> on_notify;
  // A version the node is still receiving (INCOMING; only after Subscribe with kSubscribeIncoming).
  std::function<void(const proto::VersionInfo&)> on_incoming;
  std::function<void(const Status&)> on_disconnect;  // the node went away
};

// Where the bytes of a fetched version go: given the version's info, returns a buffer of at
// least info.size bytes (or an error to abort).
using BufferProvider = std::function<Result<std::span<std::byte>>(const proto::VersionInfo&)>;
// The first `done` bytes of the version have arrived (a contiguous prefix, growing), of `total`.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// A version the caller holds, offered to the node as the base of a delta (FetchSendWithBase).
struct DeltaBase {
  uint64_t version = 0;
  uint64_t checksum = 0;              // xxh3 of its data region, as announced
  std::span<const std::byte> bytes;   // the whole snapshot; must stay valid during the call
};

// A delta's part as it arrived (index from 0, in order; `last` on the final one), before it is
// decoded: a relay passes it on (IncomingVersion::ForwardDeltaPart).
using DeltaPartFn =
    std::function<void(uint32_t index, std::shared_ptr<const std::vector<std::byte>> part, bool last)>;

// What FetchSendWithBase received.
struct DeltaFetch {
  proto::FetchOk ok;                       // the node's answer: encoding full or delta, and why
  std::optional<uint64_t> data_checksum;   // xxh3 of the data region, computed as it arrived or was decoded
  uint64_t wire_bytes = 0;                 // bytes that crossed: the snapshot, or the delta stream
};

namespace internal {
struct PrefixHash;  // src/api/client_impl.h
}  // namespace internal

// What a full transfer that broke midway left (FetchSend's `resume`): the first `landed` bytes of
// `info`'s version are in `buffer` (the chunks of a contiguous prefix, each completed without
// error) and, if the caller asked for the checksum, hashed. Given to FetchSend on another node's
// Client, it asks only for the rest (FETCH offset) and receives it into the same buffer, so the
// whole version is still verified against the announced checksum. The caller keeps `buffer` valid.
struct TransferPrefix {
  proto::VersionInfo info;
  std::span<std::byte> buffer;
  uint64_t landed = 0;
  std::shared_ptr<internal::PrefixHash> hash;  // the data region's hash state up to `landed`
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options, ClientHandlers handlers = {});
  ~Client();

  const proto::HelloOk& node() const { return node_; }
  const std::string& address() const;  // the node's "host:port" (ClientOptions::connect)
  // True if the node runs on this host (its segments can be mapped).
  bool same_host() const;
  bool connected() const;
  // How long since the node last sent anything (any message; bulk bytes are not messages).
  std::chrono::milliseconds silent_for() const;
  // Asks the node to answer (a STATS request) within `timeout`: OK if it did, Timeout if not, or
  // the connection's error. A node whose host vanished or whose network was cut sends no FIN, so
  // a connection with nothing to say only learns this way that it is gone (Subscriber's liveness).
  Status Ping(std::chrono::milliseconds timeout);

  // flags: proto::kSubscribeIncoming to get INCOMING too.
  Status Subscribe(const std::string& model, uint8_t flags = 0);
  // Asks for a lease on (model, version; 0 = latest): reply carries the segment name.
  Result<proto::FetchOk> FetchLease(const std::string& model, uint64_t version);
  // Asks for a lease on the GPU-resident copy of (model, version; 0 = latest) (a kDevice replica;
  // same host only): the reply's `segment` is the 128-byte GPU version message. Release ends it.
  Result<proto::FetchOk> FetchDevice(const std::string& model, uint64_t version);
  // Ends a lease (asynchronous; safe from any thread, a no-op once disconnected).
  void Release(const std::string& model, uint64_t version);
  // A callable that releases the lease later, even after this Client is gone (then it does nothing).
  std::function<void()> Releaser(const std::string& model, uint64_t version) const;
  // Receives (model, version; 0 = latest) over UCX into the buffer `provide` returns; `progress`
  // runs on this thread each time the prefix of bytes complete grows. A node that cannot finish
  // a transfer it started (a relay whose own transfer broke) aborts it: Unavailable, and receives
  // may still be posted into the buffer until this Client is destroyed.
  // data_checksum: if set, receives the xxh3-64 of the snapshot's data region, computed on this
  // thread while the chunks arrive (each contiguous prefix is hashed as soon as it is complete),
  // so verifying costs little beyond the transfer; nullopt if the header length in the first 8
  // bytes is out of range (the parse that follows reports it).
  // resume: if set and resume->landed > 0, the transfer continues that prefix (same version,
  // size and checksum, else FailedPrecondition): the FETCH asks for bytes [landed, size) and
  // they land in resume->buffer (`provide` is not called); `progress` then starts at `landed`.
  // If the transfer breaks after more bytes landed, *resume is set to the new prefix (also
  // for a transfer that started from nothing); a node that predates offsets refuses the FETCH
  // (InvalidArgument), and the caller fetches from the start.
  Result<proto::FetchOk> FetchSend(const std::string& model, uint64_t version, const BufferProvider& provide,
                                   const ProgressFn& progress = {}, std::optional<uint64_t>* data_checksum = nullptr,
                                   TransferPrefix* resume = nullptr);
  // FetchSend that offers `base` for a delta (protocol 2). The node answers with the full
  // snapshot or with a delta against the base, which is decoded into the provided buffer as its
  // parts arrive (src/delta); either way the buffer then holds the whole snapshot of info.size
  // bytes and data_checksum its data region's xxh3 (nullopt if the header length is out of range).
  // The caller must still compare that checksum with the announced one. Errors: those of
  // FetchSend; Corruption for a delta that does not decode (the caller fetches in full then);
  // the node's ERROR if it gave up the delta (e.g. NotFound: the base was evicted meanwhile).
  // resume: if set (and empty: landed 0), a full answer that breaks leaves its prefix there, as
  // FetchSend's does (a delta's parts land in this client's memory: nothing to resume).
  // answered_with_delta: if set, says before `provide` runs whether the node answered with a delta.
  // on_part: if set, is given each part of a delta answer before it is decoded.
  Result<DeltaFetch> FetchSendWithBase(const std::string& model, uint64_t version, const DeltaBase& base,
                                       const BufferProvider& provide, const ProgressFn& progress = {},
                                       TransferPrefix* resume = nullptr, bool* answered_with_delta = nullptr,
                                       const DeltaPartFn& on_part = {});
  void Ack(const std::string& model, uint64_t version);
  Result<std::vector<proto::VersionInfo>> List();
  // The node's counters (NodeStats by name: "bytes_sent", ...).
  Result<std::map<std::string, uint64_t>> Stats();
  // Tells the node that `replica` (a relay node) now holds (model, version) too (REPLICA; no
  // reply: the node lists it until this connection closes).
  Status AnnounceReplica(const std::string& model, uint64_t version, const proto::Replica& replica);
  // Hands a complete snapshot buffer to the node, which verifies it and assigns the version.
  // `progress` (optional) is called with the bytes sent so far as each chunk completes, from the
  // engine's thread (calls may overlap; `done` is not always increasing between threads).
  Result<uint64_t> Publish(const std::string& model, std::span<const std::byte> snapshot, uint64_t step,
                           int64_t publish_ns, const ProgressFn& progress = {});

 private:
  struct Impl;
  explicit Client(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
  proto::HelloOk node_;
};

}  // namespace viper
