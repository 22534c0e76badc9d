// SampleCache: a collaborative cache of training samples across the nodes of data-parallel ranks
// (docs/ARCHITECTURE.md "Data side", "Collaborative sample cache").
//
// Each rank wraps its source in a SampleCache and reads through it (the Prefetcher's readers call
// ReadInto). Every sample has one owner node, a function of the sample id and the membership (the
// list of cache nodes, the same on every rank) that each rank computes alone: rendezvous hashing
// (highest random weight), so that a node joining or leaving moves only the samples it gains or
// held, and no metadata is exchanged. A read takes the sample from this rank's own node when it
// owns it, else from the owner's node over UCX (Client::FetchSend), else from the source; a sample
// read from the source is then put into its owner's memory (Node::Commit here, Client::Publish
// over UCX there), so that after the first epoch the ranks read the source only for what does
// not fit.
//
// The cache is a viper Node per rank (started here, listening on nodes[self]): each cached sample
// is a one-tensor snapshot "x" (uint8) in the node's host tier (shared memory), under the model
// name "<name>.s<id>", version 1 (or later, if it is put again). The node's host_max_bytes is the
// cache's memory budget: a put beyond it is refused and counted (the sample is read from the
// source again next time). One segment per sample: the node maps each, so a node holds at most
// vm.max_map_count less room for its process's other mappings (MaxCachedSamples: 49,146 samples
// on a default kernel); it keeps no file descriptor per sample.
//
// A node never reached yet is waited for while the cache is young (up to `timeout` after Open: the
// ranks start at their own pace). Later, a node that cannot be reached (connection refused, timed
// out) is left out of the membership on
// this rank for `retry_down`; its samples go to their next owner by the same hashing, so a dead
// node moves only its own samples. Ranks may briefly disagree on the membership: that costs
// duplicate reads or puts, never a wrong sample (each fetched copy is checked against its
// checksum and size).
//
// Thread-safety: every method may be called from many threads at once (the Prefetcher's readers).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "viper/sample_source.h"
#include "viper/status.h"

namespace viper {

struct SampleCacheOptions {
  // The membership: every cache node's "host:port", the same list (in any order) on every rank.
  std::vector<std::string> nodes;
  size_t self = 0;      // index in `nodes` of this rank's node (this host's)
  // Start the node nodes[self] in this process. false: attach to it, run by another process on
  // this host (another rank's cache, or `viper serve`): several processes on one host (ranks,
  // jobs of a search on the same data) then share one cache; this one's reads of it are leases
  // on its segments, mapped read-only, and its puts Client::Publish.
  bool start_node = true;
  std::string name;     // the cache's namespace in the nodes: [A-Za-z0-9_-]{1,64} (e.g. the data set)
  std::string token;    // the nodes' HELLO token (required to listen beyond loopback, unless insecure)
  bool insecure = false;
  uint64_t max_bytes = 0;  // the node's memory budget (NodeOptions::host_max_bytes; 0 = half of /dev/shm)
  // Samples the node may hold (NodeOptions::host_max_models); 0 = MaxCachedSamples(). More than
  // that is InvalidArgument: the mappings would exhaust the process's (a failed mmap is a failed
  // malloc elsewhere in it).
  size_t max_samples = 0;
  std::chrono::milliseconds timeout{10000};    // per request to another node
  std::chrono::milliseconds retry_down{3000};  // how long an unreachable node stays left out
};

struct SampleCacheStats {
  uint64_t source_reads = 0, source_bytes = 0;  // read from the source since the cache started
  uint64_t local_hits = 0, local_bytes = 0;     // taken from this rank's own node
  uint64_t remote_hits = 0, remote_bytes = 0;   // taken from another node over UCX
  uint64_t misses = 0;         // the owner did not hold the sample (then read from the source)
  uint64_t puts = 0, put_bytes = 0;  // samples this rank put into their owner's cache
  uint64_t put_failures = 0;   // puts refused (an owner's budget) or failed
  uint64_t peer_failures = 0;  // requests to another node that failed (unreachable, timed out)
  uint64_t node_samples = 0;   // samples this rank's node holds now (0 when attached: see the node's process)
  uint64_t node_bytes = 0;     // shared memory its segments take, spare ones included (HostTierStats::mapped_bytes)
  std::vector<std::string> down;  // nodes left out now (unreachable)
};

// A cached sample pinned in this process's node (SampleCache::Pin): its bytes are `nbytes` at
// `offset` in the shared-memory segment `segment` (/dev/shm/<segment>), which another process of
// this host may map read-only; they stay as they are (the segment is not recycled) until `hold`
// is dropped.
struct PinnedSample {
  std::string segment;
  uint64_t offset = 0, nbytes = 0;
  std::shared_ptr<const void> hold;
};

// Reads of one consumer of a shared cache (a job of a data service), counted apart from the
// others' (SampleCache::CountedView).
struct SampleCacheJobCounters {
  std::atomic<uint64_t> source_reads{0}, source_bytes{0};  // read from the source for this job
  std::atomic<uint64_t> hits{0}, hit_bytes{0};             // taken from a node's cache
};

// Samples one node may hold on this host: each is one mapping, so vm.max_map_count (read from
// /proc; 65,530 if it cannot be) less 16,384 left for the process's other mappings (libraries,
// allocator arenas, transport buffers; a PyTorch process holds a few thousand).
size_t MaxCachedSamples();

// The owner of `id` among `members` (rendezvous hashing; independent of the members' order).
// REQUIRES: members is not empty. Returns an index into members.
size_t SampleOwner(uint64_t id, const std::vector<std::string>& members);

class SampleCache : public SampleSource {
 public:
  // Validates the options (InvalidArgument naming the one at fault) and starts this rank's node
  // on nodes[self] (Unavailable if it cannot listen there).
  static Result<std::shared_ptr<SampleCache>> Open(std::shared_ptr<const SampleSource> source,
                                                   const SampleCacheOptions& options);
  ~SampleCache() override;

  uint64_t size() const override;
  uint64_t bytes(uint64_t id) const override;
  int64_t label(uint64_t id) const override;
  std::string Describe(uint64_t id) const override;
  Status Check(uint64_t id) const override;
  // Own node, else the owner's, else the source (then put into the owner's node). Errors: the
  // source's; a failing cache never fails a read (it falls back to the source).
  Status ReadInto(uint64_t id, std::span<std::byte> dst) const override;
  std::vector<std::string> class_names() const override;

  // The sample pinned in this process's node (start_node), for another process of this host to
  // map (a data service hands samples to its clients this way). NotFound if the node does not
  // hold it; FailedPrecondition when attached (start_node=false).
  Result<PinnedSample> Pin(uint64_t id) const;
  // A source that reads through this cache as ReadInto does and also counts its reads into
  // `counters`: one per job of a data service, so that each job's hits and source bytes add up to
  // the cache's.
  static std::shared_ptr<const SampleSource> CountedView(std::shared_ptr<const SampleCache> cache,
                                                         std::shared_ptr<SampleCacheJobCounters> counters);

  // The owner node's index in options().nodes as this rank sees it now (down nodes left out).
  size_t OwnerOf(uint64_t id) const;
  std::string address() const;  // this rank's node, as it listens
  const SampleCacheOptions& options() const;
  SampleCacheStats stats() const;

  // Named objects in the cache's nodes: other state the ranks share over the same membership and
  // transport (the distributed rehearsal buffer's shards, python/viper/_rehearsal_dist.py). An
  // object is a one-tensor snapshot like a sample, the model "<name>.o.<key>" in the node; a put
  // replaces the node's earlier version. `key`: 1-48 characters of [A-Za-z0-9_-] (else
  // InvalidArgument). Objects count against the node's budget as samples do.
  // Puts `bytes` under `key` into this rank's node (Node::Commit, or Client::Publish when
  // attached). Errors: the node's refusal (its budget), Unavailable when attached to a node that
  // cannot be reached.
  Status PutObject(std::string_view key, std::span<const std::byte> bytes) const;
  // The latest bytes under `key` in options().nodes[node] (this rank's own node included), checked
  // against their checksum. NotFound if that node holds none; Unavailable if it cannot be reached
  // (it is then left out for retry_down, as for samples, and later calls fail at once).
  Result<std::vector<std::byte>> GetObject(size_t node, std::string_view key) const;

  struct Impl;

 private:
  explicit SampleCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace viper
