// Snapshot: one immutable model version in the safetensors byte layout.
//
// Layout (identical in memory, on the wire and on disk):
//   [u64 little-endian N][N bytes of UTF-8 JSON header, padded with spaces][data region]
// The JSON maps tensor names to {"dtype","shape","data_offsets":[begin,end]} (offsets relative to
// the data region) plus an optional "__metadata__" object of string values. Viper's own keys are
// "viper.*" (see kMeta* below). When Viper writes, the data region starts at a multiple of 8 and
// every tensor at a multiple of `alignment` (64 by default); the zero padding between tensors is
// declared with "viper.alignment" so that the parser can tell it from a real gap (see
// docs/ARCHITECTURE.md: Alignment). With alignment 1 the file has no gaps and is accepted by every
// safetensors reader.
//
// A Snapshot does not own or copy the bytes: it holds a view plus a shared owner (a mapping, a
// segment lease, a vector) that keeps them alive. Snapshots are immutable and thread-safe to read.
//
// Errors. Every fault found in untrusted bytes (Parse, FromBuffer, OpenFile) is
// StatusCode::kCorruption with one message per fault that names the tensor or key and the numbers,
// e.g. `tensor "w": data_offsets [0, 40] end beyond the data region of 32 bytes`. OpenFile prefixes
// every message with "<path>: " (open/stat/mmap failures keep their errno code: NotFound, ...).
// Wrong arguments of the writer side (SnapshotLayout::Make, WriteHeader, BuildSnapshot) are
// kInvalidArgument. The full list of messages is in docs/ARCHITECTURE.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "viper/status.h"

namespace viper {

// Every fixed-size dtype of the safetensors spec.
enum class DType : uint8_t {
  kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU64, kU32, kU16, kU8, kBool,
  kF8_E4M3, kF8_E5M2,
};
inline constexpr DType kAllDTypes[] = {
    DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kI16,
    DType::kI8,  DType::kU64, DType::kU32, DType::kU16,  DType::kU8,  DType::kBool,
    DType::kF8_E4M3, DType::kF8_E5M2};

size_t dtype_size(DType dtype);            // bytes per element
std::string_view dtype_name(DType dtype);  // "F32", "BF16", "F8_E4M3", ...
Result<DType> parse_dtype(std::string_view name);

// Metadata keys Viper writes and reads.
inline constexpr std::string_view kMetaModel = "viper.model";
inline constexpr std::string_view kMetaVersion = "viper.version";
inline constexpr std::string_view kMetaStep = "viper.step";
inline constexpr std::string_view kMetaTimeNs = "viper.time_ns";
inline constexpr std::string_view kMetaChecksum = "viper.checksum";  // xxh3-64 of data, 16 hex
inline constexpr std::string_view kMetaLoss = "viper.loss";
inline constexpr std::string_view kMetaAlignment = "viper.alignment";

inline constexpr uint64_t kMaxAlignment = 4096;        // largest viper.alignment accepted
inline constexpr size_t kMaxModelNameBytes = 128;      // VersionStamp::model fits the reserved header

// xxh3-64 of `bytes`.
uint64_t checksum64(std::span<const std::byte> bytes);
// The same checksum computed over bytes that arrive in pieces (in order): Digest() after
// Update(a), Update(b) equals checksum64(a + b). Move-only; not thread-safe.
class Checksum64Stream {
 public:
  Checksum64Stream();
  ~Checksum64Stream();
  Checksum64Stream(Checksum64Stream&& other) noexcept;
  Checksum64Stream& operator=(Checksum64Stream&& other) noexcept;
  void Update(std::span<const std::byte> bytes);
  uint64_t Digest() const;

 private:
  void* state_ = nullptr;  // an XXH3 state of the implementation checksum64 uses
  bool avx2_ = false;
};
std::string checksum_hex(uint64_t checksum);  // 16 lowercase hex digits
// Exactly 16 hex digits (either case); anything else is Corruption ("malformed checksum ...").
Result<uint64_t> parse_checksum_hex(std::string_view hex);

// What a tensor is and where its bytes are. Offsets are relative to the data region.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty = scalar (one element)
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t num_elements() const;  // product of the dims (1 for a scalar); REQUIRES: no overflow
  uint64_t nbytes() const { return end - begin; }
};

struct ParseOptions {
  uint64_t max_header_bytes = 100ull << 20;  // header length N beyond this is rejected
  bool verify_checksum = false;              // verify viper.checksum if present
  bool require_checksum = false;             // a missing viper.checksum is an error (Corruption)
};

class Snapshot {
 public:
  Snapshot() = default;  // empty, invalid snapshot (no tensors, no bytes)

  // Validates `bytes` as a safetensors buffer; the Snapshot refers to `bytes` without copying
  // and keeps `owner` alive for as long as it (or a copy) lives. REQUIRES: `bytes` stay valid and
  // unchanged while `owner` lives (a writer changing them makes the snapshot's view inconsistent).
  // A gap before a tensor is accepted only when "viper.alignment" = A is declared and the tensor
  // begins at round_up(previous end, A) (padding content is not inspected). A present
  // "viper.checksum" must be 16 hex digits and a present "viper.alignment" a power of two in
  // [1, kMaxAlignment], whether or not the checksum is verified. Cost: O(header); the data is
  // touched only to verify the checksum.
  static Result<Snapshot> Parse(std::span<const std::byte> bytes, std::shared_ptr<const void> owner,
                                const ParseOptions& options = {});
  // Takes ownership of `bytes`.
  static Result<Snapshot> FromBuffer(std::vector<std::byte> bytes, const ParseOptions& options = {});
  // Maps the file read-only (MAP_PRIVATE) and parses it; errors name the path. The mapping is the
  // owner. As with any mapping, truncating the file while it is mapped raises SIGBUS on access:
  // files are replaced by rename, never rewritten in place (see FileTier).
  static Result<Snapshot> OpenFile(const std::filesystem::path& path, const ParseOptions& options = {});

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data order
  const TensorInfo* find(std::string_view name) const;                  // nullptr if absent
  // The tensor's bytes inside bytes() (no copy). REQUIRES: `tensor` is one of tensors().
  std::span<const std::byte> tensor_data(const TensorInfo& tensor) const;

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::optional<std::string> meta(std::string_view key) const;

  std::span<const std::byte> bytes() const { return bytes_; }  // the whole buffer
  std::span<const std::byte> data_region() const { return bytes_.subspan(data_offset_); }
  uint64_t header_size() const { return data_offset_ >= 8 ? data_offset_ - 8 : 0; }  // N
  uint64_t data_offset() const { return data_offset_; }

  // viper.* accessors: nullopt when the key is absent (or for version/step, not a number).
  std::optional<std::string> model() const { return meta(kMetaModel); }
  std::optional<uint64_t> version() const;
  std::optional<uint64_t> step() const;
  std::optional<uint64_t> time_ns() const;
  std::optional<double> loss() const;            // nullopt if absent or not a number
  std::optional<uint64_t> declared_checksum() const;

  uint64_t compute_checksum() const { return checksum64(data_region()); }
  // OK if viper.checksum matches the data region; Corruption if not; NotFound if absent.
  Status VerifyChecksum() const;

  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  std::span<const std::byte> bytes_;
  std::shared_ptr<const void> owner_;
  uint64_t data_offset_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<uint32_t> by_name_;  // indices into tensors_, sorted by name (for find)
  std::map<std::string, std::string> metadata_;
};

// The shape of a tensor to be written.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// The viper.* values that are known only when a version is finished. They are rendered into the
// header by SnapshotLayout::WriteHeader into space reserved at layout time: viper.model (omitted
// when empty), viper.version, viper.step, viper.time_ns, viper.checksum, viper.loss (omitted when
// unset; shortest round-trip decimal, "nan"/"inf" possible) and viper.alignment.
struct VersionStamp {
  std::string model;  // valid UTF-8, at most kMaxModelNameBytes bytes
  uint64_t version = 0;
  uint64_t step = 0;
  uint64_t time_ns = 0;
  uint64_t checksum = 0;
  std::optional<double> loss;
};

// Computes where every tensor goes before any byte is written, so that a producer can write
// tensors straight into their final place (a segment, a file) and stamp the header last.
// Thread-safety: immutable after Make.
class SnapshotLayout {
 public:
  // REQUIRES: alignment is a power of two in [1, 4096]. User metadata keys must not start with
  // "viper." (those are Viper's own). Errors: empty or duplicate names, negative dims, overflow.
  // Tensors are laid out in the given order, each at the next multiple of `alignment`. The header
  // space reserved is what the final header needs at the widest stamp (a model name of
  // kMaxModelNameBytes, 20-digit numbers), rounded so that data_offset() is a multiple of 8.
  static Result<SnapshotLayout> Make(std::vector<TensorSpec> tensors,
                                     std::map<std::string, std::string> user_metadata = {},
                                     uint64_t alignment = 64);

  // The layout a snapshot was written with, so that its header can be re-stamped in place (a node
  // assigning the version of a snapshot a client sent). Only a snapshot Viper laid out has one:
  // FailedPrecondition if `snapshot` is laid out otherwise (e.g. a foreign safetensors file; build
  // a new buffer from its tensors instead). Tensors keep their data order; user metadata is every
  // key outside viper.*; alignment is the declared viper.alignment.
  static Result<SnapshotLayout> Of(const Snapshot& snapshot);

  uint64_t total_bytes() const { return data_offset_ + data_bytes_; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + reserved header length
  uint64_t data_bytes() const { return data_bytes_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& user_metadata() const { return user_metadata_; }
  uint64_t alignment() const { return alignment_; }

  // Writes the length prefix and the JSON header (user metadata + the stamp) into
  // dst[0, data_offset()), padding with spaces. REQUIRES: dst.size() >= data_offset().
  // Errors (InvalidArgument): dst too small, model name too long or not UTF-8.
  Status WriteHeader(std::span<std::byte> dst, const VersionStamp& stamp) const;
  // Zeroes the padding between tensors in dst (dst is the whole buffer: header, then data).
  // REQUIRES: dst.size() >= total_bytes().
  void ZeroPadding(std::span<std::byte> dst) const;
  // Stamps, after the data is in place: zeroes the padding, computes the checksum of dst's data
  // region (one xxh3 pass), stores it in stamp->checksum, and writes the header.
  // REQUIRES: dst.size() >= total_bytes(), stamp != nullptr.
  Status Seal(std::span<std::byte> dst, VersionStamp* stamp) const;

 private:
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> user_metadata_;
  uint64_t alignment_ = 64;
  uint64_t data_offset_ = 0;
  uint64_t data_bytes_ = 0;
  std::string user_metadata_json_;  // rendered once at Make: "k":"v",... (no braces)
  std::string tensors_json_;        // rendered once at Make: "name":{...},... in data order
};

// The size of the snapshot that starts `bytes` when `bytes` may run on past it (a shared-memory
// segment keeps slack after its snapshot): 8 + N + the end of the last tensor. Checks the header
// as Parse does (length, UTF-8, JSON, tensor entries within `bytes`) but not the data; parse
// `bytes.first(extent)` to check the whole snapshot. Cost: O(header).
Result<uint64_t> SnapshotExtent(std::span<const std::byte> bytes, const ParseOptions& options = {});

// What a snapshot's header declares, read from the header alone while the data region lives
// elsewhere (a GPU-resident version: the header is copied to the host, the data stays on the
// device). `header` holds the 8-byte prefix and the JSON header (bytes past 8 + N are ignored);
// the data region is `data_bytes` long. Every check of Parse but the data's (no checksum can be
// verified here). Corruption as Parse. Cost: O(header).
struct SnapshotHeader {
  uint64_t data_offset = 0;  // 8 + N
  std::vector<TensorInfo> tensors;  // in data order; begin/end relative to the data region
  std::map<std::string, std::string> metadata;
};
Result<SnapshotHeader> ParseSnapshotHeader(std::span<const std::byte> header, uint64_t data_bytes,
                                           const ParseOptions& options = {});

// A named tensor's bytes, for building a snapshot from existing memory.
struct TensorData {
  TensorSpec spec;
  std::span<const std::byte> bytes;  // must be exactly num_elements * dtype_size bytes
};

// Builds a complete snapshot buffer (copying the tensor bytes once) and seals it.
Result<Snapshot> BuildSnapshot(const std::vector<TensorData>& tensors, VersionStamp stamp,
                               std::map<std::string, std::string> user_metadata = {},
                               uint64_t alignment = 64);

}  // namespace viper
