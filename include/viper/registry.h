// Registry: the catalog of which node holds which version of which model, and the notification of
// new versions, shared by every node and consumer that open the same registry (docs/ARCHITECTURE.md
// "Registry").
//
// A small abstract backend that reports what it can do (capabilities()); a verb it lacks returns
// NotSupported. Two backends, chosen by URL (OpenRegistry):
//   "embedded"                 in this process only: nodes and subscribers of one process share
//                              it (tests, a producer and its consumers in one Python program).
//                              Nodes without a registry URL keep using their own catalog, served to
//                              consumers that connect to them by address (the default).
//   "redis://HOST:PORT[/DB]"   a Redis server: nodes of a fleet register what they hold, and a
//                              consumer needs only the model name and the URL.
//
// Records. A node registers one HolderRecord per version it holds: the version's VersionInfo with
// the replicas on that node (segment, node address, file), plus the node itself. A node's records
// live as long as the node does: each Put and each Refresh keeps every record of that node alive
// for the TTL (one registry command per heartbeat, whatever the number of versions held), so a node
// that dies without saying goodbye disappears by itself when its TTL passes. Every record read back from a shared backend is
// untrusted input: ParseHolderRecord validates it field by field (names, numbers, locators,
// lengths); a malformed record is skipped and reported, never served.
//
// Announce after complete: a node registers and announces a version only after it is complete in
// its host tier (Node::Commit). Watchers hear each announcement at most once per registry
// connection, but may hear a version again after a reconnect (a node re-announces what it holds
// after the registry came back) and from several holders: consumers dedupe by version number.
//
// Thread-safety: every method of Registry is thread-safe. A RegistryWatch's handlers run on the
// backend's thread (redis: the watch's own thread; embedded: the thread that calls Announce), one
// at a time per watch; they must be quick and must not destroy the watch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "viper/status.h"
#include "viper/version_info.h"

namespace viper {

// What a backend can do. Callers ask instead of assuming.
struct RegistryCapabilities {
  bool shared = false;  // other processes and hosts see this process's records (redis); embedded: no
  bool expiry = false;  // records vanish when their TTL passes without a new Put
  bool watch = false;   // Watch() delivers announcements
  bool placement = false;  // Join/Stay/Leave arrange relays into a tree (redis)
};

// A node as it registers itself. `id` is stable for one node address on one host
// (NodeRecordFor), so a node restarted on the same address replaces its own records.
struct NodeRecord {
  std::string id;        // 16 lowercase hex digits
  std::string name;      // shown to operators
  std::string address;   // "host:port" consumers connect to (port 1-65535)
  std::string host_key;  // LocalHostKey() of the node's host: same key = its segments can be mapped
  uint32_t pid = 0;
  bool operator==(const NodeRecord&) const = default;
};
NodeRecord NodeRecordFor(const std::string& name, const std::string& address, const std::string& host_key, uint32_t pid);

// One node's holding of one complete version: info.replicas are the copies reachable through
// that node (its segment, its address, its file, and any upstream replicas it lists).
struct HolderRecord {
  NodeRecord node;
  proto::VersionInfo info;
  bool operator==(const HolderRecord&) const = default;
};

// The record's bytes as stored (compact JSON, readable with redis-cli).
std::string EncodeHolderRecord(const HolderRecord& record);
// Parses and validates untrusted bytes. Errors are kCorruption with "registry record: <fault>"
// naming the first field at fault. Never reads past `text`; refuses records over kMaxRecordBytes.
Result<HolderRecord> ParseHolderRecord(std::string_view text);
inline constexpr size_t kMaxRecordBytes = 1u << 20;
// The check ParseHolderRecord applies to each replica: a segment name, a "host:port" (node,
// relay), or an absolute file path without "..". kCorruption naming the fault.
Status ValidateReplica(const proto::Replica& replica);

// The result of a lookup: every live holding of a model, newest version first, then (within a
// version) in the backend's order. `rejected` names the records that failed validation
// ("<key>: <fault>"); they are not in `holders`.
struct RegistryLookup {
  std::vector<HolderRecord> holders;
  std::vector<std::string> rejected;
};

// Every holder in `lookup` in the order a consumer tries them: newest version first, within a
// version those on host `host_key` first; one entry per node address (its newest holding). A
// consumer whose first choice does not answer tries the next.
std::vector<HolderRecord> HoldersInOrder(const RegistryLookup& lookup, const std::string& host_key);

// The holders of the newest version in `lookup`, nearest first: those on host `host_key` (shared
// memory reachable), then the others in lookup order.
std::vector<HolderRecord> NearestHoldersOfLatest(const RegistryLookup& lookup, const std::string& host_key);

// Placement (docs/ARCHITECTURE.md "Placement and healing"): the registry as the tracker of a
// model's relay tree. A relay that names no upstream joins the tree: the registry picks its parent
// among the tree's members and the model's roots (holders outside the tree: the producer's node),
// atomically, so that two nodes joining at once never both take a parent's last child slot.
struct JoinRequest {
  std::string model;
  NodeRecord node;                  // the joiner (its id, address and host_key are what others see)
  std::vector<NodeRecord> roots;    // holders of the model that did not join (each takes one child)
  // Addresses not to choose (they did not answer the joiner). If the joiner's parent is one of
  // them, it is presumed dead and leaves the tree (its slot at its own parent is free at once); a
  // live one is back on its next Stay.
  std::vector<std::string> avoid;
  std::string prefer;               // the address to keep if it has a free slot (the joiner's parent now)
  uint32_t max_children = 1;        // children a member takes (1-1024)
  std::chrono::milliseconds ttl{10000};  // the membership lasts this long without a Stay
};
// Where the joiner goes: the parent is the first candidate with a free slot in this order: `prefer`,
// a node on the joiner's host (its segments map), then the shallowest node, the least loaded among
// equals (least loaded alone would build a chain: the newest member always has the fewest children).
// Never the joiner itself nor one of its descendants (no cycle).
struct Placement {
  NodeRecord parent;
  uint32_t depth = 0;     // the joiner's depth: 1 under a root
  uint32_t siblings = 0;  // the parent's children before the joiner
};

struct WatchHandlers {
  std::function<void(const HolderRecord&)> on_announce;  // a version was announced
  // The watch was (re)established after a gap (first start excluded): announcements may have
  // been missed, look up the current state.
  std::function<void()> on_resync;
  // A malformed announcement, or the connection to the registry lost (`why` says which). Once
  // per event; the watch keeps trying to reconnect.
  std::function<void(const Status& why)> on_error;
};

// Delivers announcements of one model until destroyed (the destructor stops delivery: no handler
// runs after it returns).
class RegistryWatch {
 public:
  virtual ~RegistryWatch() = default;
};

class Registry {
 public:
  virtual ~Registry() = default;
  virtual std::string_view backend() const = 0;  // "embedded" | "redis"
  virtual const std::string& url() const = 0;
  virtual RegistryCapabilities capabilities() const = 0;

  // --- node side ---
  // Registers (or replaces) each record, and keeps every record of each node named alive for
  // `ttl` (as Refresh does); returns how many of them were not registered before (new holdings, or
  // ones the registry lost: expired, or a restarted Redis). All or nothing is not promised: on an
  // error some records may be stored; putting them again is harmless. InvalidArgument (and nothing
  // stored) if a record would not pass ParseHolderRecord.
  virtual Result<size_t> Put(std::span<const HolderRecord> records, std::chrono::milliseconds ttl) = 0;
  // The heartbeat: keeps every record node `node` put alive for another `ttl`, in one registry
  // command whatever the number of records. false: the registry holds nothing live of this node
  // (its TTL passed, or the registry lost its data): put every record again.
  virtual Result<bool> Refresh(const NodeRecord& node, std::chrono::milliseconds ttl) = 0;
  // Removes node `node_id`'s holding of (model, version); a holding that is not there is fine.
  virtual Status Remove(const std::string& node_id, const std::string& model, uint64_t version) = 0;
  // Tells the watchers of record.info.model. REQUIRES: the record was Put.
  virtual Status Announce(const HolderRecord& record) = 0;

  // --- consumer side ---
  virtual Result<RegistryLookup> Lookup(const std::string& model) = 0;
  // The live holders of the newest version that has one (empty if none): what a new consumer
  // needs to find a node, read without going through every older holding. Default: Lookup,
  // filtered.
  virtual Result<RegistryLookup> LookupLatest(const std::string& model);
  // Models with at least one live holding (or a malformed record, which its Lookup names), sorted.
  virtual Result<std::vector<std::string>> Models() = 0;
  // NotSupported if !capabilities().watch. Fails if the registry cannot be reached now.
  virtual Result<std::unique_ptr<RegistryWatch>> Watch(const std::string& model, WatchHandlers handlers) = 0;

  // --- placement (NotSupported unless capabilities().placement) ---
  // Joins (or re-joins: the old parent's slot is freed in the same step) the tree of
  // request.model. NotFound when no candidate has a free slot (none yet: retry later);
  // InvalidArgument naming the field for a malformed request.
  virtual Result<Placement> Join(const JoinRequest& request);
  // The membership's heartbeat: keeps node `node_id` in the tree of `model` for another `ttl`.
  // false: it is no longer a member (its TTL passed, or the registry lost its data): join again.
  virtual Result<bool> Stay(const std::string& model, const std::string& node_id, std::chrono::milliseconds ttl);
  // Leaves the tree (its slot is free at once); a node that is not a member is fine.
  virtual Status Leave(const std::string& model, const std::string& node_id);
};

// Options of a registry connection (shared by every backend; ignored where they do not apply).
struct RegistryOptions {
  std::chrono::milliseconds connect_timeout{1000};  // redis: TCP connect
  std::chrono::milliseconds io_timeout{2000};       // redis: one command round trip
  std::chrono::milliseconds retry_interval{500};    // redis watch: between reconnect attempts
  // redis: sent with AUTH on every connection before anything else (a server started with
  // --requirepass). Empty = no AUTH. Read it with ReadRegistryPasswordFile, never from a URL.
  std::string password;
};

// The password in `path` for RegistryOptions::password, with a token file's hygiene: a regular
// file (not a directory, not a symbolic link), not readable or writable by group or others, at
// most 4096 bytes, leading and trailing whitespace stripped, not empty. InvalidArgument naming
// the file and the rule otherwise.
Result<std::string> ReadRegistryPasswordFile(const std::string& path);

// "embedded", or "redis://HOST:PORT[/DB]" (DB 0-15 here, default 0). InvalidArgument naming the
// fault for anything else; NotSupported for redis:// in a build without hiredis. Opening a Redis
// registry does not connect yet: the first call does (and each call after a failure retries).
Result<std::unique_ptr<Registry>> OpenRegistry(const std::string& url, const RegistryOptions& options = {});

// Node side: keeps a node's holdings registered (the node's private RegistryAgent does this).
// TTL of the node's records and the heartbeat that refreshes them (Registry::Refresh).
struct RegistryHeartbeat {
  std::chrono::milliseconds ttl{10000};
  std::chrono::milliseconds interval{3000};  // must be < ttl
};

}  // namespace viper
