#include "fault/cluster.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fault/content.h"
#include "viper/snapshot.h"

namespace viper::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::string FaultPeerBinary() { return std::string(VIPER_BINARY_DIR) + "/bin/viper_fault_peer"; }

bool ProcessAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// A free loopback port below the usual ephemeral range (32768+), so that another test's port-0
// socket does not take it while a member is down between its lives.
uint16_t PickPort(std::mt19937_64& rng) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    uint16_t port = static_cast<uint16_t>(20000 + rng() % 12000);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (free) return port;
  }
  return 0;
}

// Records `checksum` for `version` in `out`; an error if it was announced with another one.
Status MergeAnnounced(std::map<uint64_t, uint64_t>& out, uint64_t version, uint64_t checksum, const std::string& who) {
  uint64_t& known = out[version];
  if (known != 0 && checksum != 0 && known != checksum)
    return Status::Corruption(fmt::format("version {} was announced with two contents: checksum {} and {} ({})", version,
                                          checksum_hex(known), checksum_hex(checksum), who));
  if (checksum != 0) known = checksum;
  return Status::OK();
}

// "version checksum" lines (a kill may cut the last line short: it is ignored) into `out`;
// an error if a version already there has another non-zero checksum.
Status MergeVersionLog(const fs::path& path, std::map<uint64_t, uint64_t>& out) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || in.eof()) continue;  // the unterminated last line may be partial
    std::istringstream fields(line);
    uint64_t version = 0;
    std::string hex;
    if (!(fields >> version >> hex)) continue;
    auto checksum = parse_checksum_hex(hex);
    if (!checksum.ok()) continue;
    VIPER_RETURN_IF_ERROR(MergeAnnounced(out, version, *checksum, path.filename().string()));
  }
  return Status::OK();
}

nlohmann::json ReadJson(const fs::path& path) {
  std::string text = ReadFile(path);
  if (text.empty()) return nlohmann::json::object();
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json::object() : j;
}

// "<prefix>.<pid>.<seq>" -> pid, for /dev/shm names and "<v>.safetensors.tmp.<pid>.<seq>.<host>".
std::optional<pid_t> PidAfter(const std::string& name, const std::string& lead) {
  if (!name.starts_with(lead)) return std::nullopt;
  std::string rest = name.substr(lead.size());
  size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string::npos || rest.find_first_not_of("0123456789") < dot) return std::nullopt;
  return static_cast<pid_t>(std::stol(rest.substr(0, dot)));
}

}  // namespace

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::stoull(v) : fallback;
}

uint64_t FaultSeed() {
  return EnvOr("VIPER_FAULT_SEED",
               static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^ ::getpid());
}

// ---------------------------------------------------------------- ProcessMember

Status ProcessMember::Start() {
  if (running()) return Status::FailedPrecondition(spec_.name + " is already running");
  ++life_;
  process_ = std::make_unique<Process>(spec_.argv(life_), log_);
  if (process_->pid() <= 0) return Status::Internal("cannot spawn " + spec_.name);
  if (!WaitUntil([&] { return spec_.ready(life_) || !process_->running(); }, spec_.ready_timeout) ||
      !process_->running()) {
    return Status::Unavailable(fmt::format("{} (life {}) did not become ready{}", spec_.name, life_,
                                           process_->running() ? " in time" : ": it exited"));
  }
  return Status::OK();
}

void ProcessMember::Kill() {
  if (process_) process_->Kill(SIGKILL);
}

void ProcessMember::Stop() {
  if (!process_ || !process_->running()) {
    stopped_ = "not running when stopped";
    return;
  }
  ::kill(process_->pid(), SIGTERM);
  const int code = process_->Wait(60s);
  stopped_ = code >= 0 ? "exit code " + std::to_string(code) : "SIGKILL after 60 s";
  if (code < 0) process_->Kill(SIGKILL);
}

namespace {
std::string Tail(const std::string& text, size_t bytes = 1500) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}
}  // namespace

// ---------------------------------------------------------------- witness

// A client of the producer's node that records every version it is told about, and connects
// again whenever the node comes back: "announced" means "some subscriber was told".
struct FaultCluster::Witness {
  ClientOptions options;
  std::string model;
  mutable std::mutex mu;
  std::map<uint64_t, uint64_t> seen;  // version -> announced checksum
  Status conflict;                     // the first version announced with two contents
  bool stop = false;
  std::condition_variable cv;
  std::thread thread;

  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      lock.unlock();
      std::shared_ptr<std::atomic<bool>> lost = std::make_shared<std::atomic<bool>>(false);
      ClientHandlers handlers;
      handlers.on_notify = [this](const proto::VersionInfo& info) {
        std::lock_guard<std::mutex> l(mu);
        Status st = MergeAnnounced(seen, info.version, info.checksum, "NOTIFY to the witness");
        if (!st.ok() && conflict.ok()) conflict = st;
      };
      handlers.on_disconnect = [this, lost](const Status&) {
        lost->store(true);
        std::lock_guard<std::mutex> l(mu);
        cv.notify_all();
      };
      auto client = Client::Connect(options, handlers);
      if (client.ok() && !(*client)->Subscribe(model).ok()) client = Status::Unavailable("subscribe failed");
      lock.lock();
      cv.wait_for(lock, client.ok() ? std::chrono::milliseconds(3600'000) : std::chrono::milliseconds(50),
                  [&] { return stop || lost->load(); });
      lock.unlock();
      if (client.ok()) client->reset();  // outside the lock: its handlers take it
      lock.lock();
    }
  }
  std::map<uint64_t, uint64_t> Seen() const {
    std::lock_guard<std::mutex> lock(mu);
    return seen;
  }
  Status Conflict() const {
    std::lock_guard<std::mutex> lock(mu);
    return conflict;
  }
  ~Witness() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      cv.notify_all();
    }
    if (thread.joinable()) thread.join();
  }
};

// ---------------------------------------------------------------- cluster

FaultCluster::FaultCluster(FaultClusterOptions options) : options_(std::move(options)), rng_(options_.seed) {
  prefix_ = fmt::format("vfault{}x{}", ::getpid(), options_.seed % 100000);
  store_ = options_.dir / "store";
  fs::create_directories(store_);
}

FaultCluster::~FaultCluster() {
  witness_.reset();
  for (auto& m : members_) m->Kill();
}

std::unique_ptr<ProcessMember> FaultCluster::MakeProducer() {
  ProcessMember::Spec spec;
  spec.name = "producer";
  fs::path dir = options_.dir;
  spec.argv = [this, dir](int life) {
    std::vector<std::string> argv{FaultPeerBinary(), "produce", "--model", options_.model, "--listen", producer_address_,
                                  "--store-dir", store_.string(), "--segment-prefix", prefix_, "--mode", options_.mode,
                                  "--interval-ms", std::to_string(options_.interval_ms), "--min-bytes",
                                  std::to_string(options_.min_bytes), "--max-bytes", std::to_string(options_.max_bytes),
                                  "--seed", std::to_string(options_.seed), "--log", (dir / "producer.versions").string(),
                                  "--address-file", (dir / fmt::format("producer.{}.addr", life)).string()};
    argv.insert(argv.end(), options_.producer_args.begin(), options_.producer_args.end());
    return argv;
  };
  spec.ready = [dir](int life) { return fs::exists(dir / fmt::format("producer.{}.addr", life)); };
  return std::make_unique<ProcessMember>(std::move(spec), dir / "producer.log");
}

std::unique_ptr<ProcessMember> FaultCluster::MakeRelay() {
  ProcessMember::Spec spec;
  spec.name = "relay";
  fs::path dir = options_.dir;
  spec.argv = [this, dir](int life) {
    std::vector<std::string> argv{std::string(VIPER_BINARY_DIR) + "/bin/viper", "serve", "--listen", relay_address_,
                                  "--upstream", producer_address_, "--relay-model", options_.model,
                                  "--segment-prefix", prefix_,
                                  "--address-file", (dir / fmt::format("relay.{}.addr", life)).string()};
    argv.insert(argv.end(), options_.relay_args.begin(), options_.relay_args.end());
    return argv;
  };
  spec.ready = [dir](int life) { return fs::exists(dir / fmt::format("relay.{}.addr", life)); };
  return std::make_unique<ProcessMember>(std::move(spec), dir / "relay.log");
}

std::unique_ptr<ProcessMember> FaultCluster::MakeConsumer(const std::string& name, const std::string& connect,
                                                          const std::string& path) {
  ProcessMember::Spec spec;
  spec.name = name;
  fs::path dir = options_.dir;
  spec.argv = [this, dir, name, connect, path](int life) {
    std::vector<std::string> argv{FaultPeerBinary(), "consume", "--model", options_.model, "--connect", connect,
                                  "--path", path, "--threads", "2", "--pause-us", "500",
                                  "--status", (dir / fmt::format("{}.{}.status", name, life)).string(),
                                  "--live-log", (dir / (name + ".live")).string()};
    argv.insert(argv.end(), options_.consumer_args.begin(), options_.consumer_args.end());
    return argv;
  };
  spec.ready = [dir, name](int life) { return fs::exists(dir / fmt::format("{}.{}.status", name, life)); };
  return std::make_unique<ProcessMember>(std::move(spec), dir / (name + ".log"));
}

Status FaultCluster::Start() {
  for (auto& m : members_) VIPER_RETURN_IF_ERROR(m->Start());  // added ones first (a registry server)
  uint16_t producer_port = PickPort(rng_), relay_port = PickPort(rng_);
  if (producer_port == 0 || relay_port == 0 || producer_port == relay_port)
    return Status::Unavailable("no free loopback port for the cluster");
  producer_address_ = fmt::format("127.0.0.1:{}", producer_port);
  relay_address_ = fmt::format("127.0.0.1:{}", relay_port);
  members_.push_back(MakeProducer());
  VIPER_RETURN_IF_ERROR(members_.back()->Start());
  witness_ = std::make_unique<Witness>();
  witness_->options.connect = producer_address_;
  witness_->options.name = "fault-witness";
  witness_->model = options_.model;
  witness_->thread = std::thread([w = witness_.get()] { w->Run(); });
  if (options_.relay) {
    members_.push_back(MakeRelay());
    VIPER_RETURN_IF_ERROR(members_.back()->Start());
  }
  int n = 0;
  for (const std::string& path : options_.producer_consumer_paths) {
    consumers_.push_back(fmt::format("consumer{}-{}", ++n, path));
    members_.push_back(MakeConsumer(consumers_.back(), producer_address_, path));
    VIPER_RETURN_IF_ERROR(members_.back()->Start());
  }
  if (options_.relay) {
    consumers_.push_back(fmt::format("consumer{}-relay", ++n));
    members_.push_back(MakeConsumer(consumers_.back(), relay_address_, "auto"));
    VIPER_RETURN_IF_ERROR(members_.back()->Start());
  }
  return Status::OK();
}

std::vector<Member*> FaultCluster::victims() {
  std::vector<Member*> out;
  for (auto& m : members_) out.push_back(m.get());
  return out;
}

Member* FaultCluster::member(const std::string& name) {
  for (auto& m : members_)
    if (m->name() == name) return m.get();
  return nullptr;
}

void FaultCluster::AddMember(std::unique_ptr<Member> member) { members_.push_back(std::move(member)); }

void FaultCluster::AddCheck(std::string name, std::function<Status()> check) {
  checks_.emplace_back(std::move(name), std::move(check));
}

Result<std::map<uint64_t, uint64_t>> FaultCluster::Announced() const {
  VIPER_RETURN_IF_ERROR(witness_->Conflict());
  std::map<uint64_t, uint64_t> all = witness_->Seen();
  // In sync mode Commit returns after the announce; in async mode the log names versions that
  // may still have been queued when the producer died.
  if (options_.mode == "sync") VIPER_RETURN_IF_ERROR(MergeVersionLog(options_.dir / "producer.versions", all));
  for (const auto& c : consumers_) VIPER_RETURN_IF_ERROR(MergeVersionLog(options_.dir / (c + ".live"), all));
  return all;
}

Status FaultCluster::WaitForProgress(std::chrono::milliseconds timeout) {
  std::map<uint64_t, uint64_t> announced = witness_->Seen();
  bool ready = WaitUntil([&] { return !(announced = witness_->Seen()).empty(); }, timeout);
  if (!ready) return Status::Timeout("the witness was told of no version");
  const uint64_t target = announced.rbegin()->first;
  for (const auto& name : consumers_) {
    Member* m = member(name);
    fs::path status = options_.dir / fmt::format("{}.{}.status", name, m->lives());
    bool live = WaitUntil([&] { return ReadJson(status).value("live", uint64_t{0}) >= target; }, timeout);
    if (!live)
      return Status::Timeout(fmt::format("{} did not make version {} live within {} ms (status: {})", name, target,
                                         timeout.count(), ReadFile(status)));
  }
  return Status::OK();
}

Status FaultCluster::WaitForAnnounce(std::chrono::milliseconds timeout) {
  auto before = witness_->Seen();
  uint64_t newest = before.empty() ? 0 : before.rbegin()->first;
  if (WaitUntil([&] { auto now = witness_->Seen(); return !now.empty() && now.rbegin()->first > newest; }, timeout))
    return Status::OK();
  return Status::Timeout("no new version announced");
}

// Sums every life of every consumer: a torn read anywhere fails the run.
Status FaultCluster::CheckReads() {
  totals_.reads = totals_.torn = totals_.regressions = 0;
  std::string first;
  for (const auto& name : consumers_) {
    for (int life = 1; life <= member(name)->lives(); ++life) {
      auto j = ReadJson(options_.dir / fmt::format("{}.{}.status", name, life));
      totals_.reads += j.value("reads", uint64_t{0});
      totals_.torn += j.value("errors", uint64_t{0});
      totals_.regressions += j.value("regressions", uint64_t{0});
      if (first.empty() && j.value("errors", uint64_t{0}) > 0)
        first = fmt::format("{} life {}: {}", name, life, j.value("first_error", std::string()));
    }
  }
  if (totals_.torn > 0) return Status::Corruption(fmt::format("{} torn or unverified reads; first: {}", totals_.torn, first));
  if (totals_.regressions > 0) return Status::Corruption(fmt::format("{} reads went back in versions", totals_.regressions));
  return Status::OK();
}

Status FaultCluster::VerifyFetch(Client& client, uint64_t version, uint64_t checksum) {
  std::vector<std::byte> buffer;
  auto provide = [&](const proto::VersionInfo& info) -> Result<std::span<std::byte>> {
    buffer.resize(info.size);
    return std::span<std::byte>(buffer);
  };
  auto ok = client.FetchSend(options_.model, version, provide);
  if (!ok.ok()) return ok.status().WithContext(fmt::format("fetching announced version {}", version));
  auto snapshot = Snapshot::Parse(buffer, nullptr);
  if (!snapshot.ok()) return snapshot.status().WithContext(fmt::format("announced version {}", version));
  std::string error = CheckContent(*snapshot, options_.model, version);
  if (!error.empty()) return Status::Corruption(fmt::format("announced version {} fetched: {}", version, error));
  if (checksum != 0 && snapshot->declared_checksum() != checksum)
    return Status::Corruption(fmt::format("version {} was announced with checksum {}, the node now serves {}: a restart "
                                          "reused its number for other bytes", version, checksum_hex(checksum),
                                          checksum_hex(snapshot->declared_checksum().value_or(0))));
  totals_.verified_fetches++;
  return Status::OK();
}

// Versions fetched and verified byte for byte per round, at most (kNewestFetched of them the
// newest); every announced version must be in the catalog each round, and is fetched by the final
// full check.
constexpr size_t kFetchesPerRound = 48, kNewestFetched = 16;

Status FaultCluster::CheckFetchable(bool full) {
  VIPER_ASSIGN_OR_RETURN(auto announced_sums, Announced());
  std::set<uint64_t> announced;
  for (const auto& [v, sum] : announced_sums) announced.insert(v);
  totals_.announced = announced.size();
  VIPER_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, ConnectToProducer());
  VIPER_ASSIGN_OR_RETURN(std::vector<proto::VersionInfo> listed, client->List());
  std::set<uint64_t> catalog;
  for (const auto& v : listed)
    if (v.model == options_.model) catalog.insert(v.version);
  std::vector<uint64_t> missing;
  std::set_difference(announced.begin(), announced.end(), catalog.begin(), catalog.end(), std::back_inserter(missing));
  if (!missing.empty())
    return Status::NotFound(fmt::format("{} announced version(s) not in the producer's catalog after recovery, e.g. {} "
                                        "(catalog holds {} versions, {}..{})",
                                        missing.size(), missing.front(), catalog.size(),
                                        catalog.empty() ? 0 : *catalog.begin(), catalog.empty() ? 0 : *catalog.rbegin()));
  std::vector<uint64_t> to_fetch;
  for (uint64_t v : announced)
    if (full || !verified_.contains(v)) to_fetch.push_back(v);
  if (!full && to_fetch.size() > kFetchesPerRound) {
    // The newest and a random sample of the rest; the others stay unverified for a later round and
    // the final full check. Fetching every new version each round let a slow machine diverge: a
    // longer round announces more versions, whose fetches make the next round longer still (an
    // ASan run at load ~8 reached 3,600 versions and 13 minutes).
    std::vector<uint64_t> rest(to_fetch.begin(), to_fetch.end() - kNewestFetched);
    std::shuffle(rest.begin(), rest.end(), rng_);
    rest.resize(kFetchesPerRound - kNewestFetched);
    rest.insert(rest.end(), to_fetch.end() - kNewestFetched, to_fetch.end());
    to_fetch = std::move(rest);
  }
  std::vector<uint64_t> old(verified_.begin(), verified_.end());
  std::shuffle(old.begin(), old.end(), rng_);
  if (!full) to_fetch.insert(to_fetch.end(), old.begin(), old.begin() + std::min<size_t>(3, old.size()));
  for (uint64_t v : to_fetch) {
    VIPER_RETURN_IF_ERROR(VerifyFetch(*client, v, announced_sums[v]));
    verified_.insert(v);
  }
  return Status::OK();
}

Result<std::unique_ptr<Client>> FaultCluster::ConnectToProducer() {
  ClientOptions co;
  co.connect = producer_address_;
  co.name = "fault-checker";
  return Client::Connect(co);
}

Result<std::map<std::string, uint64_t>> FaultCluster::ProducerStats() {
  VIPER_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, ConnectToProducer());
  return client->Stats();
}

Status FaultCluster::CheckLeaks() {
  totals_.dead_segments = totals_.dead_temp_files = totals_.live_segments = 0;
  // The producer's node's counters before and after the scan of /dev/shm: what it had queued for
  // the file tier then, and how many versions it committed meanwhile (each may pin one more).
  VIPER_ASSIGN_OR_RETURN(auto before, ProducerStats());
  std::vector<std::string> dead;
  pid_t producer = static_cast<ProcessMember*>(member("producer"))->pid();
  for (const auto& entry : fs::directory_iterator("/dev/shm")) {
    std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix_)) continue;
    size_t dot = name.find('.');
    auto pid = dot == std::string::npos ? std::nullopt : PidAfter(name, name.substr(0, dot + 1));
    if (!pid) continue;
    if (!ProcessAlive(*pid)) dead.push_back(name);
    if (*pid == producer) totals_.live_segments++;
  }
  totals_.dead_segments = dead.size();
  std::vector<std::string> temps;
  for (const auto& entry : fs::recursive_directory_iterator(store_)) {
    std::string name = entry.path().filename().string();
    size_t at = name.find(".safetensors.tmp.");
    if (at == std::string::npos) continue;
    auto pid = PidAfter(name, name.substr(0, at) + ".safetensors.tmp.");
    if (!pid || !ProcessAlive(*pid)) temps.push_back(entry.path().string());
  }
  totals_.dead_temp_files = temps.size();
  if (!dead.empty()) return Status::Internal(fmt::format("{} leaked segment(s) of dead processes, e.g. /dev/shm/{}", dead.size(), dead[0]));
  if (!temps.empty()) return Status::Internal(fmt::format("{} leaked temporary file(s), e.g. {}", temps.size(), temps[0]));
  VIPER_ASSIGN_OR_RETURN(auto after, ProducerStats());
  // What the design allows: its idle set (keep_host_versions 2, the free pool 4, the spare 1), the
  // drafts being filled or waiting for their seal (max_in_flight 2 + 1), the delta base and target
  // (2), every version queued for the file tier (bounded by bytes, not count: a slow disk makes it
  // grow), and the leases of the consumers reading from it (those on its node and the relay, and
  // the one a round may just have killed, until its node notices the connection is gone).
  constexpr uint64_t kIdle = 2 + 4 + 1, kDrafts = 2 + 1, kDelta = 2;
  const uint64_t readers = options_.producer_consumer_paths.size() + (options_.relay ? 1 : 0) + 1;
  const uint64_t flushes = before["flushes_queued"] + (after["versions_committed"] - before["versions_committed"]);
  const uint64_t bound = kIdle + kDrafts + kDelta + flushes + readers * options_.leases_per_consumer;
  totals_.live_segments_bound = bound;
  totals_.flushes_queued = before["flushes_queued"];
  if (totals_.live_segments > bound)
    return Status::Internal(fmt::format(
        "the producer holds {} segments, more than the {} the design allows ({} idle, {} drafts, {} delta, {} queued "
        "for the file tier, {} consumers x {} leases): leases of dead consumers kept? Its node: {} writing, {} "
        "committed, {} retired but leased, {} free, {} leases of peers, {} peers",
        totals_.live_segments, bound, kIdle, kDrafts, kDelta, flushes, readers, options_.leases_per_consumer,
        after["host_writing_segments"], after["host_committed_segments"], after["host_retired_leased_segments"],
        after["host_free_segments"], after["leases_active"], after["peers"]));
  return Status::OK();
}

Status FaultCluster::CheckInvariants(bool full) {
  VIPER_RETURN_IF_ERROR(CheckReads());
  VIPER_RETURN_IF_ERROR(CheckFetchable(full));
  VIPER_RETURN_IF_ERROR(CheckLeaks());
  for (auto& [name, check] : checks_) {
    Status st = check();
    if (!st.ok()) return st.WithContext(name);
  }
  return Status::OK();
}

size_t FaultCluster::ProducerSegments() {
  pid_t producer = static_cast<ProcessMember*>(member("producer"))->pid();
  std::string lead = ".";
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator("/dev/shm")) {
    std::string name = entry.path().filename().string();
    size_t dot = name.find('.');
    if (name.starts_with(prefix_) && dot != std::string::npos && PidAfter(name, name.substr(0, dot + 1)) == producer) ++n;
  }
  return n;
}

Status FaultCluster::Stop() {
  witness_.reset();
  Member* producer = member("producer");
  for (auto it = members_.rbegin(); it != members_.rend(); ++it)  // consumers first
    if (it->get() != producer) (*it)->Stop();
  // keep_host_versions (2) + the free pool (4) + the publisher's spare (1), once queued flushes
  // are written: more means a lease outlived its consumer.
  constexpr size_t kIdleSegments = 2 + 4 + 1;
  size_t held = 0;
  if (!WaitUntil([&] { return (held = ProducerSegments()) <= kIdleSegments; }, 60s))
    return Status::Internal(fmt::format("with every consumer gone the producer still holds {} segments (at most {} "
                                        "expected): leases outlived their consumers", held, kIdleSegments));
  producer->Stop();
  VIPER_RETURN_IF_ERROR(CheckReads());
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator("/dev/shm"))
    if (entry.path().filename().string().starts_with(prefix_)) left.push_back(entry.path().filename().string());
  if (!left.empty()) {
    // Whose they are (the pid in the name) and how each member's stop ended.
    std::string owners, stops;
    for (const auto& m : members_) {
      auto* p = dynamic_cast<ProcessMember*>(m.get());
      if (p == nullptr) continue;
      size_t mine = 0;
      for (const auto& name : left) {
        size_t dot = name.find('.');
        if (dot != std::string::npos && PidAfter(name, name.substr(0, dot + 1)) == p->pid()) ++mine;
      }
      stops += fmt::format("{}{} (pid {}): {}", stops.empty() ? "" : ", ", m->name(), p->pid(), p->stopped());
      if (mine > 0) owners += fmt::format("\n---- {} owns {} of them; its log ends:\n{}", m->name(), mine, Tail(m->log()));
    }
    return Status::Internal(fmt::format("{} segment(s) left after a clean stop, e.g. /dev/shm/{}; stops: {}{}",
                                        left.size(), left[0], stops, owners));
  }
  for (const auto& entry : fs::recursive_directory_iterator(store_))
    if (entry.path().filename().string().find(".tmp.") != std::string::npos)
      return Status::Internal("temporary file left after a clean stop: " + entry.path().string());
  return Status::OK();
}

FaultTotals FaultCluster::totals() const {
  FaultTotals t = totals_;
  std::string log = ReadFile(options_.dir / "producer.log");
  auto count = [&log](std::string_view what) {
    uint64_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  t.recovered_from_segments = count("from segment");
  t.interrupted_writes_removed = count("leftover of an interrupted write");
  return t;
}

std::string FaultCluster::Stacks() {
  std::ostringstream out;
  for (const auto& m : members_) {
    auto* p = dynamic_cast<ProcessMember*>(m.get());
    if (p == nullptr || !p->running()) continue;
    fs::path file = options_.dir / (m->name() + ".stacks");
    std::string cmd = fmt::format("gdb -p {} -batch -ex 'thread apply all bt' >{} 2>&1", p->pid(), file.string());
    (void)std::system(cmd.c_str());
    out << "---- stacks of " << m->name() << "\n" << ReadFile(file) << "\n";
  }
  return out.str();
}

std::string FaultCluster::Logs() const {
  std::ostringstream out;
  for (const auto& m : members_) {
    std::string log = m->log();
    if (log.size() > 6000) log = "..." + log.substr(log.size() - 6000);
    out << "---- " << m->name() << " (" << m->lives() << " lives)\n" << log << "\n";
  }
  return out.str();
}

}  // namespace viper::testing
