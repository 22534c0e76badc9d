// Helpers of the `viper bench` smoke tests: run bin/viper, check one statistic's JSON.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/process.h"

namespace viper {

using nlohmann::json;

struct Outcome {
  int exit_code = -1;
  std::string out, err;
};

inline Outcome RunViper(const std::vector<std::string>& args, const testing::TempDir& dir) {
  const auto out_path = dir / "stdout", err_path = dir / "stderr";
  pid_t pid = ::fork();
  if (pid == 0) {
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> argv;
    std::string exe = testing::ViperBinary();
    argv.push_back(exe.data());
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::ReadFile(out_path), testing::ReadFile(err_path)};
}

// Every statistic of one measured quantity: present, n samples, ordered min <= median <= max.
inline void ExpectSamples(const json& j, const std::string& what, size_t n, bool positive = true) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(j.is_object()) << j.dump();
  for (const char* key : {"median", "p99", "min", "max", "n", "samples"}) ASSERT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["n"].get<size_t>(), n);
  EXPECT_EQ(j["samples"].size(), n);
  EXPECT_LE(j["min"].get<double>(), j["median"].get<double>());
  EXPECT_LE(j["median"].get<double>(), j["max"].get<double>());
  if (positive) {
    EXPECT_GT(j["min"].get<double>(), 0.0);
  }
  EXPECT_LT(j["max"].get<double>(), 60.0);  // seconds: a bogus clock difference would be huge
}

}  // namespace viper
