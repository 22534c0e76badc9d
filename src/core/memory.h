// Bulk memory helpers.
#pragma once

#include <cstddef>
#include <span>

namespace viper {

// Copies src into dst (same size; REQUIRES dst.size() == src.size(), no overlap) with
// non-temporal stores on x86-64, reading four pages side by side (the loop glibc's memcpy uses
// only for a single copy larger than about 3/4 of the last-level cache): the bytes go to memory
// without filling the cache, and four streams keep more loads in flight than one. A producer that
// copies a model in chunks (so that another thread can hash each chunk behind it) keeps that
// speed: 1.7 GB in 2 MiB chunks took 137 ms this way, 171 ms with one stream of 16-byte
// non-temporal stores, 246 ms with memcpy per chunk, 143 ms with one memcpy (/tmp micro-runs,
// docs/BENCHMARKS.md). Elsewhere it is memcpy.
void StreamingCopy(std::span<std::byte> dst, std::span<const std::byte> src);

// Faults in every page of a writable mapping now: one kernel pass (MADV_POPULATE_WRITE, Linux
// 5.14+), then one write per page of the byte it holds (contents are kept; nothing else may write
// the range meanwhile). Best effort: out of memory the pages stay lazy and fault in on first use.
// Why: the first write into fresh pages runs at ~1.8 GB/s on our VMs, into faulted ones at
// ~11 GB/s; 1.7 GB of a fresh /dev/shm segment took 0.98-4.8 s to fill by faulting against
// 0.34 s to populate + 0.14 s to fill (docs/ARCHITECTURE.md, "Host tier: segment
// pool", Creation).
void PrefaultForWrite(void* base, size_t size);

}  // namespace viper
