// `viper bench --hosts 2`: the raw wire between the two hosts, measured in the same run as Viper's
// figures: a plain TCP stream (viper_wire_baseline: cubic, 4 MiB buffers, large writes), the same
// stream landed in a snapshot-sized buffer and landed + hashed (the verified-receive ceiling), and
// UCX's own tag_bw (ucx_perftest, TCP transport), each for one message of the snapshot size, from
// this host (h1, the producer's) to the consumer's (h2).
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <thread>

#include "harness/child.h"
#include "harness/measure.h"

namespace viper::bench {
namespace {

using std::chrono::milliseconds;

std::vector<std::string> InPeerHost(const Config& c, std::vector<std::string> argv) {
  std::vector<std::string> full = c.consumer_prefix;
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

// Streams one RunTcp moves: the timed ones and one warm-up.
int TcpStreams(const Config& c) { return std::max(c.reps, 3) + 1; }

Status RunTcp(const Config& c, uint64_t bytes, const std::string& sink, std::vector<double>& gbps_all, std::string* cc) {
  TcpEnds ends{c.wire_bin, c.log_path, c.consumer_prefix, c.peer_ip.empty() ? "127.0.0.1" : c.peer_ip, {}};
  return MeasureTcpStream(ends, bytes, TcpStreams(c) - 1, sink, gbps_all, cc);
}

// ucx_perftest prints a "Final:" row: iterations, latency columns, then bandwidth (MB/s = MiB/s)
// average and overall.
Result<double> ParseUcxFinal(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("Final:")) continue;
    std::istringstream cols(line.substr(6));
    double v[6] = {};
    for (double& x : v) cols >> x;
    if (!cols) return Status::Corruption("ucx_perftest Final row not understood: " + line);
    return v[5] * 1048576.0 / 1e9;
  }
  return Status::Corruption("ucx_perftest printed no Final row: " + out.substr(0, 400));
}

// peer_failure: both sides with `-e` (endpoints with peer-failure handling).
Status RunUcx(const Config& c, uint64_t bytes, bool peer_failure, std::vector<double>& gbps_all) {
  UcxRun run;
  run.bytes = bytes;
  run.iters = bytes > (256u << 20) ? std::max(c.reps, 3) : 10;
  run.peer_failure = peer_failure;
  VIPER_ASSIGN_OR_RETURN(double gbps, UcxTagBw(c, run));
  gbps_all.push_back(gbps);
  return Status::OK();
}

}  // namespace

Status MeasureTcpStream(const TcpEnds& ends, uint64_t bytes, int reps, const std::string& sink,
                        std::vector<double>& gbps_all, std::string* cc) {
  std::vector<std::string> argv = ends.server_prefix;
  argv.insert(argv.end(), {ends.wire_bin, "server", "--listen", ends.server_ip + ":0", "--clients", std::to_string(reps + 1), "--json"});
  if (!sink.empty()) argv.push_back(sink);
  auto server = LineChild::Start(argv, ends.log_path);
  if (!server.ok()) return server.status();
  VIPER_ASSIGN_OR_RETURN(std::string listening, (*server)->ReadLine(milliseconds(20000)));
  if (!listening.starts_with("listening ")) return Status::Internal("wire baseline server printed: " + listening);
  std::vector<std::string> client = ends.client_prefix;
  client.insert(client.end(), {ends.wire_bin, "client", "--connect", listening.substr(10), "--bytes", std::to_string(bytes),
                               "--repeat", std::to_string(reps), "--warmup", "1", "--json"});
  VIPER_ASSIGN_OR_RETURN(std::string out, RunCapture(client, milliseconds(600000), ends.log_path));
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded()) return Status::Corruption("viper_wire_baseline printed non-JSON: " + out);
  for (const auto& g : j.value("gbps_all", nlohmann::json::array())) gbps_all.push_back(g.get<double>());
  if (cc != nullptr) *cc = j.value("cc", "");
  (*server)->Stop();
  return Status::OK();
}

Result<double> TcpStreamGbps(const Config& c, uint64_t bytes, const std::string& sink) {
  std::vector<double> all;
  VIPER_RETURN_IF_ERROR(RunTcp(c, bytes, sink, all, nullptr));
  if (all.empty()) return Status::Internal("viper_wire_baseline measured no stream of " + std::to_string(bytes) + " bytes");
  return Median(all);
}

Result<double> UcxTagBw(const Config& c, const UcxRun& run) {
  std::string port = std::to_string(20000 + ::getpid() % 20000 + (run.peer_failure ? 1 : 0));
  if (c.consumer_prefix.empty()) {  // the server runs on this host
    VIPER_ASSIGN_OR_RETURN(uint16_t free_port, FreeTcpPort());
    port = std::to_string(free_port);
  }
  auto perftest = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{"env", "UCX_TLS=tcp"};
    if (run.viper_segments)
      argv.insert(argv.end(), {"UCX_TCP_TX_SEG_SIZE=256K", "UCX_TCP_RX_SEG_SIZE=256K", "UCX_ZCOPY_THRESH=inf"});
    argv.push_back("ucx_perftest");
    argv.insert(argv.end(), args.begin(), args.end());
    if (run.peer_failure) argv.push_back("-e");
    return argv;
  };
  auto server = LineChild::Start(InPeerHost(c, perftest({"-p", port})), c.log_path);
  if (!server.ok()) return server.status();
  const std::string host = c.peer_ip.empty() ? "127.0.0.1" : c.peer_ip;
  Result<std::string> out = Status::Unavailable("not run");
  for (int attempt = 0; attempt < 20; ++attempt) {  // the server needs a moment to listen
    std::this_thread::sleep_for(milliseconds(250));
    out = RunCapture(perftest({host, "-p", port, "-t", "tag_bw", "-s", std::to_string(run.bytes), "-n",
                               std::to_string(run.iters), "-w", "1"}),
                     milliseconds(600000), c.log_path);
    if (out.ok()) break;
  }
  (*server)->Stop(milliseconds(2000));
  if (!out.ok()) return out.status().WithContext("ucx_perftest tag_bw of " + std::to_string(run.bytes) + " bytes");
  return ParseUcxFinal(*out);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void RunWire(const Config& c, uint64_t bytes, WireResult& w) {
  w.ran = true;
  w.ucx_tls = "tcp";
  // Each stream run also gives the machine's busy CPU per GB streamed (every CPU, both ends, both
  // namespaces): what the wire alone costs, beside what a Viper update costs (ModeResult::machine_busy).
  auto tcp = [&](const std::string& sink, std::vector<double>& all, std::string* cc, double* cpu_s_per_gb) {
    const double busy0 = MachineBusyCpuSeconds();
    Status st = RunTcp(c, bytes, sink, all, cc);
    if (cpu_s_per_gb != nullptr)
      *cpu_s_per_gb = (MachineBusyCpuSeconds() - busy0) / (TcpStreams(c) * static_cast<double>(bytes) / 1e9);
    return st;
  };
  const std::pair<const char*, Status> runs[] = {  // run in this order (list-initialization)
      {"tcp stream", tcp("", w.tcp_all, &w.tcp_cc, &w.tcp_cpu_s_per_gb)},
      {"tcp stream --land", tcp("--land", w.landed_all, nullptr, nullptr)},
      {"tcp stream --verify", tcp("--verify", w.verified_all, nullptr, &w.verified_cpu_s_per_gb)},
      {"ucx_perftest", RunUcx(c, bytes, /*peer_failure=*/false, w.ucx_all)},
      {"ucx_perftest -e", RunUcx(c, bytes, /*peer_failure=*/true, w.ucx_peer_all)},
  };
  for (const auto& [what, st] : runs)
    if (!st.ok()) w.error += std::string(what) + ": " + st.message() + "; ";
  w.tcp_gbps = Median(w.tcp_all);
  w.tcp_best_gbps = w.tcp_all.empty() ? 0 : *std::max_element(w.tcp_all.begin(), w.tcp_all.end());
  w.ucx_gbps = Median(w.ucx_all);
  w.ucx_peer_gbps = Median(w.ucx_peer_all);
  w.landed_gbps = Median(w.landed_all);
  w.verified_gbps = Median(w.verified_all);
}

}  // namespace viper::bench
