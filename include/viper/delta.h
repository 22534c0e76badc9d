// Delta encoding of one snapshot against another: lossless, bit-exact, made for model versions
// that differ little (fine-tuning at small learning rates, bf16 RL updates, frozen layers).
//
// A delta turns a base snapshot B (the version a consumer holds) into a target snapshot V. The
// target buffer is cut into blocks. A block of a tensor that B also has (same name, dtype and
// byte length) is coded as the XOR of V's bytes with B's; every other byte (the header, padding,
// new or reshaped tensors) is coded as-is. Each block then takes the smallest of:
//   ZERO    residual all zero: no payload (an unchanged tensor costs only block headers);
//   SPARSE  few nonzero elements: LEB128 gaps between their indices + their residual values,
//           optionally zstd-compressed;
//   PLANES  the residual split into byte planes (byte k of every element together: sign and
//           exponent bytes of floats that barely moved are zero), each plane zero, raw or zstd;
//   RAW     the target bytes themselves (the decoder copies them).
// docs/ARCHITECTURE.md "Delta updates" has the measurements behind these choices.
//
// Stream format (docs/PROTOCOL.md, "Delta stream"): one header record, then one record per block
// in target order. Records can be cut into parts at record boundaries and decoded as they arrive,
// so encoding, sending and decoding overlap.
//
// The decoder treats the stream as untrusted: it never reads or writes outside the base, the
// target or the stream, checks that the blocks cover the target exactly once and in order, and
// reports the first fault as Corruption naming the record and field. It does not check the
// target's checksum: the caller hashes the decoded prefix (DeltaDecoder::decoded_bytes) and
// compares it with the announced checksum before the version goes live.
//
// Thread-safety: a DeltaEncoder is immutable after Make (EncodeBlock may run on several threads,
// each with its own DeltaScratch); a DeltaDecoder is single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "viper/snapshot.h"
#include "viper/status.h"

namespace viper {

enum class DeltaMethod : uint8_t { kZero = 0, kRaw = 1, kSparse = 2, kPlanes = 3 };

// Version 2 (2026-11-26) added the BITMAP plane kind (docs/PROTOCOL.md "Delta stream"); encoders
// write kDeltaFormatVersion, decoders read kDeltaMinFormatVersion .. kDeltaFormatVersion.
inline constexpr uint32_t kDeltaFormatVersion = 2;
inline constexpr uint32_t kDeltaMinFormatVersion = 1;
inline constexpr uint32_t kDeltaMaxBlockBytes = 16u << 20;  // a block's target bytes, at most
inline constexpr size_t kDeltaHeaderRecordBytes = 48;

struct DeltaOptions {
  uint32_t block_bytes = 1u << 20;  // target bytes per block (rounded down to the element width)
  int zstd_level = 1;               // for SPARSE and PLANES payloads
  // A byte plane whose sampled entropy is above this many bits per byte is stored raw, not tried
  // with zstd (which would gain little on it at its full cost). 7.0, measured on a real fp32 SGD
  // step (256 MiB MLP, one thread, CPU time, viper_delta_codec_bench --raw-bits, twice each):
  // against 7.7 the lowest mantissa plane (7.3 bits, zstd saved 7%) goes raw: encode 325-332 ms
  // instead of 410-411, decode 136-141 instead of 186, delta 83.0 MB instead of 78.5. Every delta
  // measured end to end waited for its encode, not its bytes (docs/ARCHITECTURE.md "Delta updates").
  double raw_plane_entropy_bits = 7.0;
};

// Bytes of each method in an encoded stream (target bytes they cover, encoded bytes they cost).
struct DeltaBlockStats {
  uint64_t blocks[4] = {};        // indexed by DeltaMethod
  uint64_t target_bytes[4] = {};
  uint64_t encoded_bytes[4] = {};  // record bytes, headers included
  void Add(const DeltaBlockStats& other);
  uint64_t total_encoded() const;
};

// Per-thread working memory of the encoder (zstd context, residual and plane buffers).
class DeltaScratch {
 public:
  DeltaScratch();
  ~DeltaScratch();
  DeltaScratch(const DeltaScratch&) = delete;
  DeltaScratch& operator=(const DeltaScratch&) = delete;
  struct State;
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

class DeltaEncoder {
 public:
  // Plans the blocks of `target` against `base`; `base_checksum` and `target_checksum` are the
  // xxh3 of their data regions (as announced; recorded in the header, checked by the decoder's
  // caller). Both snapshots must stay valid while the encoder is used. Cost: O(tensors).
  // Errors: InvalidArgument (block_bytes out of [4096, kDeltaMaxBlockBytes], level out of range).
  static Result<DeltaEncoder> Make(const Snapshot& base, uint64_t base_checksum, const Snapshot& target,
                                   uint64_t target_checksum, const DeltaOptions& options = {});

  size_t blocks() const { return blocks_.size(); }
  uint64_t target_size() const { return target_.size(); }
  // Target bytes covered by blocks [0, i): what a decoder has written after block i-1.
  uint64_t target_end_of(size_t block) const;
  // Appends the header record to *out.
  void AppendHeader(std::vector<std::byte>* out) const;
  // Appends the record of block `i` to *out; adds what it chose to *stats (optional).
  void EncodeBlock(size_t i, DeltaScratch& scratch, std::vector<std::byte>* out,
                   DeltaBlockStats* stats = nullptr) const;

  struct Block {
    uint64_t target_offset = 0;
    uint32_t length = 0;
    uint8_t width = 1;                    // element width in bytes (1, 2, 4, 8)
    uint64_t base_offset = UINT64_MAX;    // UINT64_MAX: no base range (coded as-is)
  };

 private:
  DeltaEncoder() = default;
  std::span<const std::byte> base_;
  std::span<const std::byte> target_;
  uint64_t base_checksum_ = 0;
  uint64_t target_checksum_ = 0;
  DeltaOptions options_;
  std::vector<Block> blocks_;
};

// The whole delta in one buffer (tests, benchmarks, the fuzz target's round trips).
Result<std::vector<std::byte>> EncodeDelta(const Snapshot& base, uint64_t base_checksum, const Snapshot& target,
                                           uint64_t target_checksum, const DeltaOptions& options = {},
                                           DeltaBlockStats* stats = nullptr);

// What a delta stream's header record says.
struct DeltaHeader {
  uint16_t version = 0;
  uint64_t base_size = 0;
  uint64_t base_checksum = 0;
  uint64_t target_size = 0;
  uint64_t target_checksum = 0;
  uint32_t blocks = 0;
};
// Parses the header record at the start of `stream` (Corruption if it is not one).
Result<DeltaHeader> ParseDeltaHeader(std::span<const std::byte> stream);

class DeltaDecoder {
 public:
  // Decodes a delta made against `base` (whose data region has checksum `base_checksum`) into
  // `target`. REQUIRES: base and target stay valid, do not overlap, and nothing else writes
  // `target` while decoding.
  DeltaDecoder(std::span<const std::byte> base, uint64_t base_checksum, std::span<std::byte> target);
  ~DeltaDecoder();
  DeltaDecoder(DeltaDecoder&&) noexcept;
  DeltaDecoder& operator=(DeltaDecoder&&) noexcept;

  // Applies the records in `part`: whole records, continuing the stream where the previous part
  // ended (the first part starts with the header). Errors (Corruption, naming the fault): a bad
  // or truncated record, a header whose base (size, checksum) or target size differs from the
  // ones given, a block out of order or out of bounds, a payload that does not decode to exactly
  // its block, data after the last block. After an error the decoder refuses further parts.
  Status Feed(std::span<const std::byte> part);
  // True once the header and every block it announced have been applied.
  bool complete() const;
  // Bytes of the target written so far: always a prefix [0, decoded_bytes()).
  uint64_t decoded_bytes() const;
  const DeltaHeader& header() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Decodes a whole stream (one part) into `target`; Corruption unless it is complete.
Status DecodeDelta(std::span<const std::byte> base, uint64_t base_checksum, std::span<const std::byte> stream,
                   std::span<std::byte> target);

std::string_view delta_method_name(DeltaMethod method);

}  // namespace viper
