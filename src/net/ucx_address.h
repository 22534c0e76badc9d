// UCX worker addresses from peers: checked here before UCX sees them (private to src/net).
//
// Why: a node makes a UCX endpoint from the worker address a client sends in its bootstrap frame
// (bootstrap.h), and UCX 1.13's ucp_address_unpack trusts those bytes completely: it has no length
// to check against, reads as far as the records say, and aborts the process on a version it does
// not know (ucs_assertv_always: "addr version ..."). So every address, the client's at the node
// and the node's at the client, is first walked here the way ucp_address_unpack of UCX 1.13.1
// walks it, with every read bounds-checked; an address is handed to UCX only if the walk ends
// exactly at its last byte and every field is one UCX itself would produce.
//
// The packed format (src/ucp/wireup/address.c of UCX 1.13), as this parser reads it:
//   header   v1: 1 byte, version in bits 0-3 (0), flags in bits 4-7;
//            v2: 2 bytes, version 1 in bits 0-3 of the first, flags in the second.
//            flags: 1 debug info (worker name follows), 2 worker uuid, 4 client id, 8 AM only.
//   [uuid u64] [client id u64]
//   either 0xff (no devices) or device records until one has LAST:
//     md byte       bit 7 = device without interfaces; md index in bits 0-4 (v1) or 0-6 (v2;
//                   127 = the index is in the next byte)
//     length byte   bit 7 LAST device, bit 6 number of paths follows, bit 5 system device
//                   follows; device address length in bits 0-4 (v2: 31 = in the next byte)
//     [paths u8] [system device u8] device address
//     interface records until one has LAST (none if the device is empty):
//       transport name checksum u16, attributes (v1: 16 bytes = 3 floats + u32; v2: 8 bytes),
//       length byte (bit 7 LAST interface, bit 6 endpoint addresses follow, bits 0-5 interface
//       address length; v2: 63 = in the next byte), interface address.
// Not accepted: unified mode (UCX_UNIFIED_MODE, whose records carry no lengths), the worker name
// (UCX_ADDRESS_DEBUG_INFO: whether UCX reads it depends on the receiver's own settings),
// endpoint addresses (a worker address has none), and v1 without the uuid flag (UCX 1.13 always
// sets it; without it UCX's reading depends on the receiver's flags). The engine turns both
// settings off for its own workers (engine.cc), so Viper's peers never produce them.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "viper/status.h"

namespace viper::net::detail {

struct UcxInterface {
  uint16_t transport = 0;  // checksum of the transport name (tl_name_csum)
  uint8_t md_index = 0;
  size_t device_address_bytes = 0;
  size_t interface_address_bytes = 0;
  size_t interface_address_offset = 0;  // where it starts in the worker address
  uint64_t interface_address_head = 0;  // its first 8 bytes, little-endian (0 if shorter)
};

struct UcxWorkerAddress {
  int version = 1;  // 1 or 2 (UCX's V1 / V2)
  size_t devices = 0;
  std::vector<UcxInterface> interfaces;
};

inline constexpr size_t kMaxUcxInterfaces = 128;  // UCP_MAX_RESOURCES

// The walk described above. InvalidArgument naming the offset and the field on any fault.
Result<UcxWorkerAddress> ParseUcxWorkerAddress(std::span<const std::byte> address);

// ParseUcxWorkerAddress, then: every interface of a transport this worker also has (same name
// checksum) has the interface-address length UCX's transport will read from it, since UCX's
// transports read their interface addresses without a length. That is the length this worker's
// own has, but for the shared-memory transports posix (in procfs mode, UCX's default) and cma,
// whose addresses carry the pid namespace when the process runs in a namespace of its own (any
// container), as a flag in the address says: there the length must match the peer's own flag, so
// a process in a container and one outside still connect (UCX then finds those transports
// unreachable between them and uses another).
Status CheckUcxWorkerAddress(std::span<const std::byte> peer, std::span<const std::byte> ours);

}  // namespace viper::net::detail
