// viper inspect FILE [--json] [--verify]: what a snapshot file holds, and whether it is intact.
//
// Exit codes: 0 the file is a valid snapshot (and, with --verify, its checksum matches or it has
// none); 1 the file cannot be read, is malformed, or fails --verify; 2 bad usage (CLI11).
// Errors are one line on stderr: "viper inspect: <path>: <reason>".
#include <algorithm>
#include <array>
#include <optional>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "command.h"
#include "viper/snapshot.h"

namespace viper::cli {
namespace {

struct InspectFlags {
  std::string path;
  bool json = false;
  bool verify = false;
};

// The checksum line: declared only, verified ok, MISMATCH, or not declared.
struct ChecksumReport {
  std::string status;  // "declared", "ok", "mismatch", "absent"
  std::optional<uint64_t> declared;
  std::optional<uint64_t> computed;
};

ChecksumReport CheckChecksum(const Snapshot& s, bool verify) {
  ChecksumReport report{"absent", s.declared_checksum(), std::nullopt};
  if (!report.declared) return report;
  if (!verify) {
    report.status = "declared";
    return report;
  }
  report.computed = s.compute_checksum();
  report.status = *report.computed == *report.declared ? "ok" : "mismatch";
  return report;
}

// Untrusted names and values go to a terminal: escape control bytes, cut very long values.
std::string Printable(std::string_view text, size_t max_bytes = SIZE_MAX) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80 && out.size() >= max_bytes) {
      return out + fmt::format("... ({} bytes)", text.size());
    }
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string ShapeText(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string ChecksumText(const ChecksumReport& c) {
  if (c.status == "absent") return "not declared";
  std::string declared = checksum_hex(*c.declared);
  if (c.status == "declared") return declared + " (declared, not verified; use --verify)";
  if (c.status == "ok") return declared + " (verified ok)";
  return fmt::format("MISMATCH: declared {}, data hashes to {}", declared, checksum_hex(*c.computed));
}

void PrintTensorTable(const Snapshot& s) {
  std::vector<std::array<std::string, 5>> rows = {{"NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET"}};
  for (const TensorInfo& t : s.tensors()) {
    rows.push_back({Printable(t.name, 80), std::string(dtype_name(t.dtype)), ShapeText(t.shape),
                    std::to_string(t.nbytes()), std::to_string(t.begin)});
  }
  std::array<size_t, 5> width{};
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::printf("  %-*s  %-*s  %-*s  %*s  %*s\n", static_cast<int>(width[0]), row[0].c_str(),
                static_cast<int>(width[1]), row[1].c_str(), static_cast<int>(width[2]), row[2].c_str(),
                static_cast<int>(width[3]), row[3].c_str(), static_cast<int>(width[4]), row[4].c_str());
  }
}

void PrintText(const std::string& path, const Snapshot& s, const ChecksumReport& checksum) {
  std::printf("file      %s\n", Printable(path).c_str());
  std::printf("size      %zu bytes: header %llu, data %zu (data region at byte %llu)\n", s.bytes().size(),
              static_cast<unsigned long long>(s.header_size()), s.data_region().size(),
              static_cast<unsigned long long>(s.data_offset()));
  std::printf("checksum  %s\n", ChecksumText(checksum).c_str());
  std::printf("tensors   %zu (offsets relative to the data region)\n", s.tensors().size());
  if (!s.tensors().empty()) PrintTensorTable(s);
  std::printf("metadata  %zu\n", s.metadata().size());
  for (const auto& [key, value] : s.metadata()) {
    std::printf("  %s = %s\n", Printable(key, 80).c_str(), Printable(value, 200).c_str());
  }
}

std::string JsonText(const Snapshot& s, const std::string& path, const ChecksumReport& c) {
  nlohmann::ordered_json checksum = {{"status", c.status}, {"declared", nullptr}, {"computed", nullptr}};
  if (c.declared) checksum["declared"] = checksum_hex(*c.declared);
  if (c.computed) checksum["computed"] = checksum_hex(*c.computed);
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const TensorInfo& t : s.tensors()) {
    tensors.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"bytes", t.nbytes()},
                       {"data_offsets", {t.begin, t.end}}, {"file_offset", s.data_offset() + t.begin}});
  }
  nlohmann::ordered_json out = {
      {"path", path},
      {"file_bytes", s.bytes().size()},
      {"header_bytes", s.header_size()},
      {"data_offset", s.data_offset()},
      {"data_bytes", s.data_region().size()},
      {"checksum", checksum},
      {"tensors", tensors},
      {"metadata", s.metadata()},
  };
  return out.dump(2);
}

int RunInspect(const InspectFlags& flags) {
  auto snapshot = Snapshot::OpenFile(flags.path);  // errors already start with "<path>: "
  if (!snapshot.ok()) {
    std::fprintf(stderr, "viper inspect: %s\n", Printable(snapshot.status().message()).c_str());
    return 1;
  }
  ChecksumReport checksum = CheckChecksum(*snapshot, flags.verify);
  if (flags.json) {
    std::printf("%s\n", JsonText(*snapshot, flags.path, checksum).c_str());
  } else {
    PrintText(flags.path, *snapshot, checksum);
  }
  std::fflush(stdout);
  if (checksum.status == "mismatch") {
    Status mismatch = snapshot->VerifyChecksum();
    std::fprintf(stderr, "viper inspect: %s: %s\n", Printable(flags.path).c_str(), mismatch.message().c_str());
    return 1;
  }
  return 0;
}

ViperCommand inspect_command(
    "inspect", "Show the tensors, metadata and checksum of a snapshot file",
    [](CLI::App& app) -> RunFn {
      auto flags = std::make_shared<InspectFlags>();
      app.add_option("file", flags->path, "Snapshot file (.safetensors)")->required()->check(PathText());
      app.add_flag("--json", flags->json, "Print one JSON object instead of text");
      app.add_flag("--verify", flags->verify, "Verify viper.checksum against the data (reads every byte); a file that declares none (a plain "
                     "safetensors file) has nothing to verify: exit 0, checksum \"not declared\"");
      return [flags] { return RunInspect(*flags); };
    },
    60);

}  // namespace
}  // namespace viper::cli
