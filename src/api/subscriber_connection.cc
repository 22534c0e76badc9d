// Subscriber: the connection to a node (announcements, (re)connect, alternates) and the loop that
// loads each announced version.
#include "viper/subscriber.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "seal.h"
#include "store/file_tier.h"
#include "store/host_tier.h"
#include "subscriber_impl.h"
#include "viper/log.h"
#include "viper/node.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "subscriber";

// A device-only NOTIFY (Node::AnnounceDevice): the version's only replica is the producer's GPU copy.
bool IsDeviceOnly(const proto::VersionInfo& info) {
  return !info.replicas.empty() && std::all_of(info.replicas.begin(), info.replicas.end(), [](const proto::Replica& r) {
    return r.kind == proto::ReplicaKind::kDevice;
  });
}
}  // namespace

void Subscriber::Impl::OnAnnounce(const proto::VersionInfo& info, bool incoming, const std::string& holder) {
  std::lock_guard<std::mutex> lock(mu);
  stats.notifies++;
  if (info.model != options.model) return;
  if (Status sealed = internal::CheckSeal(options.token, info, "node " + (holder.empty() ? node_address : holder));
      !sealed.ok()) {
    log(LogLevel::kWarn, kLog, "skipped: {}", sealed.message());
    return;
  }
  const bool device_only = IsDeviceOnly(info);
  // The host tier's NOTIFY of a version announced device-only: kept, so that the version comes
  // through the host path if the device copy cannot be opened (or could not: failed already).
  if (!incoming && !device_only && announced_device_only && announced && announced->version == info.version) {
    announced = info;
    announced_device_only = false;
    if (failed_version == info.version) failed_version = 0;
    cv.notify_all();
    return;
  }
  // A version whose pipelined load failed is loaded again once its node has it complete.
  bool retry = !incoming && announced_incoming && announced && announced->version == info.version &&
               failed_version == info.version;
  if (announced && announced->version >= info.version && !retry) return;
  auto current = live.load();
  // Superseded before its load started (one being loaded counts as skipped only if it then fails).
  if (announced && announced->version < info.version && announced->version != loading_version &&
      (!current || announced->version > current->version()))
    stats.skipped++;
  if (retry) failed_version = 0;
  announced = info;
  announced_incoming = incoming;
  announced_device_only = device_only;
  announced_ns = WallClockNs();
  cv.notify_all();
}

ClientOptions Subscriber::Impl::ClientOptionsFor(const std::string& node) const {
  ClientOptions co;
  co.connect = node;
  co.token = options.token;
  co.name = options.name;
  co.timeout = options.request_timeout;
  co.chunk_bytes = options.chunk_bytes;
  return co;
}

ClientHandlers Subscriber::Impl::HandlersFor(std::shared_ptr<std::atomic<bool>> current) {
  ClientHandlers handlers;
  // A connection may outlive this subscriber (a mapped version handed out holds it, with its
  // lease): its handlers reach the subscriber only while it exists, and only while it is the
  // subscriber's connection (one left for the preferred node still hears its old node).
  std::weak_ptr<Impl> self = weak_from_this();
  handlers.on_notify = [self, current](const proto::VersionInfo& info) {
    if (auto impl = self.lock(); impl && *current) impl->OnAnnounce(info, false);
  };
  handlers.on_incoming = [self, current](const proto::VersionInfo& info) {
    if (auto impl = self.lock(); impl && *current) impl->OnAnnounce(info, true);
  };
  handlers.on_disconnect = [self, current](const Status& why) {
    auto impl = self.lock();
    if (!impl || !*current) return;
    log(LogLevel::kWarn, kLog, "{}", why.message());
    std::lock_guard<std::mutex> lock(impl->mu);
    impl->cv.notify_all();
  };
  return handlers;
}

// Subscribes on a fresh connection and makes it this subscriber's; the one it replaces stops
// delivering announcements.
Result<std::shared_ptr<Client>> Subscriber::Impl::Adopt(std::unique_ptr<Client> fresh, const std::string& address,
                                                         std::shared_ptr<std::atomic<bool>> current) {
  std::shared_ptr<Client> shared(std::move(fresh));
  // Versions still arriving at the node are worth fetching only over the network (a consumer on
  // the node's host maps complete versions).
  bool pipelined = options.pipelined && (!shared->same_host() || options.path == FetchPath::kRemote);
  // A GPU consumer on the producer's host takes versions from the device copy as soon as it is live.
  bool early = options.gpu_early && options.gpu_device >= 0 && shared->same_host();
  VIPER_RETURN_IF_ERROR(shared->Subscribe(options.model, static_cast<uint8_t>((pipelined ? proto::kSubscribeIncoming : 0) |
                                                                              (early ? proto::kSubscribeDevice : 0))));
  std::unique_ptr<Client> stale_probe;  // a probe's connection, superseded by this one; closed after the lock
  std::lock_guard<std::mutex> lock(mu);
  stale_probe = std::move(probed);
  if (client_current) *client_current = false;
  if (client && poisoned_buffer) retired_buffers.emplace_back(client, std::move(poisoned_buffer));
  client = shared;
  client_current = std::move(current);
  node_address = address;
  return shared;
}

Result<std::shared_ptr<Client>> Subscriber::Impl::EnsureClient() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (client && client->connected()) return client;
  }
  auto current = std::make_shared<std::atomic<bool>>(true);
  ClientHandlers handlers = HandlersFor(current);
  // The configured node first, then the alternates, in order (with a registry: the node it
  // named, then the nearest other holders).
  Result<std::unique_ptr<Client>> fresh = Status::Unavailable("no node to connect to");
  std::string address;
  std::string silent;  // a node the liveness probe just gave up on: tried last, this round only
  {
    std::lock_guard<std::mutex> lock(mu);
    silent = std::exchange(silent_node, "");
  }
  if (options.choose_node) {
    std::string unreachable;
    {
      std::lock_guard<std::mutex> lock(mu);
      unreachable = silent.empty() ? chosen_unreachable : silent;
    }
    auto chosen = options.choose_node(unreachable);
    fresh = chosen.ok() ? Client::Connect(ClientOptionsFor(address = *chosen), handlers) : Result<std::unique_ptr<Client>>(chosen.status());
    std::lock_guard<std::mutex> lock(mu);
    chosen_unreachable = chosen.ok() && !fresh.ok() ? address : "";
  } else if (registry) {
    fresh = ConnectViaRegistry(handlers, &address, silent);
  } else {
    std::vector<std::string> order{options.connect};
    order.insert(order.end(), options.alternates.begin(), options.alternates.end());
    // A silent node's connect would wait out the connect timeout: the others first.
    if (auto at = std::find(order.begin(), order.end(), silent); at != order.end()) std::rotate(at, at + 1, order.end());
    for (size_t i = 0; i < order.size(); ++i) {
      address = order[i];
      fresh = Client::Connect(ClientOptionsFor(address), handlers);
      if (fresh.ok()) break;
      if (i + 1 < order.size() && !unreachable_reported)
        log(LogLevel::kWarn, kLog, "{}; trying {}", fresh.status().message(), order[i + 1]);
    }
  }
  Result<std::shared_ptr<Client>> adopted =
      fresh.ok() ? Adopt(std::move(fresh).value(), address, std::move(current)) : Result<std::shared_ptr<Client>>(fresh.status());
  if (!adopted.ok()) {
    bool first;
    {
      std::lock_guard<std::mutex> lock(mu);
      stats.connect_failures++;
      first = !unreachable_reported;
      unreachable_reported = true;
    }
    if (first && options.wait_for_node)
      log(LogLevel::kWarn, kLog, "{}: {}; retrying (backoff up to {} ms)", options.model, adopted.status().message(),
          options.reconnect_max.count());
    ReportConnection("");
    return adopted.status();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    unreachable_reported = false;
  }
  ReportConnection(address);
  return adopted;
}

// Tells options.on_connection, once per change of node.
void Subscriber::Impl::ReportConnection(const std::string& node) {
  SubscriberStats now;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (reported_node && *reported_node == node) return;
    reported_node = node;
    now = stats;
  }
  bool preferred = !registry && !node.empty() && (options.choose_node || node == options.connect);
  if (!node.empty())
    log(LogLevel::kInfo, kLog, "{}: subscribed through {}{}", options.model, node,
        registry || preferred ? "" : " (an alternate; " + options.connect + " is tried every " +
                                         std::to_string(options.preferred_probe.count()) + " ms)");
  if (options.on_connection) options.on_connection(node, preferred, now);
}

void Subscriber::Impl::ProbePreferredLater() {
  if (probe_in_flight || probed || !prober) return;
  probe_in_flight = true;
  prober->Post([this] {
    // The subscriber outlives its prober (Close closes it), so `this` is safe here.
    auto current = std::make_shared<std::atomic<bool>>(true);
    auto fresh = Client::Connect(ClientOptionsFor(options.connect), HandlersFor(current));
    std::lock_guard<std::mutex> lock(mu);
    probe_in_flight = false;
    if (!fresh.ok() || closing) return;  // still away: quiet, probed again later
    probed = std::move(fresh).value();
    probed_current = std::move(current);
    cv.notify_all();
  });
}

// Moves back to options.connect through the connection a probe made. Called between versions
// only, so that the move never cuts a load.
void Subscriber::Impl::AdoptProbed() {
  std::unique_ptr<Client> fresh;
  std::shared_ptr<std::atomic<bool>> current;
  {
    std::lock_guard<std::mutex> lock(mu);
    fresh = std::move(probed);
    current = std::move(probed_current);
  }
  if (!fresh) return;
  auto adopted = Adopt(std::move(fresh), options.connect, std::move(current));
  if (!adopted.ok()) return;  // e.g. it went away again: probed again later
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.preferred_returns++;
  }
  log(LogLevel::kInfo, kLog, "{}: {} is back; moving to it from the alternate", options.model, options.connect);
  ReportConnection(options.connect);
}

void Subscriber::Impl::CheckLiveness() {
  std::shared_ptr<Client> c;
  {
    std::lock_guard<std::mutex> lock(mu);
    c = client;
  }
  if (!c || !c->connected() || c->silent_for() < options.liveness_probe) return;
  Status answered = c->Ping(options.liveness_timeout);
  if (answered.ok() || !c->connected()) return;  // alive, or its loss is being handled already
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.liveness_failures++;
    silent_node = c->address();
  }
  log(LogLevel::kWarn, kLog, "{}: node {} silent for {} ms and did not answer a probe ({}); reconnecting", options.model,
      c->address(), c->silent_for().count(), answered.message());
  DropClient(c);
  ReportConnection("");
}

void Subscriber::Impl::DropClient(const std::shared_ptr<Client>& broken) {
  std::lock_guard<std::mutex> lock(mu);
  if (client == broken) client.reset();
}

// Predicted time of each usable path (bytes / bandwidth + latency), cheapest first.

void Subscriber::Impl::Run() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    auto current = live.load();
    uint64_t live_version = current ? current->version() : 0;
    auto ready = [&] {
      return closing || (announced && announced->version > live_version && announced->version != failed_version);
    };
    WaitConnected(lock, ready);
    if (closing) return;
    proto::VersionInfo info = *announced;
    int64_t notified = announced_ns;
    const bool device_only = announced_device_only;
    const bool incoming = announced_incoming;
    loading_version = info.version;
    lock.unlock();

    auto loaded = device_only && gpu ? LoadDeviceOnly(info) : Load(info);
    if (loaded.ok() && gpu && !(*loaded)->device) {
      if (Status st = PlaceOnDevice(**loaded, info); !st.ok()) loaded = st.WithContext("placing it on GPU " + std::to_string(options.gpu_device));
    }
    lock.lock();
    loading_version = 0;
    if (!loaded.ok() && loaded.status().code() == StatusCode::kNotFound && announced &&
        announced->version > info.version) {
      // Retired at the node while we fetched it, and a newer version is announced: a skip, not a
      // failure (a consumer slower than the publishes sees these; the newer one is loaded next).
      stats.skipped++;
      failed_version = info.version;
      failed_awaits_complete = false;
      log(LogLevel::kInfo, kLog, "{} version {} skipped: {}; version {} replaces it", options.model, info.version,
          loaded.status().message(), announced->version);
      continue;
    }
    if (!loaded.ok()) {
      stats.fetch_failures++;
      last_error = loaded.status();
      // Wait for a newer NOTIFY (or a reconnect) before retrying; a device-only version whose host
      // NOTIFY came meanwhile is retried through the host path at once.
      if (!(device_only && announced && announced->version == info.version && !announced_device_only))
        failed_version = info.version;
      failed_awaits_complete = incoming;
      if (device_only)  // e.g. a newer version is live on the producer's GPU already
        log(LogLevel::kWarn, kLog, "{} version {} not loaded from the producer's GPU: {}; the host path takes it once committed",
            options.model, info.version, last_error.message());
      else if (failed_awaits_complete)  // e.g. its producer abandoned it: retried if it is ever complete
        log(LogLevel::kWarn, kLog, "{} version {} not loaded while it arrived: {}; loaded if a node announces it complete",
            options.model, info.version, last_error.message());
      else
        log(LogLevel::kError, kLog, "could not load {} version {}: {}", options.model, info.version, last_error.message());
      continue;
    }
    std::shared_ptr<ModelVersion> mv = std::move(loaded).value();
    mv->timings.publish_ns = mv->info.publish_ns;
    mv->timings.completed_ns = mv->info.completed_ns;
    mv->timings.notified_ns = notified;
    mv->timings.live_ns = WallClockNs();
    if (mv->version() <= live_version) continue;  // e.g. the file path found nothing newer
    std::shared_ptr<const ModelVersion> frozen = mv;
    live.store(frozen);
    stats.updates++;
    if (mv->delta_base != 0) stats.deltas++;
    auto listeners = callbacks;
    auto c = client;
    cv.notify_all();
    lock.unlock();
    if (c && options.ack_on_live) c->Ack(frozen->info.model, frozen->version());
    {
      std::lock_guard<std::mutex> deliver(deliver_mu);
      for (auto& cb : listeners) cb(frozen);
    }
    // The next version needs a second buffer while readers hold this one: map and fault it in
    // now, between versions, on the spare thread: a version announced meanwhile is fetched at
    // once, into the spare as it is being populated (BufferPool::KeepSpare). A remote version
    // received into a landing zone needs none.
    if (frozen->path != FetchPath::kMap && !(frozen->path == FetchPath::kRemote && options.landing) &&
        !frozen->snapshot.bytes().empty())
      KeepSpareLater(frozen->info.size);
    lock.lock();
  }
}

std::string Subscriber::Impl::CurrentNode() {
  std::lock_guard<std::mutex> lock(mu);
  if (!node_address.empty()) return node_address;
  return registry ? registry_node : options.connect;
}

// Waits until `ready`; while the connection to the node is down (the node restarted, died, or a
// broken transfer dropped it, or it was never up) reconnects, to the node or an alternate, with a
// backoff from 100 ms doubling to options.reconnect_max, so that announcements resume. While on
// an alternate, probes options.connect every options.preferred_probe (on the prober thread, also
// while versions keep coming) and moves to the connection a probe made here, between versions, so
// that the move never cuts a load.
void Subscriber::Impl::WaitConnected(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kFirstRetry = std::chrono::milliseconds(100);
  auto backoff = kFirstRetry;
  auto down = [&] { return !(client && client->connected()); };
  for (;;) {
    const bool on_alternate = prober && !down() && node_address != options.connect;
    if (on_alternate && probed) {
      lock.unlock();
      AdoptProbed();
      lock.lock();
      continue;
    }
    if (!on_alternate && !down() && probed) {  // made while a reconnect went back to the node itself
      std::unique_ptr<Client> stale = std::move(probed);
      lock.unlock();
      stale.reset();  // disconnects: not under mu
      lock.lock();
      continue;
    }
    if (on_alternate && Clock::now() >= next_preferred_probe) {
      ProbePreferredLater();
      next_preferred_probe = Clock::now() + options.preferred_probe;
    }
    if (ready()) return;
    if (!down()) {
      backoff = kFirstRetry;
      const bool liveness = options.liveness_probe.count() > 0;
      if (!on_alternate && !liveness) {
        cv.wait(lock, [&] { return ready() || down(); });
        continue;
      }
      auto wake = liveness ? Clock::now() + options.liveness_probe : Clock::time_point::max();
      if (on_alternate) wake = std::min(wake, next_preferred_probe);
      if (cv.wait_until(lock, wake, [&] { return ready() || down() || (on_alternate && probed); })) continue;
      if (!liveness) continue;
      lock.unlock();
      CheckLiveness();  // returns at once unless the node has been silent for liveness_probe
      lock.lock();
      continue;
    }
    lock.unlock();
    mappings.Prune();  // a node that went away unlinked its segments: let their memory go
    bool connected = EnsureClient().ok();
    lock.lock();
    if (connected) {
      if (!failed_awaits_complete) failed_version = 0;  // a version whose load failed while the node was away: try again
      next_preferred_probe = Clock::now() + options.preferred_probe;  // it was just tried
      continue;
    }
    cv.wait_for(lock, backoff, ready);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::max(options.reconnect_max, kFirstRetry));
  }
}

}  // namespace viper
