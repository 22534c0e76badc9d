// libFuzzer target for the parser of registry records (what a node reads back from Redis, written
// by anyone who can write to it) and of registry URLs: any byte string must parse or give an
// error, never crash; a parsed record must re-encode and parse to the same record.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "registry/registry_internal.h"
#include "viper/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto record = viper::ParseHolderRecord(text);
  if (record.ok()) {
    auto again = viper::ParseHolderRecord(viper::EncodeHolderRecord(*record));
    if (!again.ok() || !(*again == *record)) std::abort();
    for (const auto& r : record->info.replicas)
      if (!viper::ValidateReplica(r).ok()) std::abort();  // the record's check and the replica's agree
  }
  (void)viper::registry_internal::ParseRedisUrl(std::string(text.substr(0, 512)));
  return 0;
}
