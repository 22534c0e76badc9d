// HolderRecord <-> compact JSON, and the validation of records read back from a shared registry.
//
// Format (docs/ARCHITECTURE.md "Registry"): one JSON object,
//   {"format":1,"node":{"id","name","address","host_key","pid"},"model","version","size",
//    "checksum":"<16 hex>","step","publish_ns","completed_ns","metadata":{..},
//    "replicas":[{"kind":"segment|node|file|relay","host_key","locator"}]}
// Every field is required, no other field is allowed, and each is checked against what a node
// would write: a record is input from whoever can write to the registry.
#include <set>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/names.h"
#include "core/snapshot_internal.h"
#include "registry_internal.h"
#include "viper/snapshot.h"

namespace viper {
namespace {

using json = nlohmann::json;
using internal::Quote;

constexpr int kFormat = 1;
constexpr size_t kMaxDepth = 4;  // record, metadata/node/replicas, replica
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxMetadataKeyBytes = 256;
constexpr size_t kMaxLocatorBytes = 4096;
constexpr uint64_t kMaxSnapshotBytes = 1ull << 40;  // as the node accepts from a publisher

struct Fault {
  std::string message;
};

[[noreturn]] void Fail(std::string message) { throw Fault{std::move(message)}; }

// Refuses duplicate keys (nlohmann keeps one silently) and nesting beyond kMaxDepth while parsing.
class StrictParse {
 public:
  bool operator()(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (keys_.size() >= kMaxDepth) Fail(fmt::format("nests deeper than {} levels", kMaxDepth));
        keys_.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        keys_.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_.back().insert(parsed.get_ref<const std::string&>()).second)
          Fail("duplicate key " + Quote(parsed.get_ref<const std::string&>()));
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  }

 private:
  std::vector<std::unordered_set<std::string>> keys_;  // one per open object or array
};

std::string Describe(const json& v) { return v.is_number() ? "number " + v.dump() : std::string(v.type_name()); }

// A JSON object whose fields are taken one by one; Done() refuses any field left over.
class Fields {
 public:
  Fields(const json& object, std::string where) : object_(object), where_(std::move(where)) {
    if (!object_.is_object()) Fail(where_ + " is " + Describe(object_) + ", not an object");
  }

  const json& Take(const char* name) {
    auto it = object_.find(name);
    if (it == object_.end()) Fail(At(name) + " is missing");
    taken_.insert(name);
    return *it;
  }
  uint64_t U64(const char* name, uint64_t min, uint64_t max) {
    const json& v = Take(name);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      Fail(At(name) + " is " + Describe(v) + ", not an unsigned integer");
    uint64_t n = v.get<uint64_t>();
    if (n < min || n > max) Fail(fmt::format("{} = {} is outside {}..{}", At(name), n, min, max));
    return n;
  }
  int64_t NonNegativeI64(const char* name) {
    return static_cast<int64_t>(U64(name, 0, static_cast<uint64_t>(INT64_MAX)));
  }
  std::string Text(const char* name, size_t max_bytes, bool allow_empty = false) {
    const json& v = Take(name);
    if (!v.is_string()) Fail(At(name) + " is " + Describe(v) + ", not a string");
    return CheckText(At(name), v.get<std::string>(), max_bytes, allow_empty);
  }
  void Done() const {
    for (const auto& [key, value] : object_.items())
      if (!taken_.contains(key)) Fail(where_ + ": unknown field " + Quote(key));
  }
  std::string At(const char* name) const { return where_ + "." + name; }

  // Printable text (UTF-8 allowed, no control bytes) of at most max_bytes.
  static std::string CheckText(const std::string& where, std::string text, size_t max_bytes, bool allow_empty) {
    if (text.empty() && !allow_empty) Fail(where + " is empty");
    if (text.size() > max_bytes) Fail(fmt::format("{} has {} bytes (at most {})", where, text.size(), max_bytes));
    for (unsigned char c : text)
      if (c < 0x20 || c == 0x7f) Fail(fmt::format("{} contains control byte 0x{:02x}", where, c));
    if (internal::FirstInvalidUtf8(text) != internal::kNpos) Fail(where + " is not valid UTF-8");
    return text;
  }

 private:
  const json& object_;
  std::string where_;
  std::unordered_set<std::string> taken_;
};

void CheckHostPort(const std::string& where, const std::string& address) {
  auto parsed = ParseHostPort(address);
  if (!parsed.ok()) Fail(where + ": " + parsed.status().message());
  if (parsed->second == 0) Fail(where + " " + Quote(address) + " has port 0");
}

NodeRecord ParseNode(const json& value) {
  Fields f(value, "node");
  NodeRecord node;
  node.id = f.Text("id", 16);
  if (node.id.size() != 16 || node.id.find_first_not_of("0123456789abcdef") != std::string::npos)
    Fail("node.id " + Quote(node.id) + " is not 16 lowercase hex digits");
  node.name = f.Text("name", kMaxNameBytes);
  node.address = f.Text("address", kMaxNameBytes);
  CheckHostPort("node.address", node.address);
  node.host_key = f.Text("host_key", kMaxNameBytes);
  node.pid = static_cast<uint32_t>(f.U64("pid", 1, UINT32_MAX));
  f.Done();
  return node;
}

struct KindName {
  proto::ReplicaKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {{proto::ReplicaKind::kHostSegment, "segment"},
                               {proto::ReplicaKind::kNode, "node"},
                               {proto::ReplicaKind::kFile, "file"},
                               {proto::ReplicaKind::kRelay, "relay"}};

const char* KindText(proto::ReplicaKind kind) {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

// Locators by kind: a segment is a name under /dev/shm, a node or relay a "host:port", a file an
// absolute path without ".." components.
void CheckLocator(const std::string& where, proto::ReplicaKind kind, const std::string& locator) {
  switch (kind) {
    case proto::ReplicaKind::kHostSegment:
      if (locator.size() > 255 || locator.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                            "0123456789._-") != std::string::npos ||
          locator.front() == '.')
        Fail(where + " " + Quote(locator) + " is not a shared-memory segment name ([A-Za-z0-9._-], at most 255)");
      return;
    case proto::ReplicaKind::kNode:
    case proto::ReplicaKind::kRelay:
      return CheckHostPort(where, locator);
    case proto::ReplicaKind::kFile:
      if (locator.front() != '/' || locator.find("/../") != std::string::npos || locator.ends_with("/.."))
        Fail(where + " " + Quote(locator) + " is not an absolute path without '..'");
      return;
    case proto::ReplicaKind::kDevice:  // same-node only: never in a registry record
      Fail(where + " " + Quote(locator) + " is a device replica, which a registry record cannot hold");
      return;
  }
}

proto::Replica ParseReplica(const json& value, size_t index) {
  std::string where = fmt::format("replicas[{}]", index);
  Fields f(value, where);
  std::string kind = f.Text("kind", 16);
  proto::Replica r;
  const KindName* found = nullptr;
  for (const auto& k : kKinds)
    if (kind == k.name) found = &k;
  if (found == nullptr) Fail(f.At("kind") + " " + Quote(kind) + " is not one of segment, node, file, relay");
  r.kind = found->kind;
  r.host_key = f.Text("host_key", kMaxNameBytes, /*allow_empty=*/true);
  r.locator = f.Text("locator", kMaxLocatorBytes);
  CheckLocator(f.At("locator"), r.kind, r.locator);
  f.Done();
  return r;
}

std::map<std::string, std::string> ParseMetadata(const json& value) {
  if (!value.is_object()) Fail("metadata is " + Describe(value) + ", not an object");
  if (value.size() > proto::kMaxMetadataEntries)
    Fail(fmt::format("metadata has {} entries (at most {})", value.size(), proto::kMaxMetadataEntries));
  std::map<std::string, std::string> out;
  for (const auto& [key, v] : value.items()) {
    std::string where = "metadata[" + Quote(key) + "]";
    Fields::CheckText("metadata key " + Quote(key), key, kMaxMetadataKeyBytes, false);
    if (!v.is_string()) Fail(where + " is " + Describe(v) + ", not a string");
    // Values are the producer's own text (newlines and all): length and UTF-8 only.
    const std::string& text = v.get_ref<const std::string&>();
    if (text.size() > proto::kMaxStringBytes)
      Fail(fmt::format("{} has {} bytes (at most {})", where, text.size(), proto::kMaxStringBytes));
    if (internal::FirstInvalidUtf8(text) != internal::kNpos) Fail(where + " is not valid UTF-8");
    out[key] = text;
  }
  return out;
}

HolderRecord ParseRecordJson(const json& root) {
  Fields f(root, "record");
  uint64_t format = f.U64("format", 0, UINT32_MAX);
  if (format != kFormat) Fail(fmt::format("record format {} is not supported (this side reads {})", format, kFormat));
  HolderRecord r;
  r.node = ParseNode(f.Take("node"));
  proto::VersionInfo& info = r.info;
  info.model = f.Text("model", 128);
  if (Status st = ValidateModelName(info.model); !st.ok()) Fail("model: " + st.message());
  info.version = f.U64("version", 1, UINT64_MAX);
  info.size = f.U64("size", 8, kMaxSnapshotBytes);
  std::string checksum = f.Text("checksum", 16);
  auto parsed = parse_checksum_hex(checksum);
  if (!parsed.ok()) Fail("checksum " + Quote(checksum) + ": " + parsed.status().message());
  info.checksum = *parsed;
  info.step = f.U64("step", 0, UINT64_MAX);
  info.publish_ns = f.NonNegativeI64("publish_ns");
  info.completed_ns = f.NonNegativeI64("completed_ns");
  info.metadata = ParseMetadata(f.Take("metadata"));
  const json& replicas = f.Take("replicas");
  if (!replicas.is_array()) Fail("replicas is " + Describe(replicas) + ", not an array");
  if (replicas.empty()) Fail("replicas is empty: a holder lists at least its own node");
  if (replicas.size() > proto::kMaxReplicas)
    Fail(fmt::format("replicas has {} entries (at most {})", replicas.size(), proto::kMaxReplicas));
  for (size_t i = 0; i < replicas.size(); ++i) info.replicas.push_back(ParseReplica(replicas[i], i));
  f.Done();
  bool lists_itself = false;
  for (const auto& rep : info.replicas)
    lists_itself |= rep.kind == proto::ReplicaKind::kNode && rep.locator == r.node.address;
  if (!lists_itself) Fail("replicas do not list the holder's own node " + Quote(r.node.address));
  return r;
}

}  // namespace

Status ValidateReplica(const proto::Replica& replica) {
  try {
    Fields::CheckText("replica host_key", replica.host_key, kMaxNameBytes, /*allow_empty=*/true);
    Fields::CheckText("replica locator", replica.locator, kMaxLocatorBytes, false);
    if (std::string(KindText(replica.kind)) == "?") Fail("replica kind " + std::to_string(int(replica.kind)) + " is unknown");
    CheckLocator("replica locator", replica.kind, replica.locator);
  } catch (const Fault& fault) {
    return Status::Corruption(fault.message);
  }
  return Status::OK();
}

NodeRecord NodeRecordFor(const std::string& name, const std::string& address, const std::string& host_key,
                         uint32_t pid) {
  std::string identity = host_key + "/" + address;
  return {checksum_hex(checksum64(std::as_bytes(std::span(identity.data(), identity.size())))), name, address,
          host_key, pid};
}

std::string EncodeHolderRecord(const HolderRecord& record) {
  const proto::VersionInfo& info = record.info;
  json replicas = json::array();
  for (const auto& r : info.replicas)
    replicas.push_back({{"kind", KindText(r.kind)}, {"host_key", r.host_key}, {"locator", r.locator}});
  json metadata = json::object();
  for (const auto& [k, v] : info.metadata) metadata[k] = v;
  json root = {{"format", kFormat},
               {"node",
                {{"id", record.node.id},
                 {"name", record.node.name},
                 {"address", record.node.address},
                 {"host_key", record.node.host_key},
                 {"pid", record.node.pid}}},
               {"model", info.model},
               {"version", info.version},
               {"size", info.size},
               {"checksum", checksum_hex(info.checksum)},
               {"step", info.step},
               {"publish_ns", info.publish_ns},
               {"completed_ns", info.completed_ns},
               {"metadata", std::move(metadata)},
               {"replicas", std::move(replicas)}};
  return root.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<HolderRecord> ParseHolderRecord(std::string_view text) {
  if (text.size() > kMaxRecordBytes)
    return Status::Corruption(fmt::format("registry record: {} bytes (at most {})", text.size(), kMaxRecordBytes));
  try {
    StrictParse strict;
    json root = json::parse(text.begin(), text.end(),
                            [&strict](int, json::parse_event_t event, json& parsed) { return strict(event, parsed); });
    return ParseRecordJson(root);
  } catch (const Fault& fault) {
    return Status::Corruption("registry record: " + fault.message);
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.size() > 200) what = what.substr(0, 200) + "...";  // "last read:" may quote a long token
    return Status::Corruption("registry record: not valid JSON: " + what);
  }
}

std::vector<HolderRecord> NearestHoldersOfLatest(const RegistryLookup& lookup, const std::string& host_key) {
  std::vector<HolderRecord> near, far;
  for (const auto& h : lookup.holders) {
    if (h.info.version != lookup.holders.front().info.version) break;  // newest version first
    (h.node.host_key == host_key ? near : far).push_back(h);
  }
  near.insert(near.end(), far.begin(), far.end());
  return near;
}

std::vector<HolderRecord> HoldersInOrder(const RegistryLookup& lookup, const std::string& host_key) {
  std::vector<HolderRecord> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < lookup.holders.size();) {
    size_t end = i;
    while (end < lookup.holders.size() && lookup.holders[end].info.version == lookup.holders[i].info.version) ++end;
    for (int near = 1; near >= 0; --near)
      for (size_t j = i; j < end; ++j) {
        const HolderRecord& h = lookup.holders[j];
        if ((h.node.host_key == host_key) == (near == 1) && seen.insert(h.node.address).second) out.push_back(h);
      }
    i = end;
  }
  return out;
}

}  // namespace viper
