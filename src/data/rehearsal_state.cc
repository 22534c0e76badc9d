#include "rehearsal_state.h"

#include <cstdint>
#include <cstring>
#include <map>

#include <fmt/format.h>

namespace viper::data_internal {
namespace {

constexpr char kMagic[4] = {'V', 'R', 'H', 'S'};
constexpr uint32_t kVersion = 1;
constexpr size_t kFixed = 48, kPerClass = 16;

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void Append(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

}  // namespace

std::vector<std::byte> EncodeRehearsalState(const RehearsalState& s) {
  std::vector<std::byte> out(reinterpret_cast<const std::byte*>(kMagic), reinterpret_cast<const std::byte*>(kMagic) + 4);
  Append<uint32_t>(out, kVersion);
  Append<uint32_t>(out, s.policy);
  Append<uint32_t>(out, 0);
  Append<uint64_t>(out, s.capacity);
  Append<uint64_t>(out, s.seen);
  Append<uint64_t>(out, s.sample_bytes);
  Append<uint64_t>(out, s.class_seen.size());
  for (const auto& [label, seen] : s.class_seen) {
    Append<int64_t>(out, label);
    Append<uint64_t>(out, seen);
  }
  return out;
}

Result<RehearsalState> DecodeRehearsalState(std::span<const std::byte> b) {
  auto bad = [](std::string what) { return Status::Corruption("rehearsal state: " + what); };
  if (b.size() < kFixed) return bad(fmt::format("{} bytes, shorter than the {}-byte fixed part", b.size(), kFixed));
  if (std::memcmp(b.data(), kMagic, 4) != 0) return bad("bad magic (expected \"VRHS\")");
  if (uint32_t v = Load<uint32_t>(&b[4]); v != kVersion) return bad(fmt::format("version {} is not {}", v, kVersion));
  RehearsalState s;
  s.policy = Load<uint32_t>(&b[8]);
  if (s.policy > 1) return bad(fmt::format("unknown policy {}", s.policy));
  if (Load<uint32_t>(&b[12]) != 0) return bad("reserved field is not zero");
  s.capacity = Load<uint64_t>(&b[16]);
  s.seen = Load<uint64_t>(&b[24]);
  s.sample_bytes = Load<uint64_t>(&b[32]);
  uint64_t classes = Load<uint64_t>(&b[40]);
  if (s.capacity == 0) return bad("capacity is 0");
  if (classes > (UINT64_MAX - kFixed) / kPerClass) return bad(fmt::format("{} classes cannot fit in a state", classes));
  if (kFixed + classes * kPerClass != b.size()) {
    return bad(fmt::format("{} classes need {} bytes of state, it has {}", classes, kFixed + classes * kPerClass, b.size()));
  }
  uint64_t sum = 0;
  for (uint64_t i = 0; i < classes; ++i) {
    const std::byte* p = b.data() + kFixed + i * kPerClass;
    int64_t label = Load<int64_t>(p);
    uint64_t seen = Load<uint64_t>(p + 8);
    if (label < -1) return bad(fmt::format("class {}: label {} is below -1", i, label));
    if (i > 0 && label <= s.class_seen.back().first) return bad(fmt::format("class {}: labels are not increasing", i));
    if (seen == 0 || seen > s.seen - sum) return bad(fmt::format("class {} (label {}): seen count {} does not fit the total {}", i, label, seen, s.seen));
    sum += seen;
    s.class_seen.emplace_back(label, seen);
  }
  if (sum != s.seen) return bad(fmt::format("the classes' seen counts add up to {}, not {}", sum, s.seen));
  return s;
}

Status CheckRehearsalState(const RehearsalState& s, const RecordFile& f) {
  auto bad = [&](std::string what) { return Status::Corruption(fmt::format("{}: {}", f.name(), what)); };
  if (f.size() > s.capacity) return bad(fmt::format("{} samples, more than the capacity {} it records", f.size(), s.capacity));
  std::map<int64_t, uint64_t> seen(s.class_seen.begin(), s.class_seen.end()), held;
  for (uint64_t i = 0; i < f.size(); ++i) {
    const RecordEntry& e = f.entry(i);
    if (s.sample_bytes != 0 && e.length != s.sample_bytes) {
      return bad(fmt::format("record {}: {} bytes, but the state says every sample has {}", i, e.length, s.sample_bytes));
    }
    if (s.policy == 1 && e.label < 0) return bad(fmt::format("record {}: no label in a class-balanced buffer", i));
    if (!seen.count(e.label)) return bad(fmt::format("record {}: label {} was never seen", i, e.label));
    if (++held[e.label] > seen[e.label]) {
      return bad(fmt::format("label {}: more samples held than were ever seen ({})", e.label, seen[e.label]));
    }
  }
  return Status::OK();
}

}  // namespace viper::data_internal
