// Small file helpers shared by the data layer's sources and writers (src/data only).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

#include "core/fd.h"
#include "viper/status.h"

namespace viper::data_internal {

// Reads exactly dst.size() bytes at `offset`. Corruption "truncated: ..." if the file ends first,
// IOError (with errno) if a read fails. The caller adds what was read as context.
Status PreadAll(int fd, std::span<std::byte> dst, uint64_t offset);
// Writes all of `bytes` at `offset`; IOError (with errno) on failure.
Status PwriteAll(int fd, std::span<const std::byte> bytes, uint64_t offset);
// Makes a finished temporary file `tmp` (open as `fd`) the file `path`: fsync (if `sync`), close,
// rename, fsync the directory (if `sync`). On failure the temporary file is removed.
Status CommitTemp(Fd& fd, const std::filesystem::path& tmp, const std::filesystem::path& path, bool sync);

}  // namespace viper::data_internal
