// DeltaEncoder: plans the blocks of a target snapshot against a base and codes each block with
// the smallest of ZERO / SPARSE / PLANES / RAW (include/viper/delta.h).
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_literalCompressionMode (in libzstd since 1.4.5)
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "delta_format.h"
#include "delta_kernels.h"
#include "viper/delta.h"

namespace viper {

using namespace delta_internal;

namespace {

constexpr uint64_t kNoBase = UINT64_MAX;
// A zstd result is kept only if it saves at least this fraction.
constexpr double kMinZstdSaving = 0.03;

// A plane whose sampled share of nonzero bytes lies in [kBitmapMinNonzero, kBitmapMaxNonzero] is
// coded as BITMAP (bitmap of its nonzero bytes + those bytes) instead of one zstd frame: on the
// SGD model's byte-1 mantissa plane (18% nonzero, 1.29 bits a byte) zstd level 1 spends 217 ms
// per 256 MiB model matching many short sequences for 15.9 MB; the bitmap and the values, each
// through zstd without effective LZ (level -10, Huffman literals), take 53 ms for 11.3 MB
// (measured 2026-11-26, docs/ARCHITECTURE.md "Delta updates"). Sparser planes (the SGD model's
// byte 2: 0.2%) stay zstd, which is smaller there; denser ones too.
constexpr double kBitmapMinNonzero = 0, kBitmapMaxNonzero = 0.5;
constexpr int kBitmapZstdLevel = -10;

// What each byte plane of a residual looks like (zero or not, entropy, share of nonzero bytes), so
// that a block whose planes would all be stored raw is not coded as PLANES.
struct PlaneHints {
  bool zero[8] = {};
  double entropy[8] = {};  // Shannon bits per byte of up to 4096 sampled elements
  double nonzero[8] = {};  // share of nonzero bytes among those samples
  bool worth_planes(size_t width, double raw_bits) const {
    for (size_t k = 0; k < width; ++k)
      if (zero[k] || entropy[k] <= raw_bits) return true;
    return false;
  }
};

// Fills the entropy and nonzero share of every plane that is not zero; byte_at(e, k) is byte k of
// element e.
template <typename ByteAt>
void SamplePlanes(PlaneHints& h, size_t n, size_t width, ByteAt&& byte_at) {
  constexpr size_t kSamples = 4096;
  const size_t stride = std::max<size_t>(1, n / kSamples);
  for (size_t k = 0; k < width; ++k) {
    if (h.zero[k]) continue;
    uint32_t counts[256] = {};
    size_t taken = 0;
    for (size_t e = 0; e < n && taken < kSamples; e += stride, ++taken) counts[static_cast<uint8_t>(byte_at(e, k))]++;
    double bits = 0;
    for (uint32_t c : counts) {
      if (c == 0) continue;
      double q = static_cast<double>(c) / static_cast<double>(taken);
      bits -= q * std::log2(q);
    }
    h.entropy[k] = bits;
    h.nonzero[k] = taken == 0 ? 0 : 1.0 - static_cast<double>(counts[0]) / static_cast<double>(taken);
  }
}

// Hints read from a residual in element order.
PlaneHints HintResidual(const std::byte* r, size_t n, size_t width) {
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
  for (size_t k = 0; k < width; ++k) {
    uint8_t any = 0;
    for (size_t j = k; j < 8; j += width) any |= lanes[j];
    h.zero[k] = any == 0;
  }
  SamplePlanes(h, n, width, [&](size_t e, size_t k) { return r[e * width + k]; });
  return h;
}

// Hints read from planes already split by XorSplitPlanes (plane_or: the OR of each plane).
PlaneHints HintSplit(const std::byte* planes, size_t n, size_t width, const uint8_t* plane_or) {
  PlaneHints h;
  for (size_t k = 0; k < width; ++k) h.zero[k] = plane_or[k] == 0;
  SamplePlanes(h, n, width, [&](size_t e, size_t k) { return planes[k * n + e]; });
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

// Scratch of at least n bytes. Scratch vectors only grow, so that they are zero-filled once.
std::byte* Room(std::vector<std::byte>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

struct DeltaScratch::State {
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_CCtx* bitmap_cctx = nullptr;  // kBitmapZstdLevel with Huffman literals, for BITMAP planes
  std::vector<std::byte> residual;
  std::vector<std::byte> planes;
  std::vector<std::byte> sparse;
  std::vector<std::byte> zstd;
  std::vector<std::byte> gaps;
  std::vector<std::byte> values;
  std::vector<std::byte> bitmap;
  std::vector<std::byte> plane_out[8];  // each plane's coded bytes (zstd or BITMAP)
  std::byte plane_head[8][kPlaneHeaderBytes];
  struct Segment {
    const std::byte* data;
    size_t bytes;
  };
  std::vector<Segment> payload;  // the chosen payload, pieces in order
  ~State() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeCCtx(bitmap_cctx);
  }
};

DeltaScratch::DeltaScratch() : state_(std::make_unique<State>()) {
  state_->cctx = ZSTD_createCCtx();
  state_->bitmap_cctx = ZSTD_createCCtx();
  // Negative levels store literals raw unless told otherwise; an error here (a libzstd without
  // the parameter) only costs size.
  (void)ZSTD_CCtx_setParameter(state_->bitmap_cctx, ZSTD_c_compressionLevel, kBitmapZstdLevel);
  (void)ZSTD_CCtx_setParameter(state_->bitmap_cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
}
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

// SPARSE payload: u32 count, u32 gap bytes, LEB128 gaps, count * width value bytes. The residual
// is r ^ y (y == nullptr: r itself).
void BuildSparse(DeltaScratch::State& s, const std::byte* r, const std::byte* y, size_t n, uint8_t width,
                 size_t nonzero, int level, bool* zstd) {
  s.gaps.clear();
  s.values.resize(nonzero * width);
  size_t next = 0, k = 0;
  ForEachNonzero(r, y, n, width, [&](size_t i) {
    PutLeb128(s.gaps, i - next);
    if (y != nullptr) {
      XorBytes(r + i * width, y + i * width, s.values.data() + k * width, width);
    } else {
      std::memcpy(s.values.data() + k * width, r + i * width, width);
    }
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

// zstd of src[0, n) with the context's parameters into dst if the frame fits in `cap` bytes (zstd
// gives up as soon as it does not); its size, or 0.
size_t ZstdInto(ZSTD_CCtx* cctx, const std::byte* src, size_t n, std::byte* dst, size_t cap) {
  const size_t z = ZSTD_compress2(cctx, dst, cap, src, n);
  return ZSTD_isError(z) ? 0 : z;
}

size_t MaxSaved(size_t n) { return static_cast<size_t>(static_cast<double>(n) * (1 - kMinZstdSaving)); }

// Writes plane p[0, n) as BITMAP data at dst (header, bitmap, values: delta_format.h); returns its
// size, or 0 if it would not save kMinZstdSaving over raw. REQUIRES: dst has room for
// kBitmapHeaderBytes + (n + 7) / 8 + n bytes.
size_t WriteBitmapPlane(DeltaScratch::State& s, const std::byte* p, size_t n, std::byte* dst) {
  const size_t bitmap_bytes = (n + 7) / 8;
  const size_t count = SplitNonzero(p, n, Room(s.bitmap, bitmap_bytes), Room(s.values, n + kNonzeroSlack));
  if (count == 0) return 0;
  std::byte* at = dst + kBitmapHeaderBytes;
  auto put = [&](const std::byte* src, size_t len, uint8_t* coding) {
    size_t z = ZstdInto(s.bitmap_cctx, src, len, at, MaxSaved(len));
    *coding = z != 0 ? kCodingZstd : kCodingRaw;
    if (z == 0) std::memcpy(at, src, z = len);
    at += z;
    return static_cast<uint32_t>(z);
  };
  uint8_t bitmap_coding = 0, values_coding = 0;
  const uint32_t bitmap_stored = put(s.bitmap.data(), bitmap_bytes, &bitmap_coding);
  put(s.values.data(), count, &values_coding);
  const auto total = static_cast<size_t>(at - dst);
  if (total > MaxSaved(n)) return 0;
  const auto count32 = static_cast<uint32_t>(count);
  std::memcpy(dst, &count32, 4);
  std::memcpy(dst + 4, &bitmap_coding, 1);
  std::memcpy(dst + 5, &values_coding, 1);
  std::memset(dst + 6, 0, 2);
  std::memcpy(dst + 8, &bitmap_stored, 4);
  return total;
}

// PLANES payload (per plane u8 kind, u32 bytes, data) from the block's planes (plane k at
// planes + k * n), as pieces in s.payload that point into the planes and s.plane_out; returns its
// size, or 0 if it is not smaller than `budget`.
size_t BuildPlanes(DeltaScratch::State& s, const std::byte* planes, size_t n, uint8_t width, int level,
                   double raw_bits, const PlaneHints& h, size_t budget) {
  (void)ZSTD_CCtx_setParameter(s.cctx, ZSTD_c_compressionLevel, level);  // checked by Make
  s.payload.clear();
  size_t total = 0;
  for (size_t k = 0; k < width; ++k) {
    const std::byte* p = planes + k * n;
    const std::byte* data = p;
    uint8_t kind = kPlaneRaw;
    size_t bytes = n;
    if (h.zero[k]) {
      kind = kPlaneZero;
      bytes = 0;
    } else if (h.entropy[k] <= raw_bits) {
      std::byte* dst = Room(s.plane_out[k], kBitmapHeaderBytes + (n + 7) / 8 + n);
      const bool bitmap = h.nonzero[k] >= kBitmapMinNonzero && h.nonzero[k] <= kBitmapMaxNonzero;
      const size_t coded = bitmap ? WriteBitmapPlane(s, p, n, dst) : ZstdInto(s.cctx, p, n, dst, MaxSaved(n));
      if (coded != 0) {
        kind = bitmap ? kPlaneBitmap : kPlaneZstd;
        data = dst;
        bytes = coded;
      }
    }
    const auto bytes32 = static_cast<uint32_t>(bytes);
    std::memcpy(s.plane_head[k], &kind, 1);
    std::memcpy(s.plane_head[k] + 1, &bytes32, 4);
    s.payload.push_back({s.plane_head[k], kPlaneHeaderBytes});
    if (bytes != 0) s.payload.push_back({data, bytes});
    total += kPlaneHeaderBytes + bytes;
    if (total >= budget) return 0;
  }
  return total;
}

// Room for n more bytes in *out, so that the appends after it copy without reallocating or
// zero-filling. A part is appended to block by block (the node's parts have 4): room for 4 blocks
// like this one at once, else each of them would copy the part again. Capacity never written is
// never faulted in.
void ReserveMore(std::vector<std::byte>* out, size_t n) {
  if (out->capacity() - out->size() < n) out->reserve(std::max(out->size() + 4 * n, 2 * out->capacity()));
}

void Append(std::vector<std::byte>* out, const std::byte* p, size_t n) { out->insert(out->end(), p, p + n); }

}  // namespace

void DeltaEncoder::EncodeBlock(size_t i, DeltaScratch& scratch, std::vector<std::byte>* out,
                               DeltaBlockStats* stats) const {
  DeltaScratch::State& s = scratch.state();
  const Block& blk = blocks_[i];
  const std::byte* t = target_.data() + blk.target_offset;
  const std::byte* b = blk.base_offset == kNoBase ? nullptr : base_.data() + blk.base_offset;
  const size_t n = blk.length / blk.width;
  // The residual is r ^ y (y == nullptr: r). 2- and 4-byte elements with a base (every float
  // tensor) take one fused pass that also splits the planes; the rest get the residual written.
  const std::byte* r = t;
  const std::byte* y = nullptr;
  const std::byte* planes = nullptr;  // already split, with their ORs
  uint8_t plane_or[8] = {};
  size_t nonzero = 0;
  if (b != nullptr && std::memcmp(t, b, blk.length) == 0) {
    // An unchanged block (a frozen layer) costs one compare instead of the XOR pass; a changed
    // one differs within its first elements, so the compare stops at once.
    nonzero = 0;
  } else if (b != nullptr && (blk.width == 2 || blk.width == 4)) {
    std::byte* split = Room(s.planes, blk.length);
    nonzero = blk.width == 2 ? XorSplitPlanes<uint16_t>(t, b, split, n, plane_or)
                             : XorSplitPlanes<uint32_t>(t, b, split, n, plane_or);
    planes = split;
    y = b;
  } else if (b != nullptr) {
    std::byte* residual = Room(s.residual, blk.length);
    nonzero = ByWidth(blk.width, [&](auto e) { return XorCount<decltype(e)>(t, b, residual, n); });
    r = residual;
  } else {
    nonzero = ByWidth(blk.width, [&](auto e) { return CountNonzero<decltype(e)>(t, n); });
  }
  // The candidates: RAW (the target as-is) unless something smaller is found.
  DeltaMethod method = DeltaMethod::kRaw;
  size_t payload_bytes = blk.length;
  bool sparse_zstd = false;
  if (nonzero == 0) {
    method = DeltaMethod::kZero;
    payload_bytes = 0;
  } else {
    // Measured on the bench models: SPARSE wins below ~1/16 nonzero elements, PLANES above
    // ~1/8; in between both are built and the smaller kept.
    if (nonzero * 4 <= n) {
      BuildSparse(s, r, y, n, blk.width, nonzero, options_.zstd_level, &sparse_zstd);
      if (s.sparse.size() < payload_bytes) {
        method = DeltaMethod::kSparse;
        payload_bytes = s.sparse.size();
      }
    }
    if (nonzero * 64 > n) {
      const PlaneHints hints = planes != nullptr ? HintSplit(planes, n, blk.width, plane_or) : HintResidual(r, n, blk.width);
      if (hints.worth_planes(blk.width, options_.raw_plane_entropy_bits)) {
        if (planes == nullptr && blk.width > 1) {
          std::byte* split = Room(s.planes, blk.length);
          ByWidth(blk.width, [&](auto e) { SplitPlanes<decltype(e)>(r, split, n); });
          planes = split;
        }
        size_t got = BuildPlanes(s, planes != nullptr ? planes : r, n, blk.width, options_.zstd_level,
                                 options_.raw_plane_entropy_bits, hints, payload_bytes);
        if (got != 0) {
          method = DeltaMethod::kPlanes;
          payload_bytes = got;
        }
      }
    }
  }
  const bool uses_base = b != nullptr && method != DeltaMethod::kRaw;
  BlockRecord rec;
  rec.method = static_cast<uint8_t>(method);
  rec.width = blk.width;
  rec.flags = static_cast<uint8_t>((uses_base ? kFlagBase : 0) |
                                   (method == DeltaMethod::kSparse && sparse_zstd ? kFlagZstd : 0));
  rec.length = blk.length;
  rec.target_offset = blk.target_offset;
  rec.base_offset = uses_base ? blk.base_offset : 0;
  rec.payload_bytes = static_cast<uint32_t>(payload_bytes);
  std::byte head[kBlockRecordBytes];
  StoreBlockRecord(head, rec);
  const size_t at = out->size();
  ReserveMore(out, kBlockRecordBytes + payload_bytes);
  Append(out, head, kBlockRecordBytes);
  if (method == DeltaMethod::kSparse) Append(out, s.sparse.data(), payload_bytes);
  if (method == DeltaMethod::kRaw) Append(out, t, payload_bytes);
  if (method == DeltaMethod::kPlanes)
    for (const auto& piece : s.payload) Append(out, piece.data, piece.bytes);
  if (stats != nullptr) {
    auto m = static_cast<size_t>(method);
    stats->blocks[m]++;
    stats->target_bytes[m] += blk.length;
    stats->encoded_bytes[m] += out->size() - at;
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
