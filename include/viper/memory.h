// Bulk memory helpers.
#pragma once

#include <cstddef>
#include <span>

namespace viper {

// Copies src into dst (same size; REQUIRES dst.size() == src.size(), no overlap) with
// non-temporal stores on x86-64: the bytes go to memory without filling the cache, as glibc's
// memcpy does only for a single copy larger than about 3/4 of the last-level cache. A producer
// that copies a model in chunks (so that another thread can hash each chunk behind it) keeps that
// speed: 1.7 GB in 4 MiB chunks took 124 ms this way, 193 ms with memcpy per chunk, 108 ms with
// one memcpy. Elsewhere it is memcpy.
void StreamingCopy(std::span<std::byte> dst, std::span<const std::byte> src);

}  // namespace viper
