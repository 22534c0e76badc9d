// viper serve: a standalone node (host tier, optional file tier, UCX listener, registry).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "command.h"
#include "core/fd.h"
#include "node_common.h"
#include "registry_cli.h"
#include "temp_file.h"
#include "viper/log.h"
#include "viper/node.h"
#include "viper/relay.h"

namespace viper::cli {
namespace {

// Every option named after a NodeOptions field (--keep-host-versions: keep_host_versions) defaults
// to that field's default, read from a default-constructed NodeOptions (include/viper/node.h, the
// one place it is written); --listen differs on purpose and says so in its help.
struct ServeFlags {
  NodeOptions node;
  AuthFlags auth;
  std::string address_file;
  std::string delta = std::string(delta_mode_name(NodeOptions{}.delta));
  double registry_ttl_s = std::chrono::duration<double>(RegistryHeartbeat{}.ttl).count();
  std::string host_max_bytes = std::to_string(NodeOptions{}.host_max_bytes);
  std::string registry_password_file;
  RelayOptions relay;  // with --relay-model: this node replicates the models (--upstream, or placed)
  // --upstream-liveness: the relay's silence before a probe, and the wait for its answer.
  double upstream_liveness_s = std::chrono::duration<double>(RelayOptions{}.liveness_probe).count();
  // --peer-liveness: the node's silence before it pings a peer, and the wait for the answer.
  double peer_liveness_s = std::chrono::duration<double>(NodeOptions{}.peer_liveness_probe).count();
};

// Writes "HOST:PORT\n" to `path` through a temporary beside it (removed if anything fails), so a
// reader never sees a partial address.
// The bound address, written to a temporary created exclusively under an unpredictable name next
// to `path` (temp_file.h), then renamed: nothing planted at a guessable name is written through.
Status WriteAddressFile(const std::string& path, const std::string& address) {
  auto created = internal::CreateTempNextTo(path, 0644);
  if (!created.ok()) return created.status().WithContext("--address-file");
  internal::TempFile temp = *std::move(created);
  const std::string line = address + "\n";
  bool written = ::write(temp.fd.get(), line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (temp.fd.Close() != 0 || !written) {
    Status st = Status::FromErrno("--address-file: cannot write " + temp.path.string());
    ::unlink(temp.path.c_str());
    return st;
  }
  if (std::rename(temp.path.c_str(), path.c_str()) != 0) {
    Status st = Status::FromErrno("--address-file: cannot rename " + temp.path.string() + " to " + path);
    ::unlink(temp.path.c_str());
    return st;
  }
  return Status::OK();
}

// On a clean stop: the address file goes, if it still names this node (another node may have
// taken the path since, on another port), so that a script waiting for the file never takes a stopped node's
// address for a live one. After SIGKILL it stays: readers check that the node answers. Only a
// regular file of ours is read, without blocking and at most one line's worth: whatever was put
// at the path since (a FIFO, a link, a huge file) must not hold up the stop and its last flushes.
void RemoveAddressFile(const std::string& path, const std::string& address) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) return;
  std::string line(address.size() + 1, '\0');
  ssize_t n = ::read(fd.get(), line.data(), line.size());
  if (n == static_cast<ssize_t>(line.size()) && line == address + "\n") ::unlink(path.c_str());
}

int RunServe(const ServeFlags& flags) {
  NodeOptions options = flags.node;
  auto token = flags.auth.Resolve();
  if (!token.ok()) return Fail("serve", token.status());
  auto delta = ParseDeltaMode(flags.delta);
  if (!delta.ok()) return Fail("serve", delta.status().WithContext("--delta"));
  options.delta = *delta;
  options.token = *token;
  auto max_bytes = ParseBytes(flags.host_max_bytes, "--host-max-bytes");
  if (!max_bytes.ok()) return Fail("serve", max_bytes.status());
  options.host_max_bytes = *max_bytes;
  SetLiveness(flags.peer_liveness_s, &options.peer_liveness_probe, &options.peer_liveness_timeout);
  if (!options.registry.empty()) {
    auto password = RegistryPassword(flags.registry_password_file);
    if (!password.ok()) return Fail("serve", password.status());
    options.registry_password = *password;
    auto heartbeat = HeartbeatForTtl(flags.registry_ttl_s);
    if (!heartbeat.ok()) return Fail("serve", heartbeat.status());
    options.registry_heartbeat = *heartbeat;
  }
  sigset_t stop = BlockStopSignals();  // before any thread starts

  auto node = Node::Start(options);
  if (!node.ok()) return Fail("serve", node.status());
  std::unique_ptr<Relay> relay;  // destroyed before the node
  if (!flags.relay.models.empty()) {
    RelayOptions ro = flags.relay;
    ro.token = *token;  // one token for the whole deployment
    SetLiveness(flags.upstream_liveness_s, &ro.liveness_probe, &ro.liveness_timeout);
    if (ro.upstream.empty()) {  // placed by the registry
      ro.registry = options.registry;
      ro.registry_password = options.registry_password;
      ro.heartbeat = options.registry_heartbeat;
    }
    auto started = Relay::Start(**node, ro);
    if (!started.ok())
      return Fail("serve", started.status().WithContext(ro.upstream.empty() ? "--relay-model with --registry "
                                                                              : "--upstream " + ro.upstream));
    relay = std::move(started).value();
    if (ro.upstream.empty())
      std::printf("viper serve: relaying through the relay tree of %s (at most %u children)\n", ro.registry.c_str(),
                  ro.max_children);
    else
      std::printf("viper serve: relaying from %s\n", ro.upstream.c_str());
  }
  if (!options.registry.empty())
    std::printf("viper serve: registering in %s (TTL %.1f s)\n", options.registry.c_str(), flags.registry_ttl_s);
  std::string where = (*node)->listen_address();
  if ((*node)->address() != where) where += " (advertised as " + (*node)->address() + ")";
  if (!options.store_dir.empty()) where += ", file tier " + options.store_dir.string();
  std::printf("viper serve: %s listening on %s\n", options.name.empty() ? "node" : options.name.c_str(), where.c_str());
  for (const auto& v : (*node)->List())
    std::printf("viper serve: serving %s version %llu (%llu bytes)\n", v.model.c_str(),
                static_cast<unsigned long long>(v.version), static_cast<unsigned long long>(v.size));
  std::fflush(stdout);
  if (!flags.address_file.empty()) {
    if (Status st = WriteAddressFile(flags.address_file, (*node)->address()); !st.ok()) {
      relay.reset();
      node->reset();
      return Fail("serve", st);
    }
  }
  int sig = 0;
  sigwait(&stop, &sig);
  std::printf("viper serve: stopping (signal %d), flushing to the file tier\n", sig);
  std::fflush(stdout);
  // First, while this process still holds the port: the node stops listening before its flush
  // ends, and a node started meanwhile on the same port writes the same address.
  if (!flags.address_file.empty()) RemoveAddressFile(flags.address_file, (*node)->address());
  relay.reset();
  node->reset();
  return 0;
}

ViperCommand serve_command(
    "serve", "Run a standalone node",
    [](CLI::App& app) -> RunFn {
      auto flags = std::make_shared<ServeFlags>();
      flags->node.listen = kDefaultNodeAddress;
      app.add_option("--listen", flags->node.listen,
                     "HOST:PORT to listen on (loopback unless told otherwise). Differs on purpose from "
                     "NodeOptions::listen (port 0, any free port): a standalone node listens where clients' "
                     "--connect looks by default")
          ->capture_default_str()
          ->check(HostPort());
      app.add_option("--advertise", flags->node.advertise,
                     "HOST other hosts reach this node at, in the registry and replica lists (default: the --listen "
                     "host or, for 0.0.0.0 / ::, this host's own address)")
          ->check(Text(253));
      app.add_option("--store-dir", flags->node.store_dir, "File tier directory (persistence and fallback)")
          ->check(PathText());
      app.add_option("--keep-host-versions,--keep-host", flags->node.keep_host_versions,
                     "Versions per model kept in memory (--keep-host: the old name, deprecated)")
          ->capture_default_str()
          ->check(IntegerIn(1, kMaxKeptVersions));
      app.add_option("--keep-file-versions,--keep-files", flags->node.keep_file_versions,
                     "Versions per model kept on the file tier (--keep-files: the old name, deprecated)")
          ->capture_default_str()
          ->check(IntegerIn(1, kMaxKeptVersions));
      app.add_option("--host-max-bytes", flags->host_max_bytes,
                     "Shared memory the node's segments may take, e.g. 8GiB (0 = half of /dev/shm); a publish beyond "
                     "it fails with ResourceExhausted")
          ->capture_default_str()
          ->check(Text(32));  // then ParseBytes: "--host-max-bytes '12x': unknown suffix ..."
      app.add_option("--host-max-models", flags->node.host_max_models,
                     "Models the node holds in shared memory (0 = no cap); one more fails to publish")
          ->capture_default_str()
          ->check(IntegerIn(0, 1000000));
      app.add_option("--name", flags->node.name, "Node name shown to peers")->check(Text(kMaxNodeNameBytes));
      app.add_flag("--insecure", flags->node.insecure,
                   "Listen beyond loopback without a token (anyone who reaches the port can publish and fetch)");
      app.add_option("--segment-prefix", flags->node.segment_prefix,
                     "Shared-memory segment name prefix ([A-Za-z0-9_-]; a hash of --store-dir is appended)")
          ->capture_default_str()
          ->check(SegmentPrefix());
      app.add_option("--delta", flags->delta,
                     "Deltas to remote consumers: off, auto (when smaller and predicted faster), always")
          ->capture_default_str()
          ->check(OneOf({"off", "auto", "always"}));
      app.add_option("--delta-bases", flags->node.delta_bases,
                     "Older versions per model kept as delta bases (each pins one snapshot in memory)")
          ->capture_default_str()
          ->check(IntegerIn(0, kMaxKeptVersions));
      app.add_option("--peer-liveness", flags->peer_liveness_s,
                     "Seconds of silence from a peer (consumer, relay) before the node pings it, and then for its "
                     "answer; no answer and the peer is dropped (its leases released, no longer listed as a relay). "
                     "0: never pinged (a host cut off without a word is then kept until TCP gives up, minutes)")
          ->capture_default_str()
          ->check(ZeroOrSecondsIn(0.1, 3600));
      app.add_option("--address-file", flags->address_file, "Write the bound HOST:PORT to this file once listening (removed on a clean stop)")
          ->check(NewFile());
      AddRegistry(app, flags->node.registry, flags->registry_password_file);
      app.add_option("--registry-ttl", flags->registry_ttl_s,
                     "Seconds the registry keeps this node's records without a heartbeat (one every third)")
          ->capture_default_str()
          ->check(SecondsIn(0.3, 86400));
      app.add_option("--upstream", flags->relay.upstream,
                     "Relay: replicate the models named by --relay-model from the node at HOST:PORT")
          ->check(HostPort());
      app.add_option("--relay-model", flags->relay.models,
                     "Model to relay (repeatable): from --upstream, or, without it, from the parent --registry "
                     "(redis://) places this node under")
          ->check(ModelName());
      app.add_option("--max-children", flags->relay.max_children,
                     "Relays the registry places under this one, per model (without --upstream)")
          ->default_val(kDefaultRelayChildren)
          ->check(IntegerIn(1, 1024));
      app.add_option("--upstream-alternate", flags->relay.alternates,
                     "Relay from this HOST:PORT while --upstream is unreachable (repeatable, tried in order)")
          ->check(HostPort());
      app.add_option("--upstream-liveness", flags->upstream_liveness_s,
                     "Relay: seconds of silence from the upstream before it is asked to answer, and then for its "
                     "answer; no answer and the relay leaves it (for an alternate or, placed, another parent). "
                     "0: never asked (a host cut off without a word is then never left)")
          ->capture_default_str()
          ->check(ZeroOrSecondsIn(0.1, 3600));
      app.add_flag("--upstream-remote", flags->relay.always_remote,
                   "Fetch from the upstream over the network even on this host (tests and measurements)");
      app.add_option("--upstream-file-dir", flags->relay.file_dir,
                     "The upstream's file tier as seen from here (relay's fallback)")
          ->check(PathText());
      flags->auth.Add(app);
      return [flags] {
        if (!flags->relay.upstream.empty() && flags->relay.models.empty())
          return Fail("serve", Status::InvalidArgument("--upstream needs --relay-model"));
        if (!flags->relay.models.empty() && flags->relay.upstream.empty() &&
            !flags->node.registry.starts_with("redis://"))
          return Fail("serve", Status::InvalidArgument(
                                   "--relay-model needs --upstream, or --registry redis://... to place the relay"));
        return RunServe(*flags);
      };
    },
    10);

}  // namespace
}  // namespace viper::cli
