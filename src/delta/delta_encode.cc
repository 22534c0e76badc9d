// DeltaEncoder: plans the blocks of a target snapshot against a base and codes each block with
// the smallest of ZERO / SPARSE / PLANES / RAW (include/viper/delta.h).
#include <zstd.h>

#include <algorithm>
#include <cmath>

#include "delta_format.h"
#include "delta_kernels.h"
#include "viper/delta.h"

namespace viper {

using namespace delta_internal;

namespace {

constexpr uint64_t kNoBase = UINT64_MAX;
// A zstd result is kept only if it saves at least this fraction.
constexpr double kMinZstdSaving = 0.03;

// What each byte plane of a residual looks like, read from the residual itself (element order),
// so that a block whose planes would all be stored raw is not split at all.
struct PlaneHints {
  bool zero[8] = {};
  double entropy[8] = {};  // Shannon bits per byte of up to 4096 sampled elements
  bool worth_planes(size_t width, double raw_bits) const {
    for (size_t k = 0; k < width; ++k)
      if (zero[k] || entropy[k] <= raw_bits) return true;
    return false;
  }
};

PlaneHints HintPlanes(const std::byte* r, size_t n, size_t width) {
  PlaneHints h;
  // OR of all 8-byte words: byte j of the result is the OR of bytes at offsets = j (mod 8), and
  // width divides 8, so plane k is all zero iff bytes k, k + width, ... of it are.
  uint64_t acc = 0;
  const size_t bytes = n * width;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v;
    std::memcpy(&v, r + i, 8);
    acc |= v;
  }
  uint8_t lanes[8];
  std::memcpy(lanes, &acc, 8);
  for (; i < bytes; ++i) lanes[i % 8] |= static_cast<uint8_t>(r[i]);
  constexpr size_t kSamples = 4096;
  const size_t stride = std::max<size_t>(1, n / kSamples);
  for (size_t k = 0; k < width; ++k) {
    uint8_t any = 0;
    for (size_t j = k; j < 8; j += width) any |= lanes[j];
    h.zero[k] = any == 0;
    if (h.zero[k]) continue;
    uint32_t counts[256] = {};
    size_t taken = 0;
    for (size_t e = 0; e < n && taken < kSamples; e += stride, ++taken) counts[static_cast<uint8_t>(r[e * width + k])]++;
    double bits = 0;
    for (uint32_t c : counts) {
      if (c == 0) continue;
      double q = static_cast<double>(c) / static_cast<double>(taken);
      bits -= q * std::log2(q);
    }
    h.entropy[k] = bits;
  }
  return h;
}

template <typename Fn>
auto ByWidth(uint8_t width, Fn&& fn) {
  switch (width) {
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    default: return fn(uint8_t{});
  }
}

void PutLeb128(std::vector<std::byte>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::byte>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::byte>(v));
}

}  // namespace

struct DeltaScratch::State {
  ZSTD_CCtx* cctx = nullptr;
  std::vector<std::byte> residual;
  std::vector<std::byte> planes;
  std::vector<std::byte> sparse;
  std::vector<std::byte> dense;
  std::vector<std::byte> zstd;
  std::vector<std::byte> gaps;
  std::vector<std::byte> values;
  ~State() { ZSTD_freeCCtx(cctx); }
};

DeltaScratch::DeltaScratch() : state_(std::make_unique<State>()) { state_->cctx = ZSTD_createCCtx(); }
DeltaScratch::~DeltaScratch() = default;

void DeltaBlockStats::Add(const DeltaBlockStats& other) {
  for (int m = 0; m < 4; ++m) {
    blocks[m] += other.blocks[m];
    target_bytes[m] += other.target_bytes[m];
    encoded_bytes[m] += other.encoded_bytes[m];
  }
}

uint64_t DeltaBlockStats::total_encoded() const {
  uint64_t sum = 0;
  for (uint64_t b : encoded_bytes) sum += b;
  return sum;
}

std::string_view delta_method_name(DeltaMethod method) {
  switch (method) {
    case DeltaMethod::kZero: return "ZERO";
    case DeltaMethod::kRaw: return "RAW";
    case DeltaMethod::kSparse: return "SPARSE";
    case DeltaMethod::kPlanes: return "PLANES";
  }
  return "?";
}

Result<DeltaEncoder> DeltaEncoder::Make(const Snapshot& base, uint64_t base_checksum, const Snapshot& target,
                                        uint64_t target_checksum, const DeltaOptions& options) {
  if (options.block_bytes < 4096 || options.block_bytes > kDeltaMaxBlockBytes)
    return Status::InvalidArgument("delta block_bytes " + std::to_string(options.block_bytes) + " is outside [4096, " +
                                   std::to_string(kDeltaMaxBlockBytes) + "]");
  if (options.zstd_level < ZSTD_minCLevel() || options.zstd_level > ZSTD_maxCLevel())
    return Status::InvalidArgument("delta zstd_level " + std::to_string(options.zstd_level) + " is out of range");
  DeltaEncoder enc;
  enc.base_ = base.bytes();
  enc.target_ = target.bytes();
  enc.base_checksum_ = base_checksum;
  enc.target_checksum_ = target_checksum;
  enc.options_ = options;
  auto add_range = [&](uint64_t offset, uint64_t length, uint8_t width, uint64_t base_offset) {
    const uint64_t step = options.block_bytes / width * width;
    for (uint64_t done = 0; done < length; done += step) {
      uint32_t len = static_cast<uint32_t>(std::min(step, length - done));
      enc.blocks_.push_back({offset + done, len, width, base_offset == kNoBase ? kNoBase : base_offset + done});
    }
  };
  uint64_t pos = 0;
  const uint64_t data = target.data_offset();
  for (const TensorInfo& t : target.tensors()) {
    const uint64_t begin = data + t.begin;
    if (begin > pos) add_range(pos, begin - pos, 1, kNoBase);  // the header, then padding
    const TensorInfo* b = base.find(t.name);
    const auto width = static_cast<uint8_t>(dtype_size(t.dtype));
    bool matched = b != nullptr && b->dtype == t.dtype && b->nbytes() == t.nbytes();
    add_range(begin, t.nbytes(), width, matched ? base.data_offset() + b->begin : kNoBase);
    pos = begin + t.nbytes();
  }
  if (pos < target.bytes().size()) add_range(pos, target.bytes().size() - pos, 1, kNoBase);
  return enc;
}

uint64_t DeltaEncoder::target_end_of(size_t block) const {
  if (block == 0) return 0;
  const Block& b = blocks_[std::min(block, blocks_.size()) - 1];
  return b.target_offset + b.length;
}

void DeltaEncoder::AppendHeader(std::vector<std::byte>* out) const {
  Put<uint32_t>(*out, kMagic);
  Put<uint16_t>(*out, kDeltaFormatVersion);
  Put<uint16_t>(*out, 0);
  Put<uint64_t>(*out, base_.size());
  Put<uint64_t>(*out, base_checksum_);
  Put<uint64_t>(*out, target_.size());
  Put<uint64_t>(*out, target_checksum_);
  Put<uint32_t>(*out, static_cast<uint32_t>(blocks_.size()));
  Put<uint32_t>(*out, 0);
}

namespace {

// Compresses src into `out` (replacing it) if that saves kMinZstdSaving; false otherwise.
bool TryZstd(ZSTD_CCtx* cctx, int level, const std::byte* src, size_t n, std::vector<std::byte>& out) {
  out.resize(ZSTD_compressBound(n));
  size_t z = ZSTD_compressCCtx(cctx, out.data(), out.size(), src, n, level);
  if (ZSTD_isError(z) || static_cast<double>(z) > static_cast<double>(n) * (1 - kMinZstdSaving)) return false;
  out.resize(z);
  return true;
}

// SPARSE payload: u32 count, u32 gap bytes, LEB128 gaps, count * width value bytes.
void BuildSparse(DeltaScratch::State& s, const std::byte* r, size_t n, uint8_t width, size_t nonzero, int level,
                 bool* zstd) {
  s.gaps.clear();
  s.values.resize(nonzero * width);
  size_t next = 0, k = 0;
  ForEachNonzero(r, n, width, [&](size_t i) {
    PutLeb128(s.gaps, i - next);
    std::memcpy(s.values.data() + k * width, r + i * width, width);
    next = i + 1;
    ++k;
  });
  s.sparse.clear();
  Put<uint32_t>(s.sparse, static_cast<uint32_t>(nonzero));
  Put<uint32_t>(s.sparse, static_cast<uint32_t>(s.gaps.size()));
  s.sparse.insert(s.sparse.end(), s.gaps.begin(), s.gaps.end());
  s.sparse.insert(s.sparse.end(), s.values.begin(), s.values.end());
  *zstd = false;
  if (s.sparse.size() >= 256 && TryZstd(s.cctx, level, s.sparse.data(), s.sparse.size(), s.zstd)) {
    const auto raw = static_cast<uint32_t>(s.sparse.size());
    s.sparse.resize(4 + s.zstd.size());
    std::memcpy(s.sparse.data(), &raw, 4);
    std::memcpy(s.sparse.data() + 4, s.zstd.data(), s.zstd.size());
    *zstd = true;
  }
}

// PLANES payload: per plane u8 kind (zero, raw, zstd), u32 bytes, data.
void BuildPlanes(DeltaScratch::State& s, const std::byte* r, size_t n, uint8_t width, int level, double raw_bits,
                 const PlaneHints& h) {
  const std::byte* planes = r;
  if (width > 1) {
    s.planes.resize(n * width);
    ByWidth(width, [&](auto t) { SplitPlanes<decltype(t)>(r, s.planes.data(), n); });
    planes = s.planes.data();
  }
  s.dense.clear();
  for (size_t k = 0; k < width; ++k) {
    const std::byte* p = planes + k * n;
    if (h.zero[k]) {
      Put<uint8_t>(s.dense, kPlaneZero);
      Put<uint32_t>(s.dense, 0);
    } else if (h.entropy[k] <= raw_bits && TryZstd(s.cctx, level, p, n, s.zstd)) {
      Put<uint8_t>(s.dense, kPlaneZstd);
      Put<uint32_t>(s.dense, static_cast<uint32_t>(s.zstd.size()));
      s.dense.insert(s.dense.end(), s.zstd.begin(), s.zstd.end());
    } else {
      Put<uint8_t>(s.dense, kPlaneRaw);
      Put<uint32_t>(s.dense, static_cast<uint32_t>(n));
      s.dense.insert(s.dense.end(), p, p + n);
    }
  }
}

}  // namespace

void DeltaEncoder::EncodeBlock(size_t i, DeltaScratch& scratch, std::vector<std::byte>* out,
                               DeltaBlockStats* stats) const {
  DeltaScratch::State& s = scratch.state();
  const Block& blk = blocks_[i];
  const std::byte* t = target_.data() + blk.target_offset;
  const std::byte* b = blk.base_offset == kNoBase ? nullptr : base_.data() + blk.base_offset;
  const size_t n = blk.length / blk.width;
  const std::byte* r = t;
  size_t nonzero = 0;
  if (b != nullptr) {
    s.residual.resize(blk.length);
    nonzero = ByWidth(blk.width, [&](auto e) { return XorCount<decltype(e)>(t, b, s.residual.data(), n); });
    r = s.residual.data();
  } else {
    nonzero = ByWidth(blk.width, [&](auto e) { return CountNonzero<decltype(e)>(t, n); });
  }
  BlockRecord rec;
  rec.width = blk.width;
  rec.length = blk.length;
  rec.target_offset = blk.target_offset;
  // The candidates: RAW (the target as-is) unless something smaller is found.
  DeltaMethod method = DeltaMethod::kRaw;
  const std::byte* payload = t;
  size_t payload_bytes = blk.length;
  bool uses_base = false, sparse_zstd = false;
  if (nonzero == 0) {
    method = DeltaMethod::kZero;
    payload_bytes = 0;
    uses_base = b != nullptr;
  } else {
    // Measured on the bench models: SPARSE wins below ~1/16 nonzero elements, PLANES above
    // ~1/8; in between both are built and the smaller kept.
    if (nonzero * 4 <= n) {
      BuildSparse(s, r, n, blk.width, nonzero, options_.zstd_level, &sparse_zstd);
      if (s.sparse.size() < payload_bytes) {
        method = DeltaMethod::kSparse;
        payload = s.sparse.data();
        payload_bytes = s.sparse.size();
        uses_base = b != nullptr;
      }
    }
    PlaneHints hints;
    if (nonzero * 64 > n) hints = HintPlanes(r, n, blk.width);
    if (nonzero * 64 > n && hints.worth_planes(blk.width, options_.raw_plane_entropy_bits)) {
      BuildPlanes(s, r, n, blk.width, options_.zstd_level, options_.raw_plane_entropy_bits, hints);
      if (s.dense.size() < payload_bytes) {
        method = DeltaMethod::kPlanes;
        payload = s.dense.data();
        payload_bytes = s.dense.size();
        uses_base = b != nullptr;
      }
    }
  }
  rec.method = static_cast<uint8_t>(method);
  rec.flags = static_cast<uint8_t>((uses_base ? kFlagBase : 0) |
                                   (method == DeltaMethod::kSparse && sparse_zstd ? kFlagZstd : 0));
  rec.base_offset = uses_base ? blk.base_offset : 0;
  rec.payload_bytes = static_cast<uint32_t>(payload_bytes);
  const size_t before = out->size();
  PutBlockRecord(*out, rec);
  out->insert(out->end(), payload, payload + payload_bytes);
  if (stats != nullptr) {
    auto m = static_cast<size_t>(method);
    stats->blocks[m]++;
    stats->target_bytes[m] += blk.length;
    stats->encoded_bytes[m] += out->size() - before;
  }
}

Result<std::vector<std::byte>> EncodeDelta(const Snapshot& base, uint64_t base_checksum, const Snapshot& target,
                                           uint64_t target_checksum, const DeltaOptions& options,
                                           DeltaBlockStats* stats) {
  VIPER_ASSIGN_OR_RETURN(DeltaEncoder enc, DeltaEncoder::Make(base, base_checksum, target, target_checksum, options));
  std::vector<std::byte> out;
  enc.AppendHeader(&out);
  DeltaScratch scratch;
  for (size_t i = 0; i < enc.blocks(); ++i) enc.EncodeBlock(i, scratch, &out, stats);
  return out;
}

}  // namespace viper
