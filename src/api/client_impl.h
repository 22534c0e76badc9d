// Client::Impl: the client's private state, shared by the .cc files that implement the client
// (client.cc: connection, requests, full transfers; client_delta.cc: delta transfers). Include
// only from src/api.
//
// Locking: `mu` guards the request table, the delta inboxes and the connection state; each
// DeltaInbox has its own mutex for its parts. Message handlers and bulk completions run on the
// engine's progress thread; requests block their calling thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "api/client.h"
#include "net/engine.h"
#include "net/protocol.h"
#include "viper/snapshot.h"
#include "vector_pool.h"
#include "viper/node.h"

namespace viper {

// The parts of one delta stream as they arrive (DELTA_PART, then its tagged bytes). Receives are
// posted only while the parts received but not yet decoded stay under a byte budget, so a node
// that runs ahead of a slow decoder waits (its tagged sends do not complete) instead of filling
// this process's memory.
struct DeltaInbox {
  uint64_t tag = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<uint32_t, uint32_t>> unposted;  // announced parts (index, bytes) not yet received
  std::map<uint32_t, std::shared_ptr<std::vector<std::byte>>> ready;  // received, not yet decoded
  uint32_t announced = 0;
  bool last_announced = false;
  uint32_t completed = 0;       // receives completed (ok or not)
  uint64_t outstanding = 0;     // bytes posted or ready, not yet decoded
  uint64_t received_bytes = 0;  // every part's bytes received so far
  Status error;                 // the node's ERROR, a failed receive, a bad DELTA_PART, a lost connection
  bool discard = false;         // the reader gave up: parts still in flight are dropped
};

// The chunks of one full transfer, completed on the progress thread while the fetching thread waits.
struct Arrivals {
  std::mutex mu;
  std::condition_variable cv;
  uint32_t remaining = 0;
  uint64_t received = 0;
  std::vector<uint8_t> done;  // per chunk, set by its completion
  Status first_error;
  Status ended;  // the node aborted the transfer (ERROR for its request) or the connection went
  std::optional<proto::Sealed> sealed;  // FETCH_OK kFullSealedLater: the node's SEALED, once it came
};

Status StatusFromError(const proto::Error& e);
// Applies the node's SEALED to a transfer whose chunks all landed in `buffer` (FETCH_OK
// kFullSealedLater): checks it names the version sent, writes the final header, and makes `ok`'s
// info the sealed version's. Corruption if the node's SEALED does not match.
Status ApplySealed(const proto::Sealed& sealed, std::span<std::byte> buffer, proto::FetchOk* ok);
// Ends a transfer early: the node aborted it (ERROR for its request) or the connection went.
void EndTransfer(Arrivals& state, const Status& why);

namespace internal {
// The hash of a snapshot's data region [data_begin, size) over the bytes received so far.
struct PrefixHash {
  Checksum64Stream stream;
  uint64_t data_begin = 0;
};
}  // namespace internal

struct Client::Impl {
  ClientOptions options;
  ClientHandlers handlers;
  std::unique_ptr<net::Engine> engine;
  net::PeerId node = 0;
  std::string host_key = LocalHostKey();

  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  Status close_reason;
  uint64_t next_request = 1;
  std::map<uint64_t, std::shared_ptr<std::promise<proto::Message>>> pending;  // request id -> reply
  std::shared_ptr<std::promise<proto::Message>> hello_reply;                  // HELLO has no request id
  // Transfers under way (FETCH answered, chunks arriving), by request id: an ERROR for one (the
  // node aborted it) or the connection's loss ends it.
  std::map<uint64_t, std::shared_ptr<Arrivals>> transfers;
  std::map<uint64_t, std::shared_ptr<DeltaInbox>> inboxes;                     // request id -> delta parts
  std::atomic<uint64_t> next_tag{0};
  // steady_clock nanoseconds of the node's last message (or of the connect).
  std::atomic<int64_t> last_heard_ns{std::chrono::steady_clock::now().time_since_epoch().count()};
  // Delta parts are received into vectors reused across parts and deltas (fresh memory per part
  // cost page faults on every delta); budget: the inbox's (client_delta.cc) and a part beyond it.
  std::shared_ptr<internal::VectorPool> delta_buffers = std::make_shared<internal::VectorPool>(72ull << 20);

  void OnMessage(std::span<const std::byte> bytes);
  void OnClosed(const Status& reason);
  std::pair<uint64_t, std::future<proto::Message>> NewRequest();
  // Waits for the reply to request `id` for `timeout` (options.timeout if negative).
  Result<proto::Message> Await(uint64_t id, std::future<proto::Message>& reply,
                               std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  Status SendMessage(const proto::Message& m) { return engine->Send(node, proto::Encode(m)); }
  // Sends FETCH (mode SEND) and waits for FETCH_OK. `before_send(id)` registers what must catch
  // messages for the request (TrackTransfer, a delta inbox) before the FETCH goes out: they may
  // follow FETCH_OK at once.
  Result<proto::FetchOk> RequestSend(proto::Fetch fetch, const std::function<void(uint64_t)>& before_send);
  std::shared_ptr<Arrivals> TrackTransfer(uint64_t request_id);
  void ForgetTransfer(uint64_t request_id);
  // Receives a full transfer (FETCH_OK encoding full) into the buffer `provide` returns, or the
  // rest of `resume`'s prefix into its buffer (FetchSend).
  Result<proto::FetchOk> ReceiveChunks(proto::FetchOk ok, uint64_t tag, const std::shared_ptr<Arrivals>& state,
                                       const BufferProvider& provide, const ProgressFn& progress,
                                       std::optional<uint64_t>* data_checksum, TransferPrefix* resume = nullptr);

  // --- delta transfers (client_delta.cc) ---
  void OnDeltaPart(const proto::DeltaPart& part);
  // An ERROR for a request with an open inbox ends that stream; true if it was one.
  bool OnDeltaError(const proto::Error& error);
  void PostDeltaReceives(const std::shared_ptr<DeltaInbox>& inbox);
  void CloseInbox(uint64_t request_id, const std::shared_ptr<DeltaInbox>& inbox);
  void ForgetInbox(uint64_t request_id);  // a FETCH answered in full: no part will come
  Result<DeltaFetch> ReceiveDelta(const proto::FetchOk& ok, const std::shared_ptr<DeltaInbox>& inbox,
                                  const DeltaBase& base, const BufferProvider& provide, const ProgressFn& progress,
                                  const DeltaPartFn& on_part);
};

}  // namespace viper
