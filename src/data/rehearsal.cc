// RehearsalBuffer: reservoir and class-balanced sampling, draws, spill and restore.
// Contract: include/viper/rehearsal.h.
#include "viper/rehearsal.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>
#include <unordered_set>

#include <fmt/format.h>

#include "rehearsal_state.h"
#include "viper/log.h"
#include "viper/record_file.h"

namespace viper {

namespace {
constexpr const char* kSpillName = "rehearsal.vrec";
}

std::string_view rehearsal_policy_name(RehearsalPolicy policy) {
  return policy == RehearsalPolicy::kClassBalanced ? "class_balanced" : "reservoir";
}

Result<RehearsalPolicy> ParseRehearsalPolicy(std::string_view name) {
  if (name == "reservoir") return RehearsalPolicy::kReservoir;
  if (name == "class_balanced") return RehearsalPolicy::kClassBalanced;
  return Status::InvalidArgument(fmt::format("policy must be 'reservoir' or 'class_balanced', got '{}'", name));
}

RehearsalBuffer::RehearsalBuffer(const RehearsalOptions& options) : options_(options), rng_(options.seed) {}

Result<std::unique_ptr<RehearsalBuffer>> RehearsalBuffer::Open(const RehearsalOptions& options) {
  if (options.capacity < 1) return Status::InvalidArgument("RehearsalOptions: capacity must be >= 1");
  if (options.policy != RehearsalPolicy::kReservoir && options.policy != RehearsalPolicy::kClassBalanced) {
    return Status::InvalidArgument(fmt::format("RehearsalOptions: unknown policy {}", static_cast<uint32_t>(options.policy)));
  }
  std::unique_ptr<RehearsalBuffer> b(new RehearsalBuffer(options));
  b->slots_.reserve(std::min<size_t>(options.capacity, 1 << 20));
  if (!options.spill_dir.empty() && options.restore) {
    std::error_code ec;
    if (std::filesystem::exists(b->spill_path(), ec)) VIPER_RETURN_IF_ERROR(b->Restore());
  }
  return b;
}

std::filesystem::path RehearsalBuffer::spill_path() const {
  return options_.spill_dir.empty() ? std::filesystem::path() : options_.spill_dir / kSpillName;
}

size_t RehearsalBuffer::RandomBelow(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

void RehearsalBuffer::AddMember(size_t index) {
  auto& m = members_[slots_[index].label];
  member_pos_[index] = m.size();
  m.push_back(index);
}

// Takes slot `index` out of its class's list (swapping in the list's last member).
void RehearsalBuffer::RemoveMember(size_t index) {
  int64_t label = slots_[index].label;
  auto& m = members_[label];
  size_t pos = member_pos_[index];
  m[pos] = m.back();
  member_pos_[m[pos]] = pos;
  m.pop_back();
  if (m.empty()) members_.erase(label);
}

void RehearsalBuffer::Insert(Slot slot) {
  slots_.push_back(std::move(slot));
  member_pos_.push_back(0);
  AddMember(slots_.size() - 1);
}

void RehearsalBuffer::Replace(size_t index, Slot slot) {
  RemoveMember(index);
  slots_[index] = std::move(slot);
  AddMember(index);
}

void RehearsalBuffer::RemoveAt(size_t index) {
  RemoveMember(index);
  size_t last = slots_.size() - 1;
  if (index != last) {
    RemoveMember(last);
    slots_[index] = std::move(slots_[last]);
    AddMember(index);
  }
  slots_.pop_back();
  member_pos_.pop_back();
}

// The slot a new sample of `label` replaces in a full buffer, or none: CBRS (see the header).
std::optional<size_t> RehearsalBuffer::ChooseBalanced(int64_t label) {
  size_t largest = 0;
  for (const auto& [l, m] : members_) largest = std::max(largest, m.size());
  auto own = members_.find(label);
  size_t own_count = own == members_.end() ? 0 : own->second.size();
  if (own_count < largest) {
    std::vector<const std::vector<size_t>*> big;
    for (const auto& [l, m] : members_) {
      if (m.size() == largest) big.push_back(&m);
    }
    const auto& victims = *big[RandomBelow(big.size())];
    return victims[RandomBelow(victims.size())];
  }
  // One of the largest classes: reservoir sampling within the class.
  uint64_t n = class_seen_[label];
  if (std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_) >= own_count) return std::nullopt;
  return own->second[RandomBelow(own_count)];
}

Result<bool> RehearsalBuffer::Add(std::span<const std::byte> bytes, int64_t label) {
  if (options_.sample_bytes != 0 && bytes.size() != options_.sample_bytes) {
    return Status::InvalidArgument(fmt::format("rehearsal buffer: sample of {} bytes, expected {} (RehearsalOptions.sample_bytes)",
                                               bytes.size(), options_.sample_bytes));
  }
  if (label < -1 || (label < 0 && options_.policy == RehearsalPolicy::kClassBalanced)) {
    return Status::InvalidArgument(fmt::format("rehearsal buffer: label {} is not allowed ({})", label,
                                               options_.policy == RehearsalPolicy::kClassBalanced
                                                   ? "class_balanced needs labels >= 0"
                                                   : "labels are >= 0, or -1 for none"));
  }
  std::lock_guard<std::mutex> lk(mu_);
  seen_++;
  class_seen_[label]++;
  auto make = [&] { return Slot{std::make_shared<const std::vector<std::byte>>(bytes.begin(), bytes.end()), label}; };
  if (slots_.size() < options_.capacity) {
    Insert(make());
    return true;
  }
  std::optional<size_t> victim;
  if (options_.policy == RehearsalPolicy::kClassBalanced) {
    victim = ChooseBalanced(label);
  } else if (uint64_t j = std::uniform_int_distribution<uint64_t>(0, seen_ - 1)(rng_); j < options_.capacity) {
    victim = j;  // algorithm R
  }
  if (!victim) return false;
  Replace(*victim, make());
  return true;
}

std::vector<RehearsalSample> RehearsalBuffer::Draw(size_t k, std::optional<int64_t> label) {
  std::lock_guard<std::mutex> lk(mu_);
  const std::vector<size_t>* members = nullptr;  // with a label: the population is its class's slots
  if (label) {
    auto it = members_.find(*label);
    if (it == members_.end()) return {};
    members = &it->second;
  }
  size_t n = members ? members->size() : slots_.size();
  k = std::min(k, n);
  // Robert Floyd's algorithm: k distinct indices in O(k), then shuffled (the set's order is not random).
  std::vector<size_t> picked;
  picked.reserve(k);
  std::unordered_set<size_t> in;
  for (size_t j = n - k; j < n; ++j) {
    size_t t = RandomBelow(j + 1);
    size_t chosen = in.insert(t).second ? t : j;
    if (chosen == j) in.insert(j);
    picked.push_back(chosen);
  }
  std::shuffle(picked.begin(), picked.end(), rng_);
  std::vector<RehearsalSample> out;
  out.reserve(k);
  for (size_t i : picked) {
    const Slot& slot = slots_[members ? (*members)[i] : i];
    out.push_back({slot.bytes, slot.label});
  }
  return out;
}

Result<size_t> RehearsalBuffer::DrawInto(size_t k, std::span<std::byte> dst, std::span<int64_t> labels,
                                         std::optional<int64_t> label) {
  uint64_t sb = options_.sample_bytes;
  if (sb == 0) return Status::InvalidArgument("rehearsal buffer: DrawInto needs RehearsalOptions.sample_bytes");
  if (dst.size() / sb < k || labels.size() < k) {
    return Status::InvalidArgument(fmt::format("rehearsal buffer: DrawInto of {} samples of {} bytes into {} bytes and {} labels",
                                               k, sb, dst.size(), labels.size()));
  }
  auto drawn = Draw(k, label);
  for (size_t i = 0; i < drawn.size(); ++i) {
    std::memcpy(dst.data() + i * sb, drawn[i].bytes->data(), sb);
    labels[i] = drawn[i].label;
  }
  return drawn.size();
}

size_t RehearsalBuffer::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return slots_.size();
}

uint64_t RehearsalBuffer::seen() const {
  std::lock_guard<std::mutex> lk(mu_);
  return seen_;
}

std::map<int64_t, size_t> RehearsalBuffer::class_counts() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::map<int64_t, size_t> out;
  for (const auto& [label, m] : members_) out[label] = m.size();
  return out;
}

std::map<int64_t, uint64_t> RehearsalBuffer::class_seen() const {
  std::lock_guard<std::mutex> lk(mu_);
  return class_seen_;
}

// ---------------------------------------------------------------- whole state

RehearsalBufferState RehearsalBuffer::State() const {
  RehearsalBufferState out;
  std::lock_guard<std::mutex> lk(mu_);
  out.samples.reserve(slots_.size());
  for (const Slot& s : slots_) out.samples.push_back({s.bytes, s.label});
  out.members.reserve(slots_.size());
  for (const auto& [label, m] : members_) out.members.insert(out.members.end(), m.begin(), m.end());
  out.seen = seen_;
  out.class_seen = class_seen_;
  std::ostringstream rng;
  rng << rng_;
  out.rng = rng.str();
  return out;
}

Status RehearsalBuffer::LoadState(const RehearsalBufferState& state) {
  auto bad = [](std::string what) { return Status::InvalidArgument("rehearsal state: " + what); };
  const size_t n = state.samples.size();
  if (n > options_.capacity) return bad(fmt::format("{} samples, more than the capacity {}", n, options_.capacity));
  uint64_t sum = 0;
  for (const auto& [label, seen] : state.class_seen) {
    if (seen == 0 || seen > state.seen - sum) {
      return bad(fmt::format("class_seen[{}] = {} does not fit seen = {}", label, seen, state.seen));
    }
    sum += seen;
  }
  if (sum != state.seen) return bad(fmt::format("class_seen adds up to {}, not seen = {}", sum, state.seen));
  std::map<int64_t, uint64_t> held;
  for (size_t i = 0; i < n; ++i) {
    const RehearsalSample& s = state.samples[i];
    if (!s.bytes) return bad(fmt::format("sample {} has no bytes", i));
    if (options_.sample_bytes != 0 && s.bytes->size() != options_.sample_bytes) {
      return bad(fmt::format("sample {} has {} bytes, the buffer holds samples of {}", i, s.bytes->size(),
                             options_.sample_bytes));
    }
    if (options_.policy == RehearsalPolicy::kClassBalanced && s.label < 0) {
      return bad(fmt::format("sample {} has no label (-1) in a class-balanced buffer", i));
    }
    auto seen = state.class_seen.find(s.label);
    if (seen == state.class_seen.end()) return bad(fmt::format("sample {}: label {} was never seen", i, s.label));
    if (++held[s.label] > seen->second) {
      return bad(fmt::format("label {}: more samples held than seen ({})", s.label, seen->second));
    }
  }
  // members: the slots of each class, classes in increasing label order.
  if (state.members.size() != n) return bad(fmt::format("{} members for {} samples", state.members.size(), n));
  std::map<int64_t, std::vector<size_t>> members;
  std::vector<size_t> member_pos(n);
  std::vector<bool> listed(n, false);
  int64_t previous = INT64_MIN;
  for (size_t k = 0; k < n; ++k) {
    uint64_t index = state.members[k];
    if (index >= n || listed[index]) return bad(fmt::format("members[{}] = {} is not a slot listed once", k, index));
    listed[index] = true;
    int64_t label = state.samples[index].label;
    if (label < previous) return bad(fmt::format("members[{}]: label {} after label {}", k, label, previous));
    previous = label;
    auto& m = members[label];
    member_pos[index] = m.size();
    m.push_back(index);
  }
  std::mt19937_64 rng;
  std::istringstream in(state.rng);
  in >> rng;
  if (in.fail()) return bad("rng is not a std::mt19937_64 state");
  std::vector<Slot> slots;
  slots.reserve(n);
  for (const RehearsalSample& s : state.samples) slots.push_back({s.bytes, s.label});
  std::lock_guard<std::mutex> lk(mu_);
  slots_ = std::move(slots);
  members_ = std::move(members);
  member_pos_ = std::move(member_pos);
  seen_ = state.seen;
  class_seen_ = state.class_seen;
  rng_ = rng;
  return Status::OK();
}

// ---------------------------------------------------------------- spill and restore

Status RehearsalBuffer::Spill() {
  if (options_.spill_dir.empty()) return Status::FailedPrecondition("rehearsal buffer: no spill_dir configured");
  std::vector<Slot> slots;
  data_internal::RehearsalState state;
  {
    std::lock_guard<std::mutex> lk(mu_);
    slots = slots_;  // shared, immutable bytes: the write below runs without the lock
    state = {static_cast<uint32_t>(options_.policy), options_.capacity, seen_, options_.sample_bytes,
             {class_seen_.begin(), class_seen_.end()}};
  }
  std::error_code ec;
  std::filesystem::create_directories(options_.spill_dir, ec);
  if (ec) return Status::FromErrno(fmt::format("rehearsal spill: cannot create {}", options_.spill_dir.string()), ec.value());
  VIPER_ASSIGN_OR_RETURN(auto w, RecordWriter::Create(spill_path()));
  for (const Slot& s : slots) VIPER_RETURN_IF_ERROR(w->Append(*s.bytes, s.label));
  return w->Finish(data_internal::EncodeRehearsalState(state));
}

Status RehearsalBuffer::Restore() {
  std::filesystem::path path = spill_path();
  auto hint = [&](Status st) { return st.WithContext("rehearsal restore (remove the file to start empty)"); };
  auto file = RecordFile::Open(path);
  if (!file.ok()) return hint(file.status());
  auto state = data_internal::DecodeRehearsalState(file->metadata());
  if (!state.ok()) return hint(state.status().WithContext(path.string()));
  if (state->policy != static_cast<uint32_t>(options_.policy)) {
    return Status::InvalidArgument(fmt::format("rehearsal restore: {} was written with policy {}, the options ask for {}",
                                               path.string(), rehearsal_policy_name(RehearsalPolicy(state->policy)),
                                               rehearsal_policy_name(options_.policy)));
  }
  if (options_.sample_bytes != 0 && state->sample_bytes != options_.sample_bytes) {
    return Status::InvalidArgument(fmt::format("rehearsal restore: {} holds samples of {} bytes, the options ask for {}",
                                               path.string(), state->sample_bytes, options_.sample_bytes));
  }
  VIPER_RETURN_IF_ERROR(hint(data_internal::CheckRehearsalState(*state, *file)));
  std::lock_guard<std::mutex> lk(mu_);
  for (uint64_t i = 0; i < file->size(); ++i) {
    auto bytes = std::make_shared<std::vector<std::byte>>(file->entry(i).length);
    VIPER_RETURN_IF_ERROR(hint(file->ReadInto(i, *bytes)));
    Insert({std::move(bytes), file->entry(i).label});
  }
  seen_ = state->seen;
  class_seen_ = {state->class_seen.begin(), state->class_seen.end()};
  if (slots_.size() > options_.capacity) {
    log(LogLevel::kWarn, "rehearsal", "{} holds {} samples, more than the capacity {}: keeping a random {}", path.string(),
        slots_.size(), options_.capacity, options_.capacity);
    EvictTo(options_.capacity);
  }
  return Status::OK();
}

// Drops random samples (for kClassBalanced, from a largest class each time) down to `capacity`.
void RehearsalBuffer::EvictTo(size_t capacity) {
  while (slots_.size() > capacity) {
    if (options_.policy == RehearsalPolicy::kClassBalanced) {
      auto big = std::max_element(members_.begin(), members_.end(),
                                  [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
      RemoveAt(big->second[RandomBelow(big->second.size())]);
    } else {
      RemoveAt(RandomBelow(slots_.size()));
    }
  }
}

}  // namespace viper
