#include "seal.h"

#include <fmt/format.h>

#include "crypto.h"

namespace viper::internal {

namespace {

// A key of its own for seals, derived from the token (the token is not used directly).
crypto::Mac SealKey(std::string_view token) { return crypto::HmacSha256(token, "viper version seal key v1"); }

}  // namespace

std::string SealOf(std::string_view token, std::string_view model, uint64_t version, uint64_t size, uint64_t checksum) {
  const crypto::Mac key = SealKey(token);
  // Unambiguous: the model name has no NUL (ValidateModelName), the numbers are fixed-width.
  const std::string message = std::string("viper-seal-v1") + '\0' + std::string(model) + '\0' +
            fmt::format("{:016x}{:016x}{:016x}", version, size, checksum);
  const crypto::Mac mac = crypto::HmacSha256(std::as_bytes(std::span(key)), std::as_bytes(std::span(message)));
  return crypto::ToHex(mac);
}

void SealVersion(std::string_view token, proto::VersionInfo* info) {
  if (token.empty()) return;
  info->metadata[std::string(kMetaSeal)] = SealOf(token, info->model, info->version, info->size, info->checksum);
}

Status CheckSeal(std::string_view token, const proto::VersionInfo& info, std::string_view holder) {
  if (token.empty()) return Status::OK();
  auto it = info.metadata.find(std::string(kMetaSeal));
  if (it == info.metadata.end()) {
    return Status::PermissionDenied(fmt::format(
        "{} version {} from {} is not sealed: it was not published by a node of this fleet (one with its token)",
        info.model, info.version, holder));
  }
  const std::string expected = SealOf(token, info.model, info.version, info.size, info.checksum);
  if (!crypto::EqualConstantTime(std::as_bytes(std::span(expected)), std::as_bytes(std::span(it->second)))) {
    return Status::PermissionDenied(fmt::format(
        "{} version {} from {} carries a seal that does not verify under this fleet's token: it was published by a "
        "node with another token, or altered",
        info.model, info.version, holder));
  }
  return Status::OK();
}

}  // namespace viper::internal
