// Engine lifecycle, the progress loop and the public API (which only queues commands).
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <fmt/format.h>

#include <ucs/debug/log_def.h>

#include "engine_impl.h"
#include "viper/log.h"

namespace viper::net {
namespace {

constexpr const char* kLog = "net";

// UCX settings the engine chooses unless the environment sets them, each with why. `key` is
// the name ucp_config_modify applies to the component (measured: it takes the name without the
// component prefix); `env` is how a user sets the same thing (UCX_<key> also counts).
struct UcxDefault {
  const char* key;
  const char* env;
  const char* value;
};
// (The listener, whose UCX_TCP_CM_REUSEADDR=y was a default here, is now the engine's own
// socket, bootstrap.h, which sets SO_REUSEADDR itself.)
constexpr std::array<UcxDefault, 3> kUcxDefaults{{
    // 256 KiB TCP segments instead of 8/64 KiB: UCX 1.13 gives endpoints with peer-failure handling
    // (which Viper needs: a dead peer must end its pending transfers) rendezvous put/get lanes only
    // on memory domains that can invalidate registrations, and TCP's cannot
    // (ucp_wireup_add_rma_bw_lanes); so over TCP rendezvous data moves as active-message
    // fragments of this size (docs/ARCHITECTURE.md, "The listener is Viper's own socket").
    // 600 MB across two namespaces: 207.9 ms transfer with the defaults, 166.2 ms with 256 KiB
    // (viper bench --hosts 2; the connection-manager endpoints of before: 151.5 ms).
    {"TX_SEG_SIZE", "UCX_TCP_TX_SEG_SIZE", "256K"},
    {"RX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", "256K"},
    // No zero-copy active messages: UCX 1.13's TCP transport completes a zero-copy send twice when
    // the socket's send fails before its receive has noticed a dead peer (uct_tcp_ep_sendv purges
    // the operation, then completes it again), and the assertion that catches it aborts the
    // process: a node whose peer was killed mid-transfer died with it (1 kill in 100-350 on
    // loopback). Copied fragments (into the 256 KiB segment) take that path out. Cost: none
    // measurable across namespaces (viper bench --hosts 2), about 15% of bulk throughput on
    // loopback (viper_net_bench; docs/BENCHMARKS.md "Host to host").
    // EngineTest.SenderOutlivesReceiversKilledMidTransfer aborted in 6 of 8 runs without it.
    // Over RDMA, rendezvous uses get/put on RMA lanes, whose zero-copy threshold UCX computes on
    // its own (ucp_ep_config_calc_rma_zcopy_thresh): only small eager messages are copied there.
    {"ZCOPY_THRESH", "UCX_ZCOPY_THRESH", "inf"},
}};
// Measured with viper_net_bench (600 MiB, 4 MiB chunks, 8 in flight; 2-vCPU VM) and not set:
// - TCP_SNDBUF/RCVBUF=4M: slower (fixed buffers switch off the kernel's autotuning, which grows
//   the receive buffer to tcp_rmem's 32 MiB maximum).
// - MAX_RNDV_RAILS=1: ~20% faster between processes of one host (UCX otherwise stripes over the
//   lo and eth0 lanes), neutral across veth; it would forfeit multi-rail on RDMA nodes.
// - MM_ERROR_HANDLING=y: lets same-host endpoints use shared memory for small messages despite
//   peer-failure mode, but their failure detection then relies on UCX keepalive, which needs a
//   progress call while this thread sleeps in epoll; TCP notices a dead peer by itself.
// - TCP congestion control: UCX 1.13 has no option; it follows the system or namespace default
//   (`sysctl net.ipv4.tcp_congestion_control`, or `ip route ... congctl cubic` per route).

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

// UCX's memory hooks (UCM patches mmap/munmap/madvise to keep its registration cache coherent)
// crash ThreadSanitizer builds (a dying thread's madvise re-enters TSan; libucm hooks it once loaded). UCX reads the switch
// when the library loads, so it must come from the environment: fail clearly instead of crashing.
Status CheckSanitizerEnvironment() {
  if (!kThreadSanitizer) return Status::OK();
  const char* events = std::getenv("UCX_MEM_EVENTS");
  std::string_view v = events == nullptr ? "" : events;
  if (v == "no" || v == "n" || v == "0" || v == "off") return Status::OK();
  return Status::FailedPrecondition(
      "ThreadSanitizer build: UCX memory hooks crash under TSan; run with UCX_MEM_EVENTS=no in the environment");
}

// UCX logs to stdout unless UCX_LOG_FILE says otherwise, and stdout carries the machine-readable
// output of the CLI (`viper watch --json`): a warning such as "unexpected tag-receive descriptor
// was not matched" (data of a transfer whose peer died, dropped with the worker) broke a JSON line
// in tests/xnode. Its messages go through Viper's logger (stderr) instead.
ucs_log_func_rc_t UcxLogToViper(const char* file, unsigned line, const char* /*function*/, ucs_log_level_t level,
                                const ucs_log_component_config_t* component, const char* format, va_list ap) {
  if (level > component->log_level) return UCS_LOG_FUNC_RC_STOP;
  char text[1024];
  std::vsnprintf(text, sizeof text, format, ap);
  const char* base = std::strrchr(file, '/');
  LogLevel viper_level = level <= UCS_LOG_LEVEL_ERROR  ? LogLevel::kError
                         : level <= UCS_LOG_LEVEL_WARN ? LogLevel::kWarn
                                                       : LogLevel::kDebug;
  log(viper_level, "ucx", "{} ({}:{})", text, base != nullptr ? base + 1 : file, line);
  return UCS_LOG_FUNC_RC_STOP;
}

void RouteUcxLog() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(UcxLogToViper); });
}

// Settings the peer-address check depends on (src/net/ucx_address.h), forced whatever the
// environment says: unified mode packs addresses without lengths, and debug info adds a worker
// name whose reading depends on the receiver's own setting. Neither can be validated.
constexpr std::array<std::pair<const char*, const char*>, 2> kUcxRequired{{
    {"UNIFIED_MODE", "n"},
    {"ADDRESS_DEBUG_INFO", "n"},
}};

Status ApplyUcxDefaults(ucp_config_t* config) {
  for (const UcxDefault& d : kUcxDefaults) {
    if (std::getenv(d.env) != nullptr || std::getenv(fmt::format("UCX_{}", d.key).c_str()) != nullptr) continue;
    ucs_status_t st = ucp_config_modify(config, d.key, d.value);
    if (st != UCS_OK) return detail::FromUcs(st, fmt::format("setting UCX option {}={}", d.env, d.value));
  }
  for (const auto& [key, value] : kUcxRequired) {
    ucs_status_t st = ucp_config_modify(config, key, value);
    if (st != UCS_OK) return detail::FromUcs(st, fmt::format("setting UCX option UCX_{}={}", key, value));
  }
  return Status::OK();
}

}  // namespace

namespace detail {

Status FromUcs(ucs_status_t status, std::string_view what) {
  std::string message = fmt::format("{}: {}", what, ucs_status_string(status));
  switch (status) {
    case UCS_ERR_CANCELED: return Status::Cancelled(std::move(message));
    case UCS_ERR_TIMED_OUT: return Status::Timeout(std::move(message));
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE: return Status::ResourceExhausted(std::move(message));
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_MESSAGE_TRUNCATED: return Status::InvalidArgument(std::move(message));
    case UCS_ERR_UNSUPPORTED: return Status::NotSupported(std::move(message));
    case UCS_ERR_BUSY:  // e.g. listening on a port in use
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_IO_ERROR: return Status::Unavailable(std::move(message));
    default: return Status::Internal(std::move(message));
  }
}

}  // namespace detail

// ---------------------------------------------------------------- command queue (any thread)

void Engine::Impl::Post(std::function<void()> fn) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(queue_mu);
    was_empty = queue.empty();
    queue.push_back(std::move(fn));
  }
  if (was_empty) Wake();
}

void Engine::Impl::Wake() {
  uint64_t one = 1;
  // EAGAIN means the counter is saturated, i.e. already signalled: nothing to do.
  while (write(wake_fd, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

bool Engine::Impl::IsLive(PeerId id) const {
  std::lock_guard<std::mutex> lock(live_mu);
  return live.count(id) != 0;
}

// ---------------------------------------------------------------- progress thread

Status Engine::Impl::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return detail::FromUcs(st, "reading the UCX configuration");
  Status applied = ApplyUcxDefaults(config);
  if (applied.ok()) {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.name = "viper";
    st = ucp_init(&params, config, &context);
  }
  ucp_config_release(config);
  VIPER_RETURN_IF_ERROR(applied);
  if (st != UCS_OK) return detail::FromUcs(st, "creating the UCX context");

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;  // only this thread touches UCX
  st = ucp_worker_create(context, &wparams, &worker);
  if (st != UCS_OK) return detail::FromUcs(st, "creating the UCX worker");
  VIPER_RETURN_IF_ERROR(RegisterAmHandlers());
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(worker, &address, &address_length);
  if (st != UCS_OK) return detail::FromUcs(st, "getting the UCX worker's address");
  const auto* first = reinterpret_cast<const std::byte*>(address);
  worker_address.assign(first, first + address_length);
  ucp_worker_release_address(worker, address);

  st = ucp_worker_get_efd(worker, &worker_fd);
  if (st != UCS_OK) return detail::FromUcs(st, "getting the UCX worker's event fd");
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return Status::FromErrno("epoll_create1 for the UCX progress thread");
  for (int fd : {worker_fd, wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl(ADD)");
  }
  if (!options.listen.empty()) VIPER_RETURN_IF_ERROR(CreateListener(options.listen));
  return Status::OK();
}

void Engine::Impl::Run() {
  Clock::time_point last_activity = Clock::now();
  while (!stop_requested.load(std::memory_order_acquire)) {
    bool active = RunCommands();
    active |= Progress();
    Clock::time_point now = Clock::now();
    CheckDeadlines(now);
    CheckLiveness(now);
    if (active) {
      last_activity = now;
    } else if (now - last_activity >= options.spin) {
      WaitForEvents(now, -1);
    } else {
      // Spinning: let a thread waiting for this core (e.g. the one our completion just woke) run
      // first; on a small, busy machine a plain spin delays exactly the thread we wait for.
      sched_yield();
    }
  }
  RunCommands();  // what was queued before the destructor ran still starts, then is cancelled
  Progress();
  Shutdown();
}

bool Engine::Impl::RunCommands() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(queue_mu);
    if (queue.empty()) return false;
    batch.swap(queue);
  }
  for (auto& fn : batch) fn();
  return true;
}

// Progresses UCX until it has nothing more to do, then runs what its callbacks deferred.
bool Engine::Impl::Progress() {
  bool any = false;
  while (ucp_worker_progress(worker) != 0) any = true;
  while (!deferred.empty() || !rndv_pending.empty()) {
    std::vector<std::function<void()>> batch;
    batch.swap(deferred);
    for (auto& fn : batch) fn();
    FetchRendezvous();
    any = true;
  }
  return any;
}

void Engine::Impl::WaitForEvents(Clock::time_point now, int max_timeout_ms) {
  ucs_status_t st = ucp_worker_arm(worker);
  if (st == UCS_ERR_BUSY) return;  // events arrived meanwhile: progress again
  int timeout = EpollTimeoutMs(now);
  if (st != UCS_OK) {
    log(LogLevel::kError, kLog, "ucp_worker_arm failed ({}); polling every millisecond", ucs_status_string(st));
    timeout = 1;
  }
  if (max_timeout_ms >= 0 && (timeout < 0 || timeout > max_timeout_ms)) timeout = max_timeout_ms;
  epoll_event events[2];
  int n = epoll_wait(epoll_fd, events, 2, timeout);
  wakeups.fetch_add(1, std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd != wake_fd) continue;
    uint64_t count;
    while (read(wake_fd, &count, sizeof(count)) < 0 && errno == EINTR) {
    }
  }
}

int Engine::Impl::EpollTimeoutMs(Clock::time_point now) const {
  Clock::time_point next = Clock::time_point::max();
  if (PeerChecksOn() && peer_count.load(std::memory_order_relaxed) > 0) next = next_liveness_check;
  if (connecting != 0 || closing != 0) {
    for (const auto& [id, peer] : peers) {
      if (peer->connect) next = std::min(next, peer->connect_deadline);
      if (peer->closing()) next = std::min(next, peer->close_deadline);
    }
  }
  if (next == Clock::time_point::max()) return -1;
  if (next <= now) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::min<int64_t>(ms, 60'000));
}

void Engine::Impl::CheckDeadlines(Clock::time_point now) {
  if (connecting == 0 && closing == 0) return;
  std::vector<PeerId> connect_expired, close_expired;
  for (const auto& [id, peer] : peers) {
    if (peer->connect && peer->connect_deadline <= now) connect_expired.push_back(id);
    if (peer->closing() && peer->close_deadline <= now) close_expired.push_back(id);
  }
  for (PeerId id : connect_expired) {
    Status reason = Status::Timeout(fmt::format("connect to {}: no answer within {} ms", FindPeer(id)->address,
                                                options.connect_timeout.count()));
    ClosePeer(id, reason, /*notify=*/false, /*graceful=*/false);
  }
  for (PeerId id : close_expired) FinishClose(id);
}

void Engine::Impl::Heard(PeerId id) {
  if (!LivenessOn()) return;
  if (detail::Peer* peer = FindPeer(id)) peer->heard = Clock::now();
}

// Runs a few times per peer_silence or transfer_stall (not on every loop turn: a node may have
// thousands of peers). A ping waits behind what is already queued to the peer; a bulk send
// completing meanwhile, or anything the peer sends, counts as its answer.
void Engine::Impl::CheckLiveness(Clock::time_point now) {
  if (!PeerChecksOn() || now < next_liveness_check) return;
  auto period = std::chrono::milliseconds::max();
  if (LivenessOn()) period = std::min(options.peer_silence, options.peer_answer);
  if (TransferStallOn()) period = std::min(period, options.transfer_stall);
  next_liveness_check = now + std::max(std::chrono::milliseconds(10), period / 4);
  std::vector<PeerId> silent;
  std::vector<PeerId> stalled;
  for (auto& [id, peer] : peers) {
    if (!peer->open()) continue;
    if (TransferStallOn() && peer->bulk_ops > 0 && now - peer->bulk_progress >= options.transfer_stall) {
      stalled.push_back(id);
      continue;
    }
    if (!LivenessOn()) continue;
    if (peer->pinged != Clock::time_point{} && peer->heard >= peer->pinged) peer->pinged = {};
    if (peer->pinged == Clock::time_point{}) {
      if (now - peer->heard < options.peer_silence) continue;
      peer->pinged = now;
      SendAm(*peer, detail::kPingAm, nullptr, nullptr);
    } else if (now - peer->pinged >= options.peer_answer) {
      silent.push_back(id);
    }
  }
  for (PeerId id : stalled) {
    detail::Peer* peer = FindPeer(id);
    if (peer == nullptr || !peer->open()) continue;
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - peer->bulk_progress).count();
    Status reason = Status::Unavailable(fmt::format(
        "peer {} ({}) completed none of the {} bulk transfer(s) pending with it for {} ms (it does not take the "
        "bytes it asked for, or does not send those it announced)", id, peer->address, peer->bulk_ops, waited));
    log(LogLevel::kWarn, kLog, "{}: closing it", reason.message());
    peers_stalled.fetch_add(1, std::memory_order_relaxed);
    ClosePeer(id, reason, /*notify=*/true, /*graceful=*/false);
  }
  for (PeerId id : silent) {
    detail::Peer* peer = FindPeer(id);
    if (peer == nullptr || !peer->open()) continue;
    if (handlers.on_peer_silent && !handlers.on_peer_silent(id)) {  // kept: a new period of silence starts
      if ((peer = FindPeer(id)) != nullptr) {
        peer->heard = now;
        peer->pinged = {};
      }
      continue;
    }
    auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - peer->heard).count();
    Status reason = Status::Unavailable(fmt::format(
        "peer {} ({}) sent nothing for {} ms and did not answer a ping within {} ms (its host down or cut off, or "
        "the process frozen)",
        id, peer->address, quiet, options.peer_answer.count()));
    log(LogLevel::kWarn, kLog, "{}: closing it", reason.message());
    peers_silent.fetch_add(1, std::memory_order_relaxed);
    ClosePeer(id, reason, /*notify=*/true, /*graceful=*/false);
  }
}

// Closes every peer (flushing sends for at most close_timeout), completes every pending
// operation, and releases UCX. Commands queued meanwhile still run: they find no peer and fail.
void Engine::Impl::Shutdown() {
  stopping = true;
  acceptor.reset();  // no new peers; joins its thread (which gives up waiting on us: stop_requested)
  std::vector<PeerId> ids;
  for (const auto& [id, peer] : peers) ids.push_back(id);
  for (PeerId id : ids) {
    ClosePeer(id, Status::Cancelled("engine shutting down"), /*notify=*/false, /*graceful=*/true);
  }
  Clock::time_point hard_deadline = Clock::now() + options.close_timeout + std::chrono::seconds(2);
  while (true) {
    bool active = RunCommands();
    active |= Progress();
    Clock::time_point now = Clock::now();
    CheckDeadlines(now);
    bool queue_empty;
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      queue_empty = queue.empty();
    }
    if (peers.empty() && outstanding == 0 && queue_empty && deferred.empty()) break;
    if (now >= hard_deadline) {
      log(LogLevel::kWarn, kLog, "shutdown: {} UCX requests and {} endpoints still pending after {} ms; releasing",
          outstanding.load(), peers.size(), options.close_timeout.count() + 2000);
      break;
    }
    if (!active) WaitForEvents(now, 10);
  }
  ReleaseUcx();
  CompleteAbandonedOps();
}

// After the hard deadline: the worker is gone, so no callback will ever run for what peers still
// list; UCX no longer touches their buffers either. Each such op completes here, once, with the
// reason stamped on it (or Cancelled), as the contract promises.
void Engine::Impl::CompleteAbandonedOps() {
  for (auto& [id, peer] : peers) {
    std::unordered_map<void*, detail::Op*> ops;
    ops.swap(peer->ops);
    for (auto& [request, op] : ops) {
      op->request = nullptr;  // released with the worker; Untrack has nothing to do
      if (op->is_recv) {
        OnRecvDone(static_cast<detail::RecvOp*>(op), UCS_ERR_CANCELED, 0);
      } else {
        OnSendDone(static_cast<detail::SendOp*>(op), UCS_ERR_CANCELED);
      }
    }
  }
  peers.clear();
  by_ep.clear();
}

void Engine::Impl::ReleaseUcx() {
  acceptor.reset();
  if (worker != nullptr) ucp_worker_destroy(worker);
  if (context != nullptr) ucp_cleanup(context);
  if (epoll_fd >= 0) close(epoll_fd);
  worker = nullptr;
  context = nullptr;
  epoll_fd = -1;
}

// ---------------------------------------------------------------- public API

Result<std::unique_ptr<Engine>> Engine::Start(const EngineOptions& options, EngineHandlers handlers) {
  if (!options.listen.empty()) {
    Result<std::pair<std::string, uint16_t>> parsed = ParseHostPort(options.listen);
    if (!parsed.ok()) return parsed.status().WithContext("engine listen address");
  }
  if (options.peer_silence.count() < 0 || (options.peer_silence.count() > 0 && options.peer_answer.count() <= 0))
    return Status::InvalidArgument(fmt::format(
        "engine peer_silence must be >= 0 ms (0: no pings), and peer_answer > 0 ms with it; got {} and {} ms",
        options.peer_silence.count(), options.peer_answer.count()));
  if (options.transfer_stall.count() < 0)
    return Status::InvalidArgument(fmt::format("engine transfer_stall must be >= 0 ms (0: never); got {} ms",
                                               options.transfer_stall.count()));
  VIPER_RETURN_IF_ERROR(CheckSanitizerEnvironment());  // before any thread exists
  RouteUcxLog();
  auto impl = std::make_unique<Impl>(options, std::move(handlers));
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) return Status::FromErrno("eventfd for the engine's command queue");
  std::promise<Status> ready;
  std::future<Status> started = ready.get_future();
  Impl* p = impl.get();
  impl->thread = std::thread([p, ready = std::move(ready)]() mutable {
    p->progress_thread_id.store(std::this_thread::get_id());
    pthread_setname_np(pthread_self(), "viper-ucx");
    Status st = p->Init();
    if (!st.ok()) p->ReleaseUcx();
    ready.set_value(st);
    if (st.ok()) p->Run();
  });
  Status st = started.get();
  if (!st.ok()) {
    impl->thread.join();
    close(impl->wake_fd);
    return st;
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  Stop();
  close(impl_->wake_fd);
}

void Engine::Stop() {
  if (impl_->OnProgressThread()) {
    log(LogLevel::kError, kLog, "Engine stopped from its own progress thread (inside a handler): aborting");
    std::abort();
  }
  if (!impl_->thread.joinable()) return;
  impl_->stop_requested.store(true, std::memory_order_release);
  impl_->Wake();
  impl_->thread.join();
}

bool Engine::OnProgressThread() const { return impl_->OnProgressThread(); }

std::string Engine::listen_address() const { return impl_->listen_address; }

Result<PeerId> Engine::Connect(const std::string& host_port) {
  if (impl_->OnProgressThread()) {
    return Status::FailedPrecondition(fmt::format(
        "connect to {}: Engine::Connect blocks and was called on the progress thread (from a handler)", host_port));
  }
  Result<std::pair<std::string, uint16_t>> parsed = ParseHostPort(host_port);
  if (!parsed.ok()) return parsed.status().WithContext("connect");
  Result<std::vector<detail::SockAddr>> addr = detail::ResolveAll(parsed->first, parsed->second);
  if (!addr.ok()) return addr.status().WithContext(fmt::format("connect to {}", host_port));
  Impl* p = impl_.get();
  // The worker addresses are exchanged here, on the caller's thread (bootstrap.h); the endpoint
  // and its handshake are the progress thread's.
  VIPER_ASSIGN_OR_RETURN(std::vector<std::byte> node_address,
                         detail::ExchangeWorkerAddresses(*addr, p->options.token, p->worker_address,
                                                         Clock::now() + p->options.connect_timeout,
                                                         fmt::format("connect to {}", host_port)));
  auto waiter = std::make_shared<std::promise<Result<PeerId>>>();
  std::future<Result<PeerId>> result = waiter->get_future();
  p->Post([p, host_port, node_address = std::move(node_address), waiter] { p->StartConnect(host_port, node_address, waiter); });
  // The progress thread enforces connect_timeout; the margin only guards against a stuck thread.
  if (result.wait_for(p->options.connect_timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    return Status::Timeout(fmt::format("connect to {}: the engine's progress thread did not answer", host_port));
  }
  return result.get();
}

Status Engine::Send(PeerId peer, std::span<const std::byte> message) {
  if (!impl_->IsLive(peer)) return Status::NotFound(fmt::format("send to peer {}: not connected", peer));
  auto copy = std::make_shared<const std::vector<std::byte>>(message.begin(), message.end());
  Impl* p = impl_.get();
  p->Post([p, peer, copy] { p->DoSend(peer, copy, nullptr); });
  return Status::OK();
}

Status Engine::SendAndWait(PeerId peer, std::span<const std::byte> message, std::chrono::milliseconds timeout) {
  if (impl_->OnProgressThread()) {
    return Status::FailedPrecondition(fmt::format(
        "send to peer {}: Engine::SendAndWait blocks and was called on the progress thread (from a handler)", peer));
  }
  if (!impl_->IsLive(peer)) return Status::NotFound(fmt::format("send to peer {}: not connected", peer));
  auto copy = std::make_shared<const std::vector<std::byte>>(message.begin(), message.end());
  auto sent = std::make_shared<std::promise<Status>>();
  std::future<Status> result = sent->get_future();
  Impl* p = impl_.get();
  p->Post([p, peer, copy, sent] { p->DoSend(peer, copy, [sent](const Status& st) { sent->set_value(st); }); });
  if (result.wait_for(timeout) != std::future_status::ready) {
    return Status::Timeout(fmt::format("send to peer {}: not completed within {} ms", peer, timeout.count()));
  }
  return result.get();
}

void Engine::SendBulk(PeerId peer, uint64_t tag, std::span<const std::byte> bytes, Completion done) {
  Impl* p = impl_.get();
  p->Post([p, peer, tag, bytes, done = std::move(done)]() mutable { p->DoSendBulk(peer, tag, bytes, std::move(done)); });
}

void Engine::RecvBulk(PeerId peer, uint64_t tag, std::span<std::byte> buffer, Completion done) {
  Impl* p = impl_.get();
  p->Post([p, peer, tag, buffer, done = std::move(done)]() mutable { p->DoRecvBulk(peer, tag, buffer, std::move(done)); });
}

void Engine::Disconnect(PeerId peer) {
  Impl* p = impl_.get();
  p->Post([p, peer] {
    p->ClosePeer(peer, Status::Cancelled(fmt::format("peer {}: disconnected by this process", peer)),
                 /*notify=*/false, /*graceful=*/true);
  });
}

void Engine::Post(std::function<void()> fn) { impl_->Post(std::move(fn)); }

Engine::Stats Engine::stats() const {
  Stats s;
  s.wakeups = impl_->wakeups.load(std::memory_order_relaxed);
  s.messages_in = impl_->messages_in.load(std::memory_order_relaxed);
  s.messages_out = impl_->messages_out.load(std::memory_order_relaxed);
  s.peers = impl_->peer_count.load(std::memory_order_relaxed);
  s.requests_pending = impl_->outstanding.load(std::memory_order_relaxed);
  s.peers_silent = impl_->peers_silent.load(std::memory_order_relaxed);
  s.peers_stalled = impl_->peers_stalled.load(std::memory_order_relaxed);
  if (const auto& c = impl_->acceptor_counters) {
    s.handshakes_refused_token = c->auth.load(std::memory_order_relaxed);
    s.handshakes_timed_out = c->timed_out.load(std::memory_order_relaxed);
    s.handshakes_evicted = c->evicted.load(std::memory_order_relaxed);
    s.handshakes_malformed = c->malformed.load(std::memory_order_relaxed);
    s.handshakes_refused = s.handshakes_refused_token + s.handshakes_timed_out + s.handshakes_evicted + s.handshakes_malformed;
  }
  return s;
}

}  // namespace viper::net
