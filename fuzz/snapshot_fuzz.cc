// libFuzzer target for the snapshot parser, the first code that touches untrusted bytes.
//
// Any byte string must parse or fail with a Corruption message, never crash. When it parses
// (with and without checksum verification) the result must satisfy the format's invariants,
// every tensor byte must be readable, and rebuilding the snapshot with Viper's writer must give
// back the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "viper/snapshot.h"

namespace {

#define FUZZ_CHECK(cond)                                               \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "snapshot_fuzz: invariant failed: %s\n", #cond); \
      std::abort();                                                    \
    }                                                                  \
  } while (0)

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads every byte so that ASan sees any view that points outside the input.
uint8_t Touch(std::span<const std::byte> bytes) {
  uint8_t acc = 0;
  for (std::byte b : bytes) acc ^= static_cast<uint8_t>(b);
  return acc;
}

void CheckTensors(const viper::Snapshot& s) {
  const uint64_t data_size = s.data_region().size();
  uint64_t pos = 0;
  volatile uint8_t sink = 0;
  for (const viper::TensorInfo& t : s.tensors()) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= data_size);
    FUZZ_CHECK(t.begin >= pos);  // data order, no overlap
    FUZZ_CHECK(t.nbytes() == t.num_elements() * viper::dtype_size(t.dtype));
    std::span<const std::byte> data = s.tensor_data(t);
    FUZZ_CHECK(data.size() == t.nbytes());
    FUZZ_CHECK(t.nbytes() == 0 || data.data() == s.bytes().data() + s.data_offset() + t.begin);
    FUZZ_CHECK(s.find(t.name) == &t);
    sink = sink ^ Touch(data);
    pos = t.end;
  }
  FUZZ_CHECK(pos == data_size);  // the tensors cover the data region
}

void CheckSnapshot(const viper::Snapshot& s, const uint8_t* data, size_t size, bool verified) {
  FUZZ_CHECK(s.bytes().data() == reinterpret_cast<const std::byte*>(data) && s.bytes().size() == size);
  FUZZ_CHECK(s.data_offset() >= 8 && s.data_offset() <= size);
  FUZZ_CHECK(s.header_size() == LoadLe64(data));
  CheckTensors(s);
  // The accessors must cope with whatever strings the metadata holds.
  (void)s.model();
  (void)s.version();
  (void)s.step();
  (void)s.time_ns();
  (void)s.loss();
  std::optional<uint64_t> declared = s.declared_checksum();
  FUZZ_CHECK(declared.has_value() == s.metadata().contains(std::string(viper::kMetaChecksum)));
  viper::Status verify = s.VerifyChecksum();
  FUZZ_CHECK(verify.ok() == (declared && *declared == s.compute_checksum()));
  if (verified && declared) FUZZ_CHECK(verify.ok());
}

// Viper's writer must accept what the parser accepted (except empty tensor names, which the
// format allows and Make refuses) and give back the same tensors.
void CheckRebuild(const viper::Snapshot& s) {
  std::vector<viper::TensorData> tensors;
  for (const viper::TensorInfo& t : s.tensors()) {
    if (t.name.empty()) return;
    tensors.push_back({{t.name, t.dtype, t.shape}, s.tensor_data(t)});
  }
  std::map<std::string, std::string> user;
  for (const auto& [key, value] : s.metadata()) {
    if (!key.starts_with("viper.")) user.emplace(key, value);
  }
  auto rebuilt = viper::BuildSnapshot(tensors, viper::VersionStamp{}, user, 64);
  FUZZ_CHECK(rebuilt.ok());
  FUZZ_CHECK(rebuilt->tensors().size() == s.tensors().size());
  FUZZ_CHECK(rebuilt->VerifyChecksum().ok());
  for (const viper::TensorInfo& t : s.tensors()) {
    const viper::TensorInfo* r = rebuilt->find(t.name);
    FUZZ_CHECK(r != nullptr && r->dtype == t.dtype && r->shape == t.shape && r->nbytes() == t.nbytes());
    FUZZ_CHECK(r->nbytes() == 0 || std::memcmp(rebuilt->tensor_data(*r).data(), s.tensor_data(t).data(), r->nbytes()) == 0);
  }
  for (const auto& [key, value] : user) FUZZ_CHECK(rebuilt->meta(key) == value);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  bool structure_ok = false;
  for (bool verify : {false, true}) {
    viper::ParseOptions options;
    options.verify_checksum = verify;
    auto parsed = viper::Snapshot::Parse(bytes, nullptr, options);
    if (!parsed.ok()) {
      FUZZ_CHECK(parsed.status().code() == viper::StatusCode::kCorruption);
      FUZZ_CHECK(!parsed.status().message().empty());
      // Verification adds exactly one way to fail.
      if (structure_ok) FUZZ_CHECK(parsed.status().message().starts_with("checksum mismatch: "));
      continue;
    }
    structure_ok = true;
    CheckSnapshot(*parsed, data, size, verify);
    if (!verify) CheckRebuild(*parsed);
  }
  // The header alone (a GPU-resident version's): accepts what Parse accepted, with its tensors,
  // and fails only with Corruption on anything else.
  if (size >= 8) {
    const uint64_t n = LoadLe64(data);
    const uint64_t data_bytes = n <= size - 8 ? size - 8 - n : 0;
    auto header = viper::ParseSnapshotHeader(bytes, data_bytes);
    if (!header.ok()) {
      FUZZ_CHECK(header.status().code() == viper::StatusCode::kCorruption && !structure_ok);
    } else if (structure_ok) {
      auto parsed = viper::Snapshot::Parse(bytes, nullptr);
      FUZZ_CHECK(parsed.ok() && header->data_offset == parsed->data_offset());
      FUZZ_CHECK(header->tensors.size() == parsed->tensors().size());
      for (size_t i = 0; i < header->tensors.size(); ++i)
        FUZZ_CHECK(header->tensors[i].name == parsed->tensors()[i].name &&
                   header->tensors[i].begin == parsed->tensors()[i].begin && header->tensors[i].end == parsed->tensors()[i].end);
    }
  }
  return 0;
}
