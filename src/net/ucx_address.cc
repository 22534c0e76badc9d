#include "ucx_address.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace viper::net::detail {
namespace {

constexpr uint8_t kHeaderDebugInfo = 1, kHeaderUuid = 2, kHeaderClientId = 4, kHeaderAmOnly = 8;
constexpr uint8_t kNullResource = 0xff;
constexpr uint8_t kLast = 0x80;
constexpr uint8_t kMdEmptyDevice = 0x80;
constexpr uint8_t kDeviceNumPaths = 0x40, kDeviceSysDevice = 0x20, kDeviceLengthMask = 0x1f;
constexpr uint8_t kIfaceHasEpAddress = 0x40, kIfaceLengthMask = 0x3f;
constexpr uint8_t kSysDeviceUnknown = 0xff;
constexpr size_t kIfaceAttrV1 = 16, kIfaceAttrV2 = 8;
constexpr size_t kMaxMdIndex = 63;  // UCX keeps md indexes in a 64-bit map

// A bounds-checked reader: every read names the field it was for.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  size_t offset() const { return at_; }
  bool done() const { return at_ == bytes_.size(); }

  Result<uint8_t> Byte(const char* field) {
    VIPER_RETURN_IF_ERROR(Need(1, field));
    return static_cast<uint8_t>(bytes_[at_++]);
  }
  Result<std::span<const std::byte>> Bytes(size_t n, const char* field) {
    VIPER_RETURN_IF_ERROR(Need(n, field));
    auto out = bytes_.subspan(at_, n);
    at_ += n;
    return out;
  }
  Status Fault(const std::string& what) const {
    return Status::InvalidArgument(fmt::format("UCX worker address ({} bytes): {} at offset {}", bytes_.size(), what, at_));
  }

 private:
  Status Need(size_t n, const char* field) const {
    if (bytes_.size() - at_ >= n) return Status::OK();
    return Status::InvalidArgument(fmt::format("UCX worker address ({} bytes): {} ({} bytes) runs past the end at offset {}",
                                               bytes_.size(), field, n, at_));
  }
  std::span<const std::byte> bytes_;
  size_t at_ = 0;
};

// A value in the low bits of `first` (under `mask`); in v2 the all-ones value means "in the next
// byte" (UCX's ucp_address_unpack_byte_extended).
Result<size_t> Extended(Reader& r, uint8_t first, uint8_t mask, int version, const char* field) {
  uint8_t value = first & mask;
  if (version == 2 && value == mask) {
    VIPER_ASSIGN_OR_RETURN(uint8_t next, r.Byte(field));
    return static_cast<size_t>(next);
  }
  return static_cast<size_t>(value);
}

float LoadFloat(std::span<const std::byte> bytes, size_t at) {
  float f;
  std::memcpy(&f, bytes.data() + at, sizeof(f));
  return f;
}

// v1 interface attributes: overhead, bandwidth, latency overhead (floats), priority and flags.
// UCX computes lane scores from the floats: they must be numbers it could have sent.
Status CheckAttributesV1(Reader& r, std::span<const std::byte> attr) {
  const float overhead = LoadFloat(attr, 0), bandwidth = LoadFloat(attr, 4), latency = LoadFloat(attr, 8);
  if (!std::isfinite(overhead) || overhead < 0) return r.Fault("interface overhead is not a finite non-negative number");
  if (!std::isfinite(bandwidth) || bandwidth == 0) return r.Fault("interface bandwidth is not a finite non-zero number");
  if (!std::isfinite(latency) || latency < 0) return r.Fault("interface latency is not a finite non-negative number");
  return Status::OK();
}

Status ParseInterfaces(Reader& r, int version, uint8_t md_index, size_t device_bytes, UcxWorkerAddress& out) {
  for (bool last = false; !last;) {
    if (out.interfaces.size() >= kMaxUcxInterfaces)
      return r.Fault(fmt::format("more than {} interfaces", kMaxUcxInterfaces));
    UcxInterface iface;
    iface.md_index = md_index;
    iface.device_address_bytes = device_bytes;
    VIPER_ASSIGN_OR_RETURN(auto name, r.Bytes(2, "transport name checksum"));
    iface.transport = static_cast<uint16_t>(static_cast<uint8_t>(name[0]) | static_cast<uint8_t>(name[1]) << 8);
    VIPER_ASSIGN_OR_RETURN(auto attr, r.Bytes(version == 1 ? kIfaceAttrV1 : kIfaceAttrV2, "interface attributes"));
    if (version == 1) VIPER_RETURN_IF_ERROR(CheckAttributesV1(r, attr));
    VIPER_ASSIGN_OR_RETURN(uint8_t length, r.Byte("interface address length"));
    last = (length & kLast) != 0;
    if (length & kIfaceHasEpAddress) return r.Fault("endpoint addresses in a worker address");
    VIPER_ASSIGN_OR_RETURN(iface.interface_address_bytes,
                           Extended(r, length, kIfaceLengthMask, version, "interface address length (extended)"));
    iface.interface_address_offset = r.offset();
    VIPER_ASSIGN_OR_RETURN(auto iface_address, r.Bytes(iface.interface_address_bytes, "interface address"));
    for (size_t i = 0; i < 8 && i < iface_address.size(); ++i)
      iface.interface_address_head |= static_cast<uint64_t>(static_cast<uint8_t>(iface_address[i])) << (8 * i);
    out.interfaces.push_back(iface);
  }
  return Status::OK();
}

Status ParseDevice(Reader& r, int version, uint8_t md, UcxWorkerAddress& out, bool* last_device) {
  const bool empty = (md & kMdEmptyDevice) != 0;
  VIPER_ASSIGN_OR_RETURN(size_t md_index, Extended(r, md, version == 1 ? 0x1f : 0x7f, version, "md index (extended)"));
  if (md_index > kMaxMdIndex) return r.Fault(fmt::format("md index {} over {}", md_index, kMaxMdIndex));
  VIPER_ASSIGN_OR_RETURN(uint8_t length, r.Byte("device address length"));
  *last_device = (length & kLast) != 0;
  VIPER_ASSIGN_OR_RETURN(size_t device_bytes,
                         Extended(r, length, kDeviceLengthMask, version, "device address length (extended)"));
  if (length & kDeviceNumPaths) {
    VIPER_ASSIGN_OR_RETURN(uint8_t paths, r.Byte("number of paths"));
    if (paths < 2) return r.Fault(fmt::format("{} paths flagged (UCX flags 2 or more only)", paths));
  }
  if (length & kDeviceSysDevice) {
    VIPER_ASSIGN_OR_RETURN(uint8_t sys_device, r.Byte("system device"));
    if (sys_device == kSysDeviceUnknown) return r.Fault("the unknown system device flagged as present");
  }
  VIPER_RETURN_IF_ERROR(r.Bytes(device_bytes, "device address").status());
  out.devices++;
  if (empty) return Status::OK();
  return ParseInterfaces(r, version, static_cast<uint8_t>(md_index), device_bytes, out);
}

}  // namespace

Result<UcxWorkerAddress> ParseUcxWorkerAddress(std::span<const std::byte> address) {
  Reader r(address);
  UcxWorkerAddress out;
  VIPER_ASSIGN_OR_RETURN(uint8_t first, r.Byte("header"));
  uint8_t flags = 0;
  switch (first & 0x0f) {
    case 0:
      out.version = 1;
      flags = first >> 4;
      break;
    case 1: {
      out.version = 2;
      if (first >> 4 != 0) return r.Fault("v2 header with bits set beside the version");
      VIPER_ASSIGN_OR_RETURN(flags, r.Byte("header flags"));
      break;
    }
    default:
      return r.Fault(fmt::format("address version {} (UCX 1.13 knows 0 and 1, and aborts on others)", first & 0x0f));
  }
  if (flags & ~(kHeaderDebugInfo | kHeaderUuid | kHeaderClientId | kHeaderAmOnly))
    return r.Fault(fmt::format("unknown header flags 0x{:02x}", flags));
  if (flags & kHeaderDebugInfo) return r.Fault("worker name present (UCX_ADDRESS_DEBUG_INFO is not supported)");
  if (out.version == 1 && !(flags & kHeaderUuid)) return r.Fault("v1 address without a worker uuid");
  if (flags & kHeaderUuid) VIPER_RETURN_IF_ERROR(r.Bytes(8, "worker uuid").status());
  if (flags & kHeaderClientId) VIPER_RETURN_IF_ERROR(r.Bytes(8, "client id").status());

  VIPER_ASSIGN_OR_RETURN(uint8_t md, r.Byte("first device"));
  if (md != kNullResource) {
    for (bool last = false; !last;) {
      VIPER_RETURN_IF_ERROR(ParseDevice(r, out.version, md, out, &last));
      if (last) break;
      VIPER_ASSIGN_OR_RETURN(md, r.Byte("next device"));
    }
  }
  if (!r.done()) return r.Fault("bytes after the last device");
  return out;
}

namespace {

// UCX's transport name checksum (ucs_crc16_string: CRC-16-CCITT, reflected, inverted).
constexpr uint16_t TransportChecksum(std::string_view name) {
  uint16_t crc = 0xffff;
  for (char c : name) {
    crc ^= static_cast<uint8_t>(c);
    for (int bit = 0; bit < 8; ++bit) crc = static_cast<uint16_t>((crc >> 1) ^ ((crc & 1) ? 0x8408 : 0));
  }
  return static_cast<uint16_t>(~crc);
}

// Shared-memory transports whose interface address grows by the pid namespace when the process
// runs in a namespace of its own, as a flag in the address says; UCX reads the namespace only
// then (UCX 1.13: uct_posix_iface_addr_pack and uct_posix_is_reachable, uct_cma_iface_get_address
// and uct_cma_iface_is_reachable).
struct NamespacedAddress {
  uint16_t transport;
  uint64_t layout_bits;     // bits of the head that must be set for this layout (0: none)
  uint64_t namespace_flag;  // the bit of the head that says the namespace follows
  size_t base_bytes, extended_bytes;
};
constexpr NamespacedAddress kNamespacedAddresses[] = {
    // posix: a u64 segment id; in procfs mode (bit 63, UCX's default) the namespace follows it.
    {TransportChecksum("posix"), uint64_t{1} << 63, uint64_t{1} << 60, 8, 16},
    // cma: a pid_t, then the u64 namespace after 4 bytes of padding.
    {TransportChecksum("cma"), 0, uint64_t{1} << 31, 4, 16},
};
static_assert(kNamespacedAddresses[0].transport == 0xd3a7);  // as UCX 1.13 packs them (seen in real addresses)
static_assert(kNamespacedAddresses[1].transport == 0x8b47);

// The length UCX will read from a peer's interface address of a transport this worker has, given
// this worker's own length for it.
size_t LengthUcxReads(const UcxInterface& peer, size_t ours) {
  for (const NamespacedAddress& n : kNamespacedAddresses) {
    if (peer.transport != n.transport || peer.interface_address_bytes < n.base_bytes ||
        (peer.interface_address_head & n.layout_bits) != n.layout_bits)
      continue;
    return (peer.interface_address_head & n.namespace_flag) != 0 ? n.extended_bytes : n.base_bytes;
  }
  return ours;
}

}  // namespace

Status CheckUcxWorkerAddress(std::span<const std::byte> peer, std::span<const std::byte> ours) {
  VIPER_ASSIGN_OR_RETURN(UcxWorkerAddress theirs, ParseUcxWorkerAddress(peer));
  VIPER_ASSIGN_OR_RETURN(UcxWorkerAddress local, ParseUcxWorkerAddress(ours));
  std::map<uint16_t, size_t> iface_bytes;
  for (const auto& i : local.interfaces) iface_bytes.emplace(i.transport, i.interface_address_bytes);
  for (const auto& i : theirs.interfaces) {
    auto known = iface_bytes.find(i.transport);
    if (known != iface_bytes.end() && LengthUcxReads(i, known->second) != i.interface_address_bytes)
      return Status::InvalidArgument(fmt::format(
          "UCX worker address: an interface of transport 0x{:04x} has a {}-byte address, UCX reads {} bytes from it",
          i.transport, i.interface_address_bytes, LengthUcxReads(i, known->second)));
  }
  return Status::OK();
}

}  // namespace viper::net::detail
