// `viper-bench bench-peer` (hidden; `viper bench-peer` execs it too): the consumer processes of
// `viper bench` (bench/harness/peer.h).
//
//   bench-peer subscribe --connect ADDR --model M --path map|copy|remote|auto [--no-verify] [--verify-local]
//   bench-peer poll --dir D --interval S
//   bench-peer fanout-host --listen IP:0 [--upstream ADDR | --registry URL [--max-children K] | --connect ADDR]
//                          --consumers N [--no-pipeline] [--verify-local]
//   bench-peer wake
#include "cli_checks.h"
#include "command.h"
#include "harness/fanout.h"
#include "harness/peer.h"
#include "node_common.h"

namespace viper::cli {
namespace {

struct PeerFlags {
  std::string connect, model = "nt3", path = "map", dir;
  bench::FanoutHostOptions host;
  double interval_s = 1.0;
  bool no_verify = false;
  bool verify_local = false;
  bool no_pipeline = false;  // fanout-host: relay complete versions only
  AuthFlags auth;
};

Result<SubscriberOptions> MakeSubscriberOptions(const PeerFlags& f) {
  SubscriberOptions options;
  VIPER_ASSIGN_OR_RETURN(options.token, f.auth.Resolve());
  VIPER_ASSIGN_OR_RETURN(options.path, ParseFetchPath(f.path));
  options.model = f.model;
  options.connect = f.connect;
  options.verify_checksum = !f.no_verify;
  options.verify_local = f.verify_local;
  options.name = "viper-bench-peer";
  return options;
}

int RunSubscribe(const PeerFlags& f) {
  auto options = MakeSubscriberOptions(f);
  if (!options.ok()) return Fail("bench-peer", options.status());
  Status st = bench::RunSubscriberPeer(*options);
  return st.ok() ? 0 : Fail("bench-peer", st);
}

int RunPoll(const PeerFlags& f) {
  Status st = bench::RunPollerPeer(f.dir, f.interval_s);
  return st.ok() ? 0 : Fail("bench-peer", st);
}

ViperCommand bench_peer_command(
    "bench-peer", "(internal) consumer process of `viper bench`",
    [](CLI::App& app) -> RunFn {
      app.group("");  // hidden from --help
      auto f = std::make_shared<PeerFlags>();
      auto* sub = app.add_subcommand("subscribe", "Subscriber; one JSON line per update");
      sub->add_option("--connect", f->connect, "Node address HOST:PORT")->required()->check(HostPort());
      sub->add_option("--model", f->model, "Model name")->check(ModelName());
      sub->add_option("--path", f->path, "auto|map|copy|remote|file")
          ->check(OneOf({"auto", "map", "copy", "remote", "file"}));
      sub->add_flag("--no-verify", f->no_verify, "Verify no checksum");
      sub->add_flag("--verify-local", f->verify_local, "Also verify map/copy bytes (SubscriberOptions::verify_local)");
      f->auth.Add(*sub);
      auto* poll = app.add_subcommand("poll", "Directory poller (the file baseline)");
      poll->add_option("--dir", f->dir, "Directory of <version>.safetensors files")->required()->check(PathText());
      poll->add_option("--interval", f->interval_s, "Seconds between polls")->check(SecondsIn(0, 3600, /*lo_open=*/true));
      auto* host = app.add_subcommand("fanout-host", "A node (relaying with --upstream) and its consumers (viper bench --fanout)");
      host->add_option("--listen", f->host.listen, "HOST:PORT of the node")->required()->check(HostPort());
      host->add_option("--upstream", f->host.upstream, "Relay the model from this node")->check(HostPort());
      host->add_option("--connect", f->host.connect, "Without --upstream: the node the consumers subscribe to")->check(HostPort());
      host->add_option("--model", f->host.model, "Model name")->check(ModelName());
      host->add_option("--path", f->host.path, "The consumers' fetch path")->check(OneOf({"auto", "map", "copy", "remote", "file"}));
      host->add_option("--consumers", f->host.consumers, "Consumer processes")->check(IntegerIn(1, 4096));
      host->add_flag("--no-pipeline", f->no_pipeline, "Relay complete versions only");
      host->add_option("--registry", f->host.registry, "Instead of --upstream: placed by this registry (redis://)")
          ->check(RegistryUrl());
      host->add_option("--max-children", f->host.max_children, "With --registry: children this relay takes")
          ->check(IntegerIn(1, 1024));
      host->add_flag("--verify-local", f->host.verify_local, "Consumers hash what they map (SubscriberOptions::verify_local)");
      auto* wake = app.add_subcommand("wake", "Fan-out baseline: one line per line read on stdin");
      app.require_subcommand(1);
      return [f, sub, host, wake] {
        if (host->parsed() || wake->parsed()) {
          f->host.pipelined = !f->no_pipeline;
          Status st = host->parsed() ? bench::RunFanoutHost(f->host) : bench::RunWakePeer();
          return st.ok() ? 0 : Fail("bench-peer", st);
        }
        return sub->parsed() ? RunSubscribe(*f) : RunPoll(*f);
      };
    },
    1000);

}  // namespace
}  // namespace viper::cli
