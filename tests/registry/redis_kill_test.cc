// Redis killed with -9 at random points while a node publishes and a subscriber that found the
// node through Redis follows it (issue 15 item 2, the Redis victim). After every round:
//  - the registry lists exactly what the node holds (it registered everything again, Redis having
//    restarted empty), and the newest version the node announced;
//  - the subscriber has the newest published version live: nothing announced was lost;
//  - it never loaded a version twice or went backwards (heard from the node and from Redis);
//  - the node warned at most once per outage ("unreachable" when a pass found Redis down, "had lost"
//    when Redis came back before the node noticed), and said once that it was back.
//
//   VIPER_FAULT_ROUNDS=N   rounds (default 50; 10 under a sanitizer; scripts/soak-redis.sh runs more)
//   VIPER_FAULT_SEED=S     replays a run (every random choice follows from the printed seed)
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "fleet.h"
#include "viper/subscriber.h"

namespace viper {
namespace {

using namespace std::chrono_literals;
using testing::CountLines;
using testing::PublishTo;
using testing::ServeProcess;
using testing::TempDir;
using testing::WaitUntil;

// The node's registry TTL: each outage gives one warning, and so does a TTL that lapses while
// Redis is up (the node finds its records gone), which a sanitizer build stalled for the TTL on a
// loaded machine could see. A longer TTL there costs a slower heartbeat (TTL/3) in every round.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr uint64_t kDefaultRounds = 10;
constexpr double kTtlS = 4.5;
#else
constexpr uint64_t kDefaultRounds = 50;
constexpr double kTtlS = 1.5;
#endif

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoull(v) : fallback;
}

TEST(RedisKill, RandomKillsLoseNothingAnnounced) {
  const uint64_t rounds = EnvOr("VIPER_FAULT_ROUNDS", kDefaultRounds);
  const uint64_t seed = EnvOr("VIPER_FAULT_SEED", static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::printf("redis kill: %llu rounds, seed %llu (VIPER_FAULT_SEED replays)\n", static_cast<unsigned long long>(rounds),
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  TempDir dir;
  testing::RedisServer redis;
  ASSERT_EQ(redis.Start(), "");
  auto registry = OpenRegistry(redis.url());
  ASSERT_TRUE(registry.ok());
  ServeProcess node(dir, "kn", redis.url(), kTtlS);
  ASSERT_FALSE(node.address().empty()) << node.log();
  const std::string model = "rk";

  // The producer: a thread publishing through the node every 20-60 ms until told to stop.
  std::atomic<uint64_t> published{0};
  std::atomic<bool> stop{false};
  ASSERT_EQ(PublishTo(node.address(), model, 1), 1u);
  published = 1;
  auto publisher = testing::ConnectTo(node.address());
  auto lister = testing::ConnectTo(node.address());
  ASSERT_TRUE(publisher && lister);
  std::thread producer([&, seed] {
    std::mt19937_64 prng(seed + 1);
    for (uint64_t s = 2; !stop; ++s) {
      uint64_t v = testing::PublishWith(*publisher, model, s);
      if (v == 0) return;
      published = v;
      std::this_thread::sleep_for(std::chrono::milliseconds(prng() % 40));
    }
  });

  SubscriberOptions so;
  so.model = model;
  so.registry = redis.url();
  so.request_timeout = 10s;
  auto sub = Subscriber::Start(so);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  std::mutex mu;
  std::vector<uint64_t> live;
  (*sub)->OnUpdate([&](const std::shared_ptr<const ModelVersion>& mv) {
    std::lock_guard<std::mutex> lock(mu);
    live.push_back(mv->version());
  });

  auto fail = [&](uint64_t round, const std::string& what) {
    return "seed " + std::to_string(seed) + " round " + std::to_string(round) + ": " + what + "\nnode log:\n" +
           node.log() + "\nredis log:\n" + redis.log();
  };
  int outages_seen = 0;
  for (uint64_t round = 1; round <= rounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 200));
    redis.Kill();
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 200));
    ASSERT_EQ(redis.Restart(), "") << fail(round, "restarting redis-server");
    uint64_t target = published.load();
    ASSERT_TRUE((*sub)->WaitFor(target, 30s).ok()) << fail(round, "subscriber did not reach " + std::to_string(target));
    ASSERT_TRUE(WaitUntil(
        [&] {
          auto held = testing::HeldBy(*lister, model);
          return !held.empty() && testing::RegisteredFor(**registry, model, node.address()) == held;
        },
        30s))
        << fail(round, "the registry does not list what the node holds");
    std::string log = node.log();
    int outages = CountLines(log, "is unreachable") + CountLines(log, "had lost");
    ASSERT_LE(outages, static_cast<int>(round)) << fail(round, "more than one warning per outage");
    outages_seen = outages;
    std::printf("redis kill round %llu/%llu: ok (published %llu, live %llu, warnings so far %d)\n",
                static_cast<unsigned long long>(round), static_cast<unsigned long long>(rounds),
                static_cast<unsigned long long>(published.load()),
                static_cast<unsigned long long>((*sub)->latest() ? (*sub)->latest()->version() : 0), outages);
  }
  stop = true;
  producer.join();
  ASSERT_TRUE((*sub)->WaitFor(published.load(), 30s).ok()) << fail(rounds, "last version");
  SubscriberStats stats = (*sub)->stats();
  Status last_error = (*sub)->last_error();
  (*sub)->Close();
  if (stats.fetch_failures > 0) {
    EXPECT_NE(last_error.message().find("has no version"), std::string::npos) << last_error.ToString();
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(std::adjacent_find(live.begin(), live.end(), std::greater_equal<uint64_t>()) == live.end())
      << "a version was loaded twice or went backwards";
  // Every outage the node noticed ends with its reconnection while redis-server is up. The node
  // logs the reconnection when its whole registry pass is done (puts, removals, announcements),
  // but the round's check sees the records as soon as they are put, so the last round's line can
  // come after the loop ends (once under TSan in CI): this waits for it.
  std::string log;
  EXPECT_TRUE(WaitUntil(
      [&] {
        log = node.log();
        return CountLines(log, "is reachable again") == CountLines(log, "is unreachable");
      },
      10s))
      << "an outage without a reconnection (redis-server running: " << redis.running() << ")\nnode log:\n"
      << log << "\nredis log:\n"
      << redis.log();
  // A fetch can fail when the node's retention dropped the version before this loader got to it
  // (a new version every 0-40 ms, 2 kept in memory): the loader then loads the next one.
  std::printf("redis kill: %llu rounds, %llu versions published, %llu loaded, %llu fetches of versions already "
              "retired, %d outages noticed by the node, 0 versions lost\n",
              static_cast<unsigned long long>(rounds), static_cast<unsigned long long>(published.load()),
              static_cast<unsigned long long>(stats.updates), static_cast<unsigned long long>(stats.fetch_failures),
              outages_seen);
}

}  // namespace
}  // namespace viper
