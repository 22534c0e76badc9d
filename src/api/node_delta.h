// The node's side of delta transfers (docs/ARCHITECTURE.md "Delta updates"): the bases it keeps,
// the deltas it encodes (eagerly after a commit, or when a consumer asks), and the sends that
// stream a delta's parts to consumers while later parts are still being encoded. Include only
// from src/api.
//
// Threads: encoding runs on the store's own task queue; FETCH decisions and sends run on the
// engine's progress thread. Locking: `mu` guards the bases and the job table; each DeltaJob's
// `mu` guards its parts and state. Order: Node::Impl::mu, then DeltaStore::mu, then DeltaJob::mu.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "net/engine.h"
#include "net/protocol.h"
#include "store/host_tier.h"
#include "task_queue.h"
#include "vector_pool.h"
#include "viper/delta.h"
#include "viper/node.h"
#include "viper/snapshot.h"

namespace viper {

struct DeltaSend;

// One delta (model, base -> target), encoded once and streamed to every consumer that asks.
struct DeltaJob {
  std::string model;
  uint64_t base_version = 0;
  uint64_t target_version = 0;
  uint64_t target_size = 0;
  // Forwarded (DeltaStore::StartForwarding): the parts are a delta this relay receives, appended
  // as they arrive; total_parts is unknown (UINT32_MAX) until the last one. base_checksum names
  // the base the upstream encoded against: only a peer offering that same base gets it. Both are
  // set before the job is shared and never change (read without `mu`).
  bool forwarded = false;
  uint64_t base_checksum = 0;
  uint32_t total_parts = 0;
  // Each part's size in the model's last finished delta: the capacity its vector is taken with
  // (consecutive deltas of a model tend to repeat their parts' sizes: frozen layers, changed ones).
  std::vector<uint32_t> part_size_hints;

  std::mutex mu;  // guards everything below
  std::vector<std::shared_ptr<const std::vector<std::byte>>> parts;  // encoded so far, in order (a prefix)
  std::vector<std::shared_ptr<const std::vector<std::byte>>> slots;  // encoded, not yet in that prefix
  uint32_t next_part = 0;    // the next part an encoder thread takes
  uint32_t workers_left = 0; // encoder threads that have not finished with this job
  int64_t started_ns = 0;
  uint64_t encoded_bytes = 0;
  uint64_t target_done = 0;  // target bytes covered by the parts so far
  bool done = false;         // every part encoded
  Status error;              // cancelled (base evicted) or not worth finishing
  bool cancelled = false;
  int64_t encode_ns = 0;
  // The sends streaming this job, owned here until they finish (each holds the job: the cycle
  // ends when the send finishes, and ~DeltaStore clears what is left).
  std::vector<std::shared_ptr<DeltaSend>> senders;
  std::vector<std::function<void(const PreparedDelta&)>> on_done;
  // Held while encoding; released when it ends.
  std::optional<DeltaEncoder> encoder;
  ReadLease base_lease, target_lease;
  Snapshot base, target;
};

// A delta stream to one consumer: DELTA_PART + tagged bytes per part, a window in flight.
struct DeltaSend {
  std::shared_ptr<DeltaJob> job;
  net::PeerId peer = 0;
  uint64_t request_id = 0;
  uint64_t tag = 0;
  uint32_t next = 0;
  uint32_t in_flight = 0;
  uint64_t sent_bytes = 0;
  int64_t started_ns = 0;
  bool finished = false;  // all parts sent, or given up
};

class DeltaStore {
 public:
  // `egress` counts the bytes of every part sent (the node's bytes_sent).
  DeltaStore(NodeOptions options, HostTier* host, net::Engine* engine, std::atomic<uint64_t>* egress);
  ~DeltaStore();  // stops encoding (queued jobs are cancelled), then releases the bases

  // After `info` was committed: keeps it as a base, evicts bases beyond options.delta_bases
  // (cancelling their unfinished encodes) and, if `eager`, starts encoding the delta from the
  // previous version. Returns what tells the consumers of the encodes it stopped (their ERROR):
  // the caller runs it after the version's NOTIFY is sent, so that such a consumer knows of the
  // version that replaced the one it was receiving and loads that instead of this one in full.
  [[nodiscard]] std::function<void()> OnCommit(const proto::VersionInfo& info, bool eager);
  // A SEND FETCH that offers a base: starts a delta stream and returns true (FETCH_OK sent), or
  // returns false with `why` for the full transfer's FETCH_OK. Progress thread.
  bool TryStart(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info, std::string* why);
  // Whether a delta of `model` at `size` bytes is predicted to pay (kAlways: yes; kOff, or nothing
  // measured yet: no), from the last finished delta's ratio, the encoder's rate and the bandwidth.
  bool ExpectsDelta(const std::string& model, uint64_t size) const;
  // A full transfer of `bytes` to `peer` took `ns`: the bandwidth that peer's deltas are weighed
  // against (the node-wide average for peers not measured yet).
  void RecordFullSend(net::PeerId peer, uint64_t bytes, int64_t ns);
  // Calls `fn` once the delta of (model, version) against the previous version is encoded (at
  // once, with prepared = false, if none is being made).
  void WhenPrepared(const std::string& model, uint64_t version, std::function<void(const PreparedDelta&)> fn);
  DeltaStats stats() const;

  // A relay's delta passed on as it arrives (Node::ForwardDeltaPart): a job for (model, base ->
  // target) fed by AddForwardedPart instead of encoders; null if a job for that key exists already
  // or deltas are off. TryForward starts a send of it to a FETCH that offers the same base, before
  // the version is committed here; after the commit TryStart finds it like any job.
  std::shared_ptr<DeltaJob> StartForwarding(const proto::VersionInfo& target, uint64_t base_version,
                                            uint64_t base_checksum);
  // Part `index` in order; false (and the job stopped) if it is not the next one.
  bool AddForwardedPart(const std::shared_ptr<DeltaJob>& job, uint32_t index,
                        std::shared_ptr<const std::vector<std::byte>> part, bool last);
  // The delta will not be complete here (the version aborted, a part out of order): its sends
  // are told, and the job leaves the table so that a later FETCH gets a fresh encode.
  void StopForwarding(const std::shared_ptr<DeltaJob>& job, const std::string& why);
  // A SEND FETCH of `info` (still arriving here) that offers the base of a forwarded job: starts
  // its delta stream (FETCH_OK sent) and returns true. Progress thread.
  bool TryForward(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info);

 private:
  struct Base {
    uint64_t version = 0;
    uint64_t checksum = 0;
    ReadLease lease;
    Snapshot snapshot;
  };
  using Key = std::tuple<std::string, uint64_t, uint64_t>;  // model, base, target

  std::shared_ptr<DeltaJob> JobLocked(const std::string& model, const Base& base, const Base& target);
  // On encoder thread `worker`, which alone uses scratch_[worker].
  void Encode(const std::shared_ptr<DeltaJob>& job, size_t worker);
  bool WorthEncodingLocked(const std::string& model, uint64_t size);
  void Finish(const std::shared_ptr<DeltaJob>& job, int64_t encode_ns);
  // FETCH_OK (kDelta, `why` as its detail) and the stream of `job` to the FETCH's peer.
  void StartSend(const std::shared_ptr<DeltaJob>& job, net::PeerId peer, const proto::Fetch& m,
                 const proto::VersionInfo& info, const std::string& why);
  void Pump(const std::shared_ptr<DeltaJob>& job);
  void PumpSend(const std::shared_ptr<DeltaSend>& send);
  static void Retire(DeltaJob& job, const std::shared_ptr<DeltaSend>& send);
  // Whether a delta of `size` bytes to `peer` is predicted smaller and sooner than the full
  // snapshot: encode (from what `job` has done, if any), send and decode overlap part by part.
  bool Predict(const std::string& model, DeltaJob* job, net::PeerId peer, uint64_t size, std::string* why);

  const NodeOptions options_;
  HostTier* const host_;
  net::Engine* const engine_;
  std::atomic<uint64_t>* const egress_;

  mutable std::mutex mu_;  // guards below
  std::map<std::string, std::deque<Base>> bases_;  // per model, oldest first; the newest is the latest commit
  std::map<Key, std::shared_ptr<DeltaJob>> jobs_;
  std::map<std::string, double> last_ratio_;       // per model: encoded / target of the last finished delta
  std::map<std::string, uint64_t> eager_commits_;  // per model: commits weighed by WorthEncodingLocked
  std::map<std::string, std::vector<uint32_t>> part_sizes_;  // per model: the last finished delta's parts
  double bandwidth_ = 0;                           // bytes/s of full sends (EWMA), 0 = not measured
  std::map<net::PeerId, double> peer_bandwidth_;   // the same per peer (the most recent 1024; 0: one cold send seen)
  double encode_rate_ = 0;                         // target bytes/s of the encoder (EWMA), 0 = not measured
  DeltaStats stats_;

  // Reused across deltas (fresh memory cost the encode ~4x its CPU): the parts' vectors, returned
  // when the last sender and job let go of them, and each encoder thread's scratch.
  std::shared_ptr<internal::VectorPool> parts_pool_;
  std::vector<std::unique_ptr<DeltaScratch>> scratch_;
  std::vector<std::unique_ptr<internal::TaskQueue>> encoders_;  // last: stopped first
};

}  // namespace viper
