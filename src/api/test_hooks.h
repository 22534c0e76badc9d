// Hooks that let tests reach into a node's internals (NodeOptions::test_hooks). In-tree only:
// production code leaves test_hooks null.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace viper {

// One part of a delta, just encoded (NodeTestHooks::delta_part).
struct DeltaPartEvent {
  std::string model;
  uint64_t base = 0;
  uint64_t target = 0;
  uint32_t index = 0;
  std::vector<std::byte>* bytes = nullptr;  // the part as it will be sent (a test may change it)
};

struct NodeTestHooks {
  // Called on the node's encoder thread after each part of a delta is encoded, before it is
  // handed to the senders; the encoder waits for it.
  std::function<void(const DeltaPartEvent&)> delta_part;
};

}  // namespace viper
