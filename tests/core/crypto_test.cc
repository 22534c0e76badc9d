// HMAC-SHA256 against RFC 4231's test vectors, the constant-time compare, randomness, hex.
#include "crypto.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace viper::crypto {
namespace {

TEST(Crypto, HmacSha256MatchesRfc4231) {
  // RFC 4231 test case 2.
  EXPECT_EQ(ToHex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 1: key = 20 bytes of 0x0b, "Hi There".
  EXPECT_EQ(ToHex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(Crypto, EqualConstantTimeComparesLengthAndBytes) {
  Mac a = HmacSha256("k", "m"), b = a;
  EXPECT_TRUE(EqualConstantTime(a, b));
  b[31] ^= std::byte{1};
  EXPECT_FALSE(EqualConstantTime(a, b));
  EXPECT_FALSE(EqualConstantTime(std::span(a).first(31), b));
}

TEST(Crypto, RandomBytesDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 16; ++i) {
    auto bytes = RandomBytes(16);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    seen.insert(ToHex(*bytes));
  }
  EXPECT_EQ(seen.size(), 16u);
}

TEST(Crypto, HexRoundTripsAndRefusesBadDigits) {
  auto bytes = FromHex("00ff10Ab");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(ToHex(*bytes), "00ff10ab");
  EXPECT_FALSE(FromHex("abc").ok());
  EXPECT_FALSE(FromHex("zz").ok());
}

}  // namespace
}  // namespace viper::crypto
