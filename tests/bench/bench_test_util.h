// Helpers of the `viper bench` smoke tests: run bin/viper, check one statistic's JSON.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/process.h"
#include "cli/run_viper.h"

namespace viper {

using nlohmann::json;

using testing::Outcome;

inline Outcome RunViper(const std::vector<std::string>& args, const testing::TempDir& dir) {
  return testing::RunViper(args, dir.path());
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
