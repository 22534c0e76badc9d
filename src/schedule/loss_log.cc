// Loss logs: validation of samples and the `iteration,loss` CSV reader.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "core/fd.h"
#include "viper/loss_fit.h"

namespace viper {

Status ValidateLossSamples(std::span<const LossSample> samples) {
  if (samples.empty()) return Status::InvalidArgument("loss samples: empty (need at least one (iteration, loss) pair)");
  for (size_t i = 0; i < samples.size(); ++i) {
    const LossSample& s = samples[i];
    if (s.iteration < 0) {
      return Status::InvalidArgument(fmt::format("loss sample {}: iteration {} is negative", i, s.iteration));
    }
    if (!std::isfinite(s.loss)) {
      return Status::InvalidArgument(fmt::format("loss sample {} (iteration {}): loss {} is not finite", i,
                                                 s.iteration, s.loss));
    }
    if (i > 0 && s.iteration <= samples[i - 1].iteration) {
      return Status::InvalidArgument(fmt::format("loss sample {}: iteration {} does not follow iteration {} "
                                                 "(iterations must be strictly increasing)",
                                                 i, s.iteration, samples[i - 1].iteration));
    }
  }
  return Status::OK();
}

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

Result<int64_t> ParseIteration(std::string_view field) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec != std::errc() || end != field.data() + field.size()) {
    return Status::InvalidArgument(fmt::format("iteration '{}' is not an integer", field));
  }
  return value;
}

Result<double> ParseLoss(std::string_view field) {
  // strtod accepts "nan"/"inf", which are then rejected as non-finite with a clear message.
  std::string text(field);
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    return Status::InvalidArgument(fmt::format("loss '{}' is not a number", field));
  }
  if (!std::isfinite(value)) return Status::InvalidArgument(fmt::format("loss '{}' is not finite", field));
  return value;
}

Result<LossSample> ParseRow(std::string_view line) {
  const size_t comma = line.find(',');
  if (comma == std::string_view::npos) {
    return Status::InvalidArgument(fmt::format("expected 'iteration,loss', got '{}'", line));
  }
  std::string_view rest = line.substr(comma + 1);
  if (rest.find(',') != std::string_view::npos) {
    return Status::InvalidArgument(fmt::format("expected 2 columns, got more in '{}'", line));
  }
  VIPER_ASSIGN_OR_RETURN(int64_t iteration, ParseIteration(Trim(line.substr(0, comma))));
  VIPER_ASSIGN_OR_RETURN(double loss, ParseLoss(Trim(rest)));
  if (iteration < 0) return Status::InvalidArgument(fmt::format("iteration {} is negative", iteration));
  return LossSample{iteration, loss};
}

}  // namespace

Result<std::vector<LossSample>> ParseLossLog(std::string_view text, std::string_view source) {
  std::vector<LossSample> samples;
  bool header_seen = false;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty()) continue;
    if (!header_seen) {
      if (line != "iteration,loss") {
        return Status::InvalidArgument(fmt::format("{}:{}: missing header: expected 'iteration,loss', got '{}'",
                                                   source, line_no, line));
      }
      header_seen = true;
      continue;
    }
    Result<LossSample> row = ParseRow(line);
    if (!row.ok()) return row.status().WithContext(fmt::format("{}:{}", source, line_no));
    if (!samples.empty() && row->iteration <= samples.back().iteration) {
      return Status::InvalidArgument(fmt::format("{}:{}: iteration {} does not follow {} (iterations must be "
                                                 "strictly increasing)",
                                                 source, line_no, row->iteration, samples.back().iteration));
    }
    samples.push_back(*row);
  }
  if (!header_seen) return Status::InvalidArgument(fmt::format("{}: empty (expected header 'iteration,loss')", source));
  if (samples.empty()) return Status::InvalidArgument(fmt::format("{}: no data rows after the header", source));
  return samples;
}

Result<std::vector<LossSample>> ReadLossLog(const std::string& path) {
  // Whole files only, and of a size a loss log has (a device or a pipe would be read forever, a
  // stray multi-GB file into memory): 1 GiB is about 50 million rows.
  constexpr uint64_t kMaxLossLogBytes = 1ull << 30;
  struct stat st {};
  auto fd = OpenRegularFile(path, &st);
  if (!fd.ok() && S_ISDIR(st.st_mode)) return Status::InvalidArgument(fmt::format("loss log {}: is a directory", path));
  if (!fd.ok()) return fd.status().WithContext("loss log " + path);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > kMaxLossLogBytes) {
    return Status::InvalidArgument(
        fmt::format("loss log {}: is {} bytes; a loss log is read whole, at most {} bytes", path, size, kMaxLossLogBytes));
  }
  std::string text(size, '\0');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::pread(fd->get(), text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0) return Status::FromErrno(fmt::format("loss log {}: read failed", path));
    if (n == 0) break;  // shrank meanwhile: parse what is there
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return ParseLossLog(text, path);
}

}  // namespace viper
