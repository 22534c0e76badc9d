// viper/units.h: byte counts parsed from untrusted text, and printed for people.
#include "viper/units.h"

#include <gtest/gtest.h>

namespace viper {
namespace {

TEST(ParseBytes, AcceptsDecimalAndBinarySuffixesWithOrWithoutB) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"0", 0},           {"4096", 4096},           {"4096B", 4096},          {"1k", 1000},
      {"1K", 1000},       {"1KB", 1000},            {"600M", 600000000},      {"600MB", 600000000},
      {"1.7G", 1700000000}, {"1.7GB", 1700000000},  {"2T", 2000000000000},    {"1Ki", 1024},
      {"1KiB", 1024},     {"64Mi", 64u << 20},      {"64MiB", 64u << 20},     {"1Gi", 1u << 30},
      {"1Ti", uint64_t{1} << 40}, {"2e3", 2000},    {".5k", 500},             {"1.0000001", 1}};
  for (const auto& [text, want] : cases) {
    auto got = ParseBytes(text);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status().ToString();
    EXPECT_EQ(*got, want) << text;
  }
}

TEST(ParseBytes, RefusesWhatIsNotAByteCountAndSaysWhy) {
  for (const char* text : {"", "M", "abc", "-1", "-0", "+5", " 5", "inf", "nan", "0x10", "1e999"}) {
    auto got = ParseBytes(text, "size");
    ASSERT_FALSE(got.ok()) << text;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(std::string("size '") + text + "'"), std::string::npos) << got.status().ToString();
  }
  auto suffix = ParseBytes("12X");
  ASSERT_FALSE(suffix.ok());
  EXPECT_NE(suffix.status().message().find("byte count '12X': unknown suffix 'X'"), std::string::npos) << suffix.status().ToString();
  EXPECT_FALSE(ParseBytes("12 M").ok());
  EXPECT_FALSE(ParseBytes("1MBB").ok());
  EXPECT_FALSE(ParseBytes("1iB").ok());
  EXPECT_FALSE(ParseBytes("9000000Ti").ok()) << "beyond 2^53 bytes";
}

// A positive size below one byte would round to 0, which callers such as --host-max-bytes read as
// "the default" (half of /dev/shm): refused. Fractions of larger units still round to whole bytes.
TEST(ParseBytes, RefusesAPositiveSizeBelowOneByte) {
  for (const char* text : {"0.4", "0.5", "0.999", "1e-9", "0.0001k", "0.0009KiB", "0.4B"}) {
    auto got = ParseBytes(text, "--host-max-bytes");
    ASSERT_FALSE(got.ok()) << text << " gave " << *got;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(std::string("--host-max-bytes '") + text + "' is less than one byte"),
              std::string::npos)
        << got.status().ToString();
  }
  const std::pair<const char*, uint64_t> kept[] = {
      {"0", 0}, {"0.0", 0}, {"0k", 0}, {"1", 1}, {"1.4", 1}, {"1.5", 2}, {"0.001k", 1}, {"1e-9G", 1},
      {"0.4k", 400}, {"1.5G", 1500000000}, {"1.3Gi", 1395864371}};
  for (const auto& [text, want] : kept) {
    auto got = ParseBytes(text);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status().ToString();
    EXPECT_EQ(*got, want) << text;
  }
}

TEST(HumanUnits, PrintOneDecimalInTheLargestUnitBelowTheValue) {
  EXPECT_EQ(HumanBytes(512), "512.0 B");
  EXPECT_EQ(HumanBytes(1.7e9), "1.7 GB");
  EXPECT_EQ(HumanSeconds(0.00085), "850 us");
  EXPECT_EQ(HumanSeconds(0.1582), "158.2 ms");
  EXPECT_EQ(HumanSeconds(2.314), "2.31 s");
}

}  // namespace
}  // namespace viper
