// A temporary file next to a path the user named, for the write-then-rename pattern. Internal to
// Viper: not installed.
//
// The name is "<path>.tmp.<16 hex digits from the CSPRNG>" and the file is created with
// O_CREAT | O_EXCL | O_NOFOLLOW: in a directory other users can write to, nothing they plant
// (a file, a symbolic link to somewhere else) is opened, truncated or written through, and the
// name cannot be guessed ahead. Thread-safety: safe from any thread.
#pragma once

#include <sys/types.h>

#include <filesystem>

#include "core/fd.h"
#include "viper/status.h"

namespace viper::internal {

struct TempFile {
  Fd fd;                       // open for writing, empty, with `mode` less the umask
  std::filesystem::path path;  // "<target>.tmp.<random>"
};

// Creates the temporary file for `target`. Errors name the path and the reason (a full or
// read-only directory, permissions).
Result<TempFile> CreateTempNextTo(const std::filesystem::path& target, mode_t mode);

}  // namespace viper::internal
