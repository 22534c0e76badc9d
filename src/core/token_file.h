// The shared token of a fleet, read the one way every command reads it (the viper CLI's
// --token-file and VIPER_TOKEN, and the Python commands': python3 -m viper.data_service,
// viper.neardata). Internal to Viper: not installed.
#pragma once

#include <string>
#include <string_view>

#include "viper/status.h"

namespace viper {

// Leading and trailing whitespace (spaces, tabs, CR, LF) is not part of a token: stripped the same
// way from a token file and from $VIPER_TOKEN.
std::string TrimToken(std::string_view text);

// The token held in `path`. Like ssh with a private key, a file that group or others may read or
// write is refused (the secret is only as safe as the file), and so is anything but a regular file,
// a file over 4096 bytes, an empty one and one of more than one line; the error says what to do.
Result<std::string> ReadTokenFile(const std::string& path);

// The token from `token_file` if named, else $VIPER_TOKEN, else empty (no token). A named file
// that cannot be read, is not owner-only or holds no token is an error (never silently "no
// token"); so is a VIPER_TOKEN that is set but only whitespace.
Result<std::string> ResolveToken(const std::string& token_file);

}  // namespace viper
