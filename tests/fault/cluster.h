// FaultCluster: a small Viper deployment as real processes (a producer with a file tier, a relay
// node, consumers on both), the kills the fault suite makes, and the checks it runs after each.
//
// Every process is a Member; a round kills one member with SIGKILL and starts it again. More
// kinds of members (a redis-server for the Redis registry) plug in through AddMember(), and
// their invariants through AddCheck(). What must hold after every round (CheckInvariants):
//  - no consumer has seen a torn or unverified model: each checks every read itself
//    (tests/fault/content.h) and reports in a status file that survives its own death;
//  - every version that was announced (seen by the witness, a consumer or, in sync mode, the
//    producer's own log) is listed by the producer's node and fetchable from it (memory or file
//    tier), whole and bit-exact: listed after every round, fetched (the newest and a sample of the
//    new ones, at most 48 a round) after every round and all of them in the final full check;
//  - nothing leaked: no shared-memory segment of a dead process, no temporary file of a dead
//    writer in the file tier, and the producer's live segments stay bounded (a dead consumer's
//    leases were dropped).
//
// Thread-safety: one test thread drives a cluster; the witness runs its own thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/client.h"
#include "api/process.h"
#include "viper/status.h"

namespace viper::testing {

// A long-lived part of the deployment that a round may kill.
class Member {
 public:
  virtual ~Member() = default;
  virtual const std::string& name() const = 0;
  // Starts it (again, after Kill); returns once it serves. Each start is a new "life".
  virtual Status Start() = 0;
  virtual void Kill() = 0;  // SIGKILL and reap
  virtual void Stop() = 0;  // SIGTERM (a clean exit) and reap
  virtual bool running() = 0;
  virtual int lives() const = 0;
  virtual std::string log() const = 0;
};

// A member that is one process. `argv(life)` is recomputed at every start (life 1, 2, ...);
// `ready(life)` is polled until it holds or `ready_timeout` passes.
class ProcessMember : public Member {
 public:
  struct Spec {
    std::string name;
    std::function<std::vector<std::string>(int life)> argv;
    std::function<bool(int life)> ready;
    std::chrono::milliseconds ready_timeout{60000};
  };
  ProcessMember(Spec spec, std::filesystem::path log) : spec_(std::move(spec)), log_(std::move(log)) {}
  const std::string& name() const override { return spec_.name; }
  Status Start() override;
  void Kill() override;
  void Stop() override;
  bool running() override { return process_ && process_->running(); }
  int lives() const override { return life_; }
  std::string log() const override { return ReadFile(log_); }
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  // How the last Stop() ended: "exit code N", "exit code 128+SIG", "SIGKILL after 60 s", or "not
  // running when stopped".
  const std::string& stopped() const { return stopped_; }

 private:
  Spec spec_;
  std::string stopped_;
  std::filesystem::path log_;
  std::unique_ptr<Process> process_;
  int life_ = 0;
};

struct FaultClusterOptions {
  std::filesystem::path dir;    // REQUIRED: working directory (logs, store, status files)
  uint64_t seed = 1;
  std::string model = "fm";
  std::string mode = "sync";     // producer publish mode
  int interval_ms = 50;          // between publishes
  uint64_t min_bytes = 16 << 10, max_bytes = 512 << 10;  // size range of the large tensor
  bool relay = true;             // a relay node (viper serve --upstream) with one consumer
  // Consumers on the producer's node, by fetch path; one more "auto" consumer on the relay.
  std::vector<std::string> producer_consumer_paths = {"map", "copy"};
  // Extra arguments (another backend's flags, e.g. a registry URL).
  std::vector<std::string> producer_args, relay_args, consumer_args;
  // Leases one consumer of the producer may hold at once (the live version, one per reader
  // thread, one being loaded): with the producer's idle set, drafts in flight and the versions its
  // node reports queued for the file tier, this bounds its segments after each round
  // (CheckLeaks); Stop() checks the tight bound once no consumer runs.
  size_t leases_per_consumer = 4;
};

struct FaultTotals {
  uint64_t reads = 0, torn = 0, regressions = 0;
  uint64_t announced = 0, verified_fetches = 0;
  uint64_t dead_segments = 0, dead_temp_files = 0, live_segments = 0;
  uint64_t live_segments_bound = 0;  // what the design allows at the last check (CheckLeaks)
  uint64_t flushes_queued = 0;       // of it, versions the producer's node had queued for the file tier
  // From the producer's log: versions a restarted producer took back from its dead predecessor's
  // segments, and temporary files of interrupted flushes it removed.
  uint64_t recovered_from_segments = 0, interrupted_writes_removed = 0;
};

class FaultCluster {
 public:
  explicit FaultCluster(FaultClusterOptions options);
  ~FaultCluster();  // kills whatever still runs

  // Starts the members added so far (AddMember), then the producer, the relay, the consumers and
  // the witness.
  Status Start();
  // Members any round may kill (producer, relay, consumers, and those added).
  std::vector<Member*> victims();
  Member* member(const std::string& name);
  // A member any round may kill; added before Start(), it is started first.
  void AddMember(std::unique_ptr<Member> member);
  void AddCheck(std::string name, std::function<Status()> check);

  // Waits until every consumer has made live a version at least as new as the newest one
  // announced when the call began (the cluster serves again after a kill).
  Status WaitForProgress(std::chrono::milliseconds timeout);
  // Returns as soon as the witness is told of a version newer than any before the call (a kill
  // right after an announce hits the window before the version reaches the file tier).
  Status WaitForAnnounce(std::chrono::milliseconds timeout);
  // The checks in the header comment, plus AddCheck's. `full` fetches every announced version
  // again (else up to 48 of the new ones, the newest first, and 3 old ones).
  Status CheckInvariants(bool full = false);
  // SIGTERM to every consumer and the relay; then the producer must get back to at most its kept
  // versions, free pool and spare (every lease of every consumer, dead or stopped, was dropped);
  // then SIGTERM to the rest: no segment with the cluster's prefix, no temporary file left.
  Status Stop();

  FaultTotals totals() const;
  const std::string& producer_address() const { return producer_address_; }
  const std::string& relay_address() const { return relay_address_; }
  const std::string& segment_prefix() const { return prefix_; }
  const std::filesystem::path& store_dir() const { return store_; }
  std::string Logs() const;  // every member's log, for a failure message
  // Every running member's threads' stacks (gdb), for a failure that looks like a hang.
  std::string Stacks();

 private:
  struct Witness;
  std::unique_ptr<ProcessMember> MakeProducer();
  std::unique_ptr<ProcessMember> MakeRelay();
  std::unique_ptr<ProcessMember> MakeConsumer(const std::string& name, const std::string& connect,
                                              const std::string& path);
  // Every announced version, with the checksum it was announced with (0 if only the producer's
  // log names it); a version announced with two checksums is an error.
  Result<std::map<uint64_t, uint64_t>> Announced() const;
  Status CheckReads();
  Status CheckFetchable(bool full);
  Status CheckLeaks();
  Status VerifyFetch(Client& client, uint64_t version, uint64_t checksum);
  size_t ProducerSegments();  // the producer's segments in /dev/shm
  Result<std::unique_ptr<Client>> ConnectToProducer();       // a checker's connection to its node
  Result<std::map<std::string, uint64_t>> ProducerStats();  // its node's STATS counters

  FaultClusterOptions options_;
  std::string prefix_;
  std::filesystem::path store_;
  std::string producer_address_, relay_address_;
  std::vector<std::unique_ptr<Member>> members_;
  std::vector<std::string> consumers_;  // member names
  std::vector<std::pair<std::string, std::function<Status()>>> checks_;
  std::unique_ptr<Witness> witness_;
  std::set<uint64_t> verified_;
  std::mt19937_64 rng_;
  FaultTotals totals_;
};

// Seed of a randomised run: VIPER_FAULT_SEED if set (to replay a failure), else from the clock.
uint64_t FaultSeed();
// An integer from the environment, or `fallback`.
uint64_t EnvOr(const char* name, uint64_t fallback);

}  // namespace viper::testing
