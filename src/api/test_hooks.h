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
  // Called on the publishing thread each time Publisher::Publish has copied a chunk of a version
  // announced while it is copied (cut-through): the bytes of the snapshot landed so far, of `size`;
  // and once by Publisher::Commit of a draft announced early (landed == size), before its seal.
  // The caller waits for it (a test stalls or kills a producer mid-copy this way).
  std::function<void(const std::string& model, uint64_t version, uint64_t landed, uint64_t size)> publish_landed;
};

}  // namespace viper
