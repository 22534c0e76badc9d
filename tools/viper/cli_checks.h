// The checks every `viper` option's value goes through before a command runs: one validator per
// class of value (integer, duration, host:port, path, name, choice), shared by all commands.
//
// Each is a CLI11 validator that refuses a value with "'VALUE' must be RULE"; CLI11 prefixes the
// option's name and main.cc prints it as one line "viper COMMAND: --option: 'VALUE' must be RULE"
// with exit code 2 (the usage error). VALUE is shown printable (control bytes as \xNN) and, past
// kShownBytes, cut short with its length. Syntax is checked here, so "-1" is never read as
// 18446744073709551615 and "1e400" never as infinity; rules that need several options or the
// outside world (a file's contents, a node's answer) stay with the command.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

namespace viper::cli {

inline constexpr size_t kShownBytes = 64;       // longer values are shown cut short
inline constexpr size_t kMaxPathBytes = 4095;   // PATH_MAX - 1
inline constexpr size_t kMaxTextBytes = 1024;   // a free-text value (a URL)
inline constexpr size_t kMaxNodeNameBytes = 255;
inline constexpr int64_t kMaxKeptVersions = 100000;      // --keep-host, --keep-files, --delta-bases
inline constexpr double kMaxWaitSeconds = 365 * 86400.0;  // a timeout (0 = none) of at most a year

// 'VALUE' for messages: printable, \xNN for control and non-ASCII bytes, cut after kShownBytes.
std::string Shown(std::string_view value);

// Decimal digits only (no sign, no spaces), lo <= value <= hi.
CLI::Validator IntegerIn(int64_t lo, int64_t hi);
inline CLI::Validator NonNegativeInteger() { return IntegerIn(0, INT64_MAX); }
inline CLI::Validator PositiveInteger() { return IntegerIn(1, INT64_MAX); }

// A finite decimal number of seconds with lo < value (lo_open) or lo <= value, and value <= hi.
CLI::Validator SecondsIn(double lo, double hi, bool lo_open = false);

// 0 (off), or a number of seconds from lo to hi (as SecondsIn).
CLI::Validator ZeroOrSecondsIn(double lo, double hi);

// A finite decimal number of at most 32 characters, any sign (the command checks its range).
CLI::Validator Number();

// HOST:PORT: a non-empty host of at most 253 bytes of [A-Za-z0-9._-] (or a bracketed IPv6
// address) and a port 0-65535.
CLI::Validator HostPort();

// A model name: 1-128 bytes of [A-Za-z0-9._-], not starting with '.' (ValidateModelName).
CLI::Validator ModelName();

// A path: 1-kMaxPathBytes bytes, no control bytes. Says nothing about what is there.
CLI::Validator PathText();
// A file that exists, is not a directory and can be read.
CLI::Validator ReadableFile();
// A file this command will create or replace: not a directory, and its directory exists.
CLI::Validator NewFile();

// A shared-memory segment prefix: 1-64 bytes of [A-Za-z0-9_-].
CLI::Validator SegmentPrefix();

// Free text: 1-max_bytes bytes without control bytes.
CLI::Validator Text(size_t max_bytes = kMaxTextBytes);
// redis://HOST:PORT[/DB].
CLI::Validator RegistryUrl();

// One of `choices`.
CLI::Validator OneOf(std::initializer_list<const char*> choices);

}  // namespace viper::cli
