// ParseHostPort: accepted forms and clear errors for every malformed one; IsAddressOfThisHost.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

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

// A peer that claims this host's key must have connected from an address of this host (the node's
// HELLO check): loopback and the addresses of this namespace's interfaces are; TEST-NET-1
// (192.0.2.0/24, reserved for documentation) is on no interface here.
TEST(IsAddressOfThisHost, TellsThisHostsAddressesFromOthers) {
  auto loopback = IsAddressOfThisHost("127.0.0.1:4000");
  ASSERT_TRUE(loopback.ok()) << loopback.status().ToString();
  EXPECT_TRUE(*loopback);
  auto v6 = IsAddressOfThisHost("[::1]:4000");
  if (v6.ok()) {  // (a host without IPv6 cannot bind it: an error, not "another host")
    EXPECT_TRUE(*v6);
  }
  auto elsewhere = IsAddressOfThisHost("192.0.2.7:4000");
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status().ToString();
  EXPECT_FALSE(*elsewhere);
  ifaddrs* list = nullptr;
  ASSERT_EQ(::getifaddrs(&list), 0);
  int checked = 0;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    auto own = IsAddressOfThisHost(std::string(text) + ":1");
    ASSERT_TRUE(own.ok()) << text << ": " << own.status().ToString();
    EXPECT_TRUE(*own) << text;
    ++checked;
  }
  ::freeifaddrs(list);
  EXPECT_GE(checked, 1);
  EXPECT_FALSE(IsAddressOfThisHost("not-an-address").ok());
}


// Where other hosts are told to reach a listener (the registry, replica lists, Node::address()).
TEST(Advertise, TheListenAddressAHostAsToldOrThisHostsOwnForAWildcard) {
  auto listen = Advertise("127.0.0.1:7300", "");
  ASSERT_TRUE(listen.ok()) << listen.status().ToString();
  EXPECT_EQ(listen->address, "127.0.0.1:7300");
  EXPECT_TRUE(listen->loopback_only);
  for (auto [host, want] : std::vector<std::pair<std::string, std::string>>{
           {"10.1.2.3", "10.1.2.3:7300"}, {"localhost", "localhost:7300"}, {"fe80::1", "[fe80::1]:7300"},
           {"[::1]", "[::1]:7300"}}) {
    auto told = Advertise("0.0.0.0:7300", host);
    ASSERT_TRUE(told.ok()) << host << ": " << told.status().ToString();
    EXPECT_EQ(told->address, want);
  }
  for (const char* wildcard : {"0.0.0.0", "::", "[::]"}) {
    auto refused = Advertise("0.0.0.0:7300", wildcard);
    ASSERT_FALSE(refused.ok()) << wildcard;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("is a wildcard"), std::string::npos) << refused.status().ToString();
  }
  EXPECT_EQ(Advertise("0.0.0.0:7300", "no-such-host.invalid").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Advertise("0.0.0.0:7300", "a b").status().code(), StatusCode::kInvalidArgument);

  // Every interface: one of this host's own addresses, not loopback where an interface is up.
  bool has_other = false;
  ifaddrs* list = nullptr;
  ASSERT_EQ(::getifaddrs(&list), 0);
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next)
    if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET && (a->ifa_flags & IFF_UP) &&
        !(a->ifa_flags & IFF_LOOPBACK))
      has_other = true;
  ::freeifaddrs(list);
  for (const char* bound : {"0.0.0.0:7300", "[::]:7300"}) {
    auto own = Advertise(bound, "");
    ASSERT_TRUE(own.ok()) << bound << ": " << own.status().ToString();
    std::printf("%s is advertised as %s (%s)\n", bound, own->address.c_str(), own->how.c_str());
    EXPECT_TRUE(own->address.ends_with(":7300")) << own->address;
    auto here = IsAddressOfThisHost(own->address);
    ASSERT_TRUE(here.ok()) << here.status().ToString();
    EXPECT_TRUE(*here) << own->address;
    EXPECT_EQ(own->loopback_only, !has_other) << own->address;
  }
}

}  // namespace
}  // namespace viper::net
