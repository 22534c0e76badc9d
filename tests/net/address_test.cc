// ParseHostPort: accepted forms and clear errors for every malformed one.
#include <gtest/gtest.h>

#include "net/engine.h"

namespace viper::net {
namespace {

void ExpectRejected(const std::string& input, const std::string& needle) {
  auto r = ParseHostPort(input);
  ASSERT_FALSE(r.ok()) << "accepted '" << input << "'";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << "message for '" << input << "' lacks '" << needle << "': " << r.status().message();
}

TEST(ParseHostPort, AcceptsNamesAndLiterals) {
  auto a = ParseHostPort("127.0.0.1:5000");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->first, "127.0.0.1");
  EXPECT_EQ(a->second, 5000);
  auto b = ParseHostPort("localhost:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "localhost");
  EXPECT_EQ(b->second, 0);
  auto c = ParseHostPort("node-3.cluster_a:65535");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->second, 65535);
  auto d = ParseHostPort("[::1]:7");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->first, "::1");
  EXPECT_EQ(d->second, 7);
}

TEST(ParseHostPort, RejectsMissingOrBadPort) {
  ExpectRejected("127.0.0.1", "missing ':PORT'");
  ExpectRejected("127.0.0.1:", "missing port");
  ExpectRejected("127.0.0.1:65536", "larger than 65535");
  ExpectRejected("127.0.0.1:99999", "larger than 65535");
  ExpectRejected("127.0.0.1:1234567", "not a number in 0-65535");
  ExpectRejected("127.0.0.1:-1", "'-1' is not a number");
  ExpectRejected("127.0.0.1:80x", "'80x' is not a number");
  ExpectRejected("127.0.0.1: 80", "is not a number");
}

TEST(ParseHostPort, RejectsEmptyOrGarbageHost) {
  ExpectRejected("", "empty");
  ExpectRejected(":5000", "empty host");
  ExpectRejected("bad host:5000", "characters not allowed");
  ExpectRejected("a/b:5000", "characters not allowed");
  ExpectRejected("[::1]5000", "expected [IPV6]:PORT");
  ExpectRejected("[zz]:5000", "not an IPv6 address");
  ExpectRejected("[]:5000", "not an IPv6 address");
  ExpectRejected("::1:5000", "characters not allowed");  // bare IPv6 must be bracketed
}

}  // namespace
}  // namespace viper::net
