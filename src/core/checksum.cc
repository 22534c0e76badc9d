// xxh3-64 checksums of snapshot data regions and their 16-hex-digit text form.
#include <xxhash.h>

#include <new>
#include <string>
#include <utility>

#include "viper/snapshot.h"

namespace viper {

#if VIPER_HAVE_XXH3_AVX2
extern "C" {  // checksum_avx2.cc
uint64_t viper_xxh3_64_avx2(const void* data, size_t size);
void* viper_xxh3_stream_new_avx2();
void viper_xxh3_stream_update_avx2(void* state, const void* data, size_t size);
uint64_t viper_xxh3_stream_digest_avx2(const void* state);
void viper_xxh3_stream_free_avx2(void* state);
}
#endif

namespace {
bool UseAvx2() {
#if VIPER_HAVE_XXH3_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}
}  // namespace

uint64_t checksum64(std::span<const std::byte> bytes) {
#if VIPER_HAVE_XXH3_AVX2
  if (UseAvx2()) return viper_xxh3_64_avx2(bytes.data(), bytes.size());
#endif
  return XXH3_64bits(bytes.data(), bytes.size());
}

Checksum64Stream::Checksum64Stream() : avx2_(UseAvx2()) {
#if VIPER_HAVE_XXH3_AVX2
  if (avx2_) state_ = viper_xxh3_stream_new_avx2();
#endif
  if (!avx2_) {
    XXH3_state_t* state = XXH3_createState();
    if (state != nullptr) XXH3_64bits_reset(state);
    state_ = state;
  }
  if (state_ == nullptr) throw std::bad_alloc();
}

Checksum64Stream::~Checksum64Stream() {
  if (state_ == nullptr) return;
#if VIPER_HAVE_XXH3_AVX2
  if (avx2_) {
    viper_xxh3_stream_free_avx2(state_);
    return;
  }
#endif
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

Checksum64Stream::Checksum64Stream(Checksum64Stream&& other) noexcept
    : state_(std::exchange(other.state_, nullptr)), avx2_(other.avx2_) {}

Checksum64Stream& Checksum64Stream::operator=(Checksum64Stream&& other) noexcept {
  if (this != &other) {
    Checksum64Stream gone(std::move(*this));
    state_ = std::exchange(other.state_, nullptr);
    avx2_ = other.avx2_;
  }
  return *this;
}

void Checksum64Stream::Update(std::span<const std::byte> bytes) {
#if VIPER_HAVE_XXH3_AVX2
  if (avx2_) {
    viper_xxh3_stream_update_avx2(state_, bytes.data(), bytes.size());
    return;
  }
#endif
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}

uint64_t Checksum64Stream::Digest() const {
#if VIPER_HAVE_XXH3_AVX2
  if (avx2_) return viper_xxh3_stream_digest_avx2(state_);
#endif
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

std::string checksum_hex(uint64_t checksum) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(16, '0');
  for (int i = 15; i >= 0; --i, checksum >>= 4) hex[i] = kDigits[checksum & 0xf];
  return hex;
}

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<uint64_t> parse_checksum_hex(std::string_view hex) {
  // Untrusted text: quote at most a short prefix of it in the message.
  auto quoted = [&] { return "\"" + std::string(hex.substr(0, 40)) + (hex.size() > 40 ? "...\"" : "\""); };
  if (hex.size() != 16) {
    return Status::Corruption("malformed checksum " + quoted() + ": expected 16 hex digits, got " +
                              std::to_string(hex.size()) + " characters");
  }
  uint64_t value = 0;
  for (char c : hex) {
    int digit = hex_value(c);
    if (digit < 0) return Status::Corruption("malformed checksum " + quoted() + ": not a hex digit");
    value = (value << 4) | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace viper
