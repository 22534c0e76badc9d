#include "temp_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "crypto.h"

namespace viper::internal {

Result<TempFile> CreateTempNextTo(const std::filesystem::path& target, mode_t mode) {
  // A taken name is another user's plant or astronomically unlikely: a few fresh names, then fail.
  constexpr int kTries = 4;
  for (int attempt = 0;; ++attempt) {
    VIPER_ASSIGN_OR_RETURN(std::vector<std::byte> random, crypto::RandomBytes(8));
    TempFile out;
    out.path = target.string() + ".tmp." + crypto::ToHex(random);
    out.fd = Fd(::open(out.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (out.fd.get() < 0 && errno == EEXIST && attempt + 1 < kTries) continue;
    if (out.fd.get() < 0) return Status::FromErrno(fmt::format("cannot create the temporary file {}", out.path.string()));
    return out;
  }
}

}  // namespace viper::internal
