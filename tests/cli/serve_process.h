// `viper serve` as a child process for the CLI tests: started on a free loopback port, its
// address read from the file it writes once listening.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "api/process.h"

namespace viper::testing {

// Starts `viper serve --listen 127.0.0.1:0 --segment-prefix PREFIX` with `extra` arguments, run
// through `wrapper` (an argv prefix, e.g. unshare ...) when given; its log is DIR/TAG.log.
// Returns its address ("" if it did not come up within 30 s).
inline std::string StartServe(std::unique_ptr<Process>& serve, const std::filesystem::path& dir, const std::string& tag,
                              const std::string& prefix, const std::vector<std::string>& extra = {},
                              const std::vector<std::string>& wrapper = {}) {
  using namespace std::chrono_literals;
  const auto address_file = dir / (tag + ".address");
  std::vector<std::string> argv = wrapper;
  for (const std::string& a : {std::string(VIPER_BINARY_DIR) + "/bin/viper", std::string("serve"), std::string("--listen"),
                               std::string("127.0.0.1:0"), std::string("--segment-prefix"), prefix,
                               std::string("--address-file"), address_file.string()})
    argv.push_back(a);
  argv.insert(argv.end(), extra.begin(), extra.end());
  serve = std::make_unique<Process>(argv, dir / (tag + ".log"));
  std::string address;
  WaitUntil([&] {
    address = ReadFile(address_file);
    while (!address.empty() && (address.back() == '\n' || address.back() == ' ')) address.pop_back();
    return !address.empty() || !serve->running();
  }, 30s);
  return address;
}

}  // namespace viper::testing
