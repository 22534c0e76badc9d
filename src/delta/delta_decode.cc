// DeltaDecoder: applies a delta stream to a base, writing the target; strict about every length,
// offset and count because the stream comes from the network (include/viper/delta.h).
#include <zstd.h>

#include <algorithm>
#include <string>

#include "delta_format.h"
#include "delta_kernels.h"
#include "viper/delta.h"

namespace viper {

using namespace delta_internal;

namespace {

template <typename Fn>
auto ByWidth(uint8_t width, Fn&& fn) {
  switch (width) {
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    default: return fn(uint8_t{});
  }
}

Status Bad(const std::string& what) { return Status::Corruption("delta stream: " + what); }

// Reads the fields of one payload with bounds checks; the first fault sticks.
class Cursor {
 public:
  Cursor(const std::byte* p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  bool Read(T* v) {
    if (n_ - pos_ < sizeof(T)) return false;
    *v = Load<T>(p_ + pos_);
    pos_ += sizeof(T);
    return true;
  }
  const std::byte* Take(size_t n) {
    if (n_ - pos_ < n) return nullptr;
    const std::byte* at = p_ + pos_;
    pos_ += n;
    return at;
  }
  size_t remaining() const { return n_ - pos_; }

 private:
  const std::byte* p_;
  size_t n_;
  size_t pos_ = 0;
};

}  // namespace

Result<DeltaHeader> ParseDeltaHeader(std::span<const std::byte> stream) {
  if (stream.size() < kDeltaHeaderRecordBytes)
    return Bad("header record truncated (" + std::to_string(stream.size()) + " of " +
               std::to_string(kDeltaHeaderRecordBytes) + " bytes)");
  const std::byte* p = stream.data();
  if (Load<uint32_t>(p) != kMagic) return Bad("bad magic (not a Viper delta)");
  const auto version = Load<uint16_t>(p + 4);
  if (version < kDeltaMinFormatVersion || version > kDeltaFormatVersion)
    return Bad("format version " + std::to_string(version) + " not supported (this side reads " +
               std::to_string(kDeltaMinFormatVersion) + " to " + std::to_string(kDeltaFormatVersion) + ")");
  if (Load<uint16_t>(p + 6) != 0 || Load<uint32_t>(p + 44) != 0) return Bad("header: reserved fields are not zero");
  DeltaHeader h;
  h.version = version;
  h.base_size = Load<uint64_t>(p + 8);
  h.base_checksum = Load<uint64_t>(p + 16);
  h.target_size = Load<uint64_t>(p + 24);
  h.target_checksum = Load<uint64_t>(p + 32);
  h.blocks = Load<uint32_t>(p + 40);
  // Every block covers 1 .. kDeltaMaxBlockBytes target bytes.
  if (h.blocks > h.target_size || static_cast<uint64_t>(h.blocks) * kDeltaMaxBlockBytes < h.target_size)
    return Bad("header: " + std::to_string(h.blocks) + " blocks cannot cover a target of " +
               std::to_string(h.target_size) + " bytes");
  return h;
}

struct DeltaDecoder::Impl {
  std::span<const std::byte> base;
  uint64_t base_checksum = 0;
  std::span<std::byte> target;
  bool have_header = false;
  DeltaHeader header;
  uint32_t blocks_done = 0;
  uint64_t decoded = 0;
  Status failed;
  ZSTD_DCtx* dctx = nullptr;
  std::vector<std::byte> planes;
  std::vector<std::byte> unpacked;
  std::vector<std::byte> zeros;   // a zero plane
  std::vector<std::byte> bitmap;  // a BITMAP plane's decompressed bitmap
  std::vector<std::byte> values;  // and values

  ~Impl() { ZSTD_freeDCtx(dctx); }
  Status Header(std::span<const std::byte> bytes);
  Status Block(const BlockRecord& rec, const std::byte* payload);
  Status Decompress(const std::byte* src, size_t n, std::byte* dst, size_t expected, const char* what);
  Status Sparse(const BlockRecord& rec, const std::byte* payload, const std::byte* b, std::byte* t);
  Status Planes(const BlockRecord& rec, const std::byte* payload, const std::byte* b, std::byte* t);
  Status BitmapPlane(size_t k, const std::byte* data, size_t bytes, size_t n, std::byte* dst);
};

Status DeltaDecoder::Impl::Header(std::span<const std::byte> bytes) {
  VIPER_ASSIGN_OR_RETURN(header, ParseDeltaHeader(bytes));
  if (header.base_size != base.size() || header.base_checksum != base_checksum)
    return Bad("made against a base of " + std::to_string(header.base_size) + " bytes with checksum " +
               checksum_hex(header.base_checksum) + ", but the base here has " + std::to_string(base.size()) +
               " bytes and checksum " + checksum_hex(base_checksum));
  if (header.target_size != target.size())
    return Bad("target of " + std::to_string(header.target_size) + " bytes, expected " + std::to_string(target.size()));
  have_header = true;
  return Status::OK();
}

Status DeltaDecoder::Impl::Decompress(const std::byte* src, size_t n, std::byte* dst, size_t expected,
                                      const char* what) {
  if (dctx == nullptr) dctx = ZSTD_createDCtx();
  if (dctx == nullptr) return Status::ResourceExhausted("delta: cannot create a zstd context");
  size_t got = ZSTD_decompressDCtx(dctx, dst, expected, src, n);
  if (ZSTD_isError(got)) return Bad(std::string(what) + ": zstd: " + ZSTD_getErrorName(got));
  if (got != expected)
    return Bad(std::string(what) + ": decompressed to " + std::to_string(got) + " bytes, expected " +
               std::to_string(expected));
  return Status::OK();
}

// SPARSE: u32 count, u32 gap bytes, count LEB128 gaps, count * width values.
Status DeltaDecoder::Impl::Sparse(const BlockRecord& rec, const std::byte* payload, const std::byte* b, std::byte* t) {
  const size_t n = rec.length / rec.width;
  const std::byte* body = payload;
  size_t body_bytes = rec.payload_bytes;
  if (rec.flags & kFlagZstd) {
    Cursor c(payload, rec.payload_bytes);
    uint32_t raw = 0;
    // The largest honest SPARSE body: every element, with 5-byte gaps.
    if (!c.Read(&raw) || raw < 8 || raw > 8 + n * (5 + static_cast<size_t>(rec.width)))
      return Bad("SPARSE: bad uncompressed size");
    unpacked.resize(raw);
    VIPER_RETURN_IF_ERROR(Decompress(payload + 4, c.remaining(), unpacked.data(), raw, "SPARSE"));
    body = unpacked.data();
    body_bytes = raw;
  }
  Cursor c(body, body_bytes);
  uint32_t count = 0, gap_bytes = 0;
  if (!c.Read(&count) || !c.Read(&gap_bytes)) return Bad("SPARSE: truncated counts");
  if (count == 0 || count > n) return Bad("SPARSE: " + std::to_string(count) + " elements in a block of " + std::to_string(n));
  const std::byte* gaps = c.Take(gap_bytes);
  const std::byte* values = gaps == nullptr ? nullptr : c.Take(static_cast<size_t>(count) * rec.width);
  if (values == nullptr || c.remaining() != 0) return Bad("SPARSE: sizes do not add up to the payload");
  if (b != nullptr) {
    std::memcpy(t, b, rec.length);
  } else {
    std::memset(t, 0, rec.length);
  }
  size_t g = 0, next = 0;
  for (uint32_t k = 0; k < count; ++k) {
    uint64_t gap = 0;
    for (int shift = 0;; shift += 7) {
      if (g >= gap_bytes || shift > 35) return Bad("SPARSE: bad gap encoding at element " + std::to_string(k));
      auto byte = static_cast<uint8_t>(gaps[g++]);
      gap |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) break;
    }
    if (gap >= n - next) return Bad("SPARSE: element index beyond the block");
    size_t index = next + gap;
    XorBytes(t + index * rec.width, values + static_cast<size_t>(k) * rec.width, t + index * rec.width, rec.width);
    next = index + 1;
  }
  if (g != gap_bytes) return Bad("SPARSE: " + std::to_string(gap_bytes - g) + " gap bytes left over");
  return Status::OK();
}

// BITMAP plane (since version 2; delta_format.h): header, bitmap, values, each checked before use.
Status DeltaDecoder::Impl::BitmapPlane(size_t k, const std::byte* data, size_t bytes, size_t n, std::byte* dst) {
  const std::string where = "PLANES: plane " + std::to_string(k) + ": BITMAP ";
  Cursor c(data, bytes);
  uint32_t count = 0, bitmap_stored = 0;
  uint8_t bitmap_coding = 0, values_coding = 0;
  uint16_t reserved = 0;
  if (!c.Read(&count) || !c.Read(&bitmap_coding) || !c.Read(&values_coding) || !c.Read(&reserved) ||
      !c.Read(&bitmap_stored))
    return Bad(where + "header truncated");
  if (count == 0 || count > n) return Bad(where + "count " + std::to_string(count) + " in a plane of " + std::to_string(n));
  if (bitmap_coding > kCodingZstd || values_coding > kCodingZstd || reserved != 0)
    return Bad(where + "codings " + std::to_string(bitmap_coding) + "/" + std::to_string(values_coding) +
               " or reserved field " + std::to_string(reserved));
  const size_t bitmap_bytes = (n + 7) / 8;
  const std::byte* stored = c.Take(bitmap_stored);
  if (stored == nullptr) return Bad(where + "bitmap of " + std::to_string(bitmap_stored) + " bytes runs past the plane");
  const std::byte* bits = stored;
  if (bitmap_coding == kCodingZstd) {
    if (bitmap.size() < bitmap_bytes) bitmap.resize(bitmap_bytes);
    VIPER_RETURN_IF_ERROR(Decompress(stored, bitmap_stored, bitmap.data(), bitmap_bytes, (where + "bitmap").c_str()));
    bits = bitmap.data();
  } else if (bitmap_stored != bitmap_bytes) {
    return Bad(where + "raw bitmap of " + std::to_string(bitmap_stored) + " bytes, expected " + std::to_string(bitmap_bytes));
  }
  if (n % 8 != 0 && (static_cast<uint8_t>(bits[n / 8]) >> (n % 8)) != 0) return Bad(where + "bits set past the plane");
  if (const size_t set = CountBits(bits, n); set != count)
    return Bad(where + "bitmap has " + std::to_string(set) + " bits set, count says " + std::to_string(count));
  // The values go to scratch with kNonzeroSlack spare bytes, which ExpandNonzero may read.
  const size_t values_stored = c.remaining();
  const std::byte* stored_values = c.Take(values_stored);
  if (values.size() < count + kNonzeroSlack) values.resize(count + kNonzeroSlack);
  if (values_coding == kCodingZstd) {
    VIPER_RETURN_IF_ERROR(Decompress(stored_values, values_stored, values.data(), count, (where + "values").c_str()));
  } else if (values_stored != count) {
    return Bad(where + std::to_string(values_stored) + " raw values, expected " + std::to_string(count));
  } else {
    std::memcpy(values.data(), stored_values, count);
  }
  ExpandNonzero(bits, values.data(), dst, n);
  return Status::OK();
}

// PLANES: per plane u8 kind, u32 bytes, data; then element i = its bytes from each plane. Raw
// planes are read in place, the others decoded into `planes`.
Status DeltaDecoder::Impl::Planes(const BlockRecord& rec, const std::byte* payload, const std::byte* b, std::byte* t) {
  const size_t n = rec.length / rec.width;
  if (planes.size() < rec.length) planes.resize(rec.length);
  const std::byte* from[8] = {};
  Cursor c(payload, rec.payload_bytes);
  for (size_t k = 0; k < rec.width; ++k) {
    uint8_t kind = 0;
    uint32_t bytes = 0;
    if (!c.Read(&kind) || !c.Read(&bytes)) return Bad("PLANES: plane " + std::to_string(k) + " truncated");
    std::byte* dst = planes.data() + k * n;
    const std::byte* data = c.Take(bytes);
    if (data == nullptr) return Bad("PLANES: plane " + std::to_string(k) + " runs past the payload");
    from[k] = dst;
    if (kind == kPlaneZero && bytes == 0) {
      if (zeros.size() < n) zeros.resize(n);  // only ever zeros
      from[k] = zeros.data();
    } else if (kind == kPlaneRaw && bytes == n) {
      from[k] = data;
    } else if (kind == kPlaneZstd) {
      VIPER_RETURN_IF_ERROR(Decompress(data, bytes, dst, n, "PLANES"));
    } else if (kind == kPlaneBitmap && header.version >= 2) {
      VIPER_RETURN_IF_ERROR(BitmapPlane(k, data, bytes, n, dst));
    } else {
      return Bad("PLANES: plane " + std::to_string(k) + " of kind " + std::to_string(kind) + " with " +
                 std::to_string(bytes) + " bytes");
    }
  }
  if (c.remaining() != 0) return Bad("PLANES: " + std::to_string(c.remaining()) + " bytes after the last plane");
  ByWidth(rec.width, [&](auto e) { JoinPlanes<decltype(e)>(from, b, t, n); });
  return Status::OK();
}

Status DeltaDecoder::Impl::Block(const BlockRecord& rec, const std::byte* payload) {
  const bool uses_base = rec.flags & kFlagBase;
  if (rec.method > static_cast<uint8_t>(DeltaMethod::kPlanes)) return Bad("unknown method " + std::to_string(rec.method));
  if (rec.width != 1 && rec.width != 2 && rec.width != 4 && rec.width != 8)
    return Bad("element width " + std::to_string(rec.width));
  if ((rec.flags & ~(kFlagBase | kFlagZstd)) != 0 || rec.reserved != 0) return Bad("unknown flags");
  if ((rec.flags & kFlagZstd) && rec.method != static_cast<uint8_t>(DeltaMethod::kSparse))
    return Bad("zstd flag on a block that is not SPARSE");
  if (rec.length == 0 || rec.length > kDeltaMaxBlockBytes || rec.length % rec.width != 0)
    return Bad("block length " + std::to_string(rec.length) + " (width " + std::to_string(rec.width) + ")");
  if (rec.target_offset != decoded) return Bad("block starts at " + std::to_string(rec.target_offset) + ", expected " + std::to_string(decoded));
  if (rec.length > target.size() - decoded) return Bad("block ends beyond the target");
  if (uses_base ? (rec.base_offset > base.size() || rec.length > base.size() - rec.base_offset) : rec.base_offset != 0)
    return Bad("base range [" + std::to_string(rec.base_offset) + ", +" + std::to_string(rec.length) + ") outside the " +
               std::to_string(base.size()) + "-byte base");
  const std::byte* b = uses_base ? base.data() + rec.base_offset : nullptr;
  std::byte* t = target.data() + rec.target_offset;
  switch (static_cast<DeltaMethod>(rec.method)) {
    case DeltaMethod::kZero:
      if (rec.payload_bytes != 0) return Bad("ZERO block with a payload");
      if (b != nullptr) {
        std::memcpy(t, b, rec.length);
      } else {
        std::memset(t, 0, rec.length);
      }
      break;
    case DeltaMethod::kRaw:
      if (rec.payload_bytes != rec.length) return Bad("RAW payload of " + std::to_string(rec.payload_bytes) + " bytes");
      if (b != nullptr) {
        XorBytes(payload, b, t, rec.length);
      } else {
        std::memcpy(t, payload, rec.length);
      }
      break;
    case DeltaMethod::kSparse: VIPER_RETURN_IF_ERROR(Sparse(rec, payload, b, t)); break;
    case DeltaMethod::kPlanes: VIPER_RETURN_IF_ERROR(Planes(rec, payload, b, t)); break;
  }
  decoded += rec.length;
  blocks_done++;
  if (blocks_done == header.blocks && decoded != target.size())
    return Bad("the last block ends at " + std::to_string(decoded) + " of the " + std::to_string(target.size()) + "-byte target");
  return Status::OK();
}

DeltaDecoder::DeltaDecoder(std::span<const std::byte> base, uint64_t base_checksum, std::span<std::byte> target)
    : impl_(std::make_unique<Impl>()) {
  impl_->base = base;
  impl_->base_checksum = base_checksum;
  impl_->target = target;
}
DeltaDecoder::~DeltaDecoder() = default;
DeltaDecoder::DeltaDecoder(DeltaDecoder&&) noexcept = default;
DeltaDecoder& DeltaDecoder::operator=(DeltaDecoder&&) noexcept = default;

Status DeltaDecoder::Feed(std::span<const std::byte> part) {
  Impl& d = *impl_;
  if (!d.failed.ok()) return d.failed;
  size_t pos = 0;
  auto fail = [&](Status st) {
    d.failed = st;
    return st;
  };
  if (!d.have_header) {
    if (Status st = d.Header(part); !st.ok()) return fail(st);
    pos = kDeltaHeaderRecordBytes;
  }
  while (pos < part.size()) {
    std::string where = "block " + std::to_string(d.blocks_done) + " (target offset " + std::to_string(d.decoded) + ")";
    if (d.blocks_done == d.header.blocks) return fail(Bad(std::to_string(part.size() - pos) + " bytes after the last block"));
    if (part.size() - pos < kBlockRecordBytes) return fail(Bad(where + ": record truncated"));
    BlockRecord rec = LoadBlockRecord(part.data() + pos);
    pos += kBlockRecordBytes;
    if (rec.payload_bytes > part.size() - pos)
      return fail(Bad(where + ": payload of " + std::to_string(rec.payload_bytes) + " bytes but " +
                      std::to_string(part.size() - pos) + " remain in the part"));
    if (Status st = d.Block(rec, part.data() + pos); !st.ok()) return fail(st.WithContext(where));
    pos += rec.payload_bytes;
  }
  return Status::OK();
}

bool DeltaDecoder::complete() const { return impl_->have_header && impl_->blocks_done == impl_->header.blocks; }
uint64_t DeltaDecoder::decoded_bytes() const { return impl_->decoded; }
const DeltaHeader& DeltaDecoder::header() const { return impl_->header; }

Status DecodeDelta(std::span<const std::byte> base, uint64_t base_checksum, std::span<const std::byte> stream,
                   std::span<std::byte> target) {
  DeltaDecoder decoder(base, base_checksum, target);
  VIPER_RETURN_IF_ERROR(decoder.Feed(stream));
  if (!decoder.complete())
    return Status::Corruption("delta stream: ends after " + std::to_string(decoder.decoded_bytes()) + " of " +
                              std::to_string(target.size()) + " target bytes");
  return Status::OK();
}

}  // namespace viper
