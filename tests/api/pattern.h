// The byte pattern every integration test writes into tensor `tensor_index` of `version`, so that
// a reader can tell a whole version from a torn one (shared by viper_test_peer and the tests).
#pragma once

#include <cstddef>
#include <cstdint>

namespace viper::testing {

inline uint8_t Pattern(uint64_t version, size_t tensor_index) {
  return static_cast<uint8_t>(version * 31 + tensor_index * 7 + 1);
}

}  // namespace viper::testing
