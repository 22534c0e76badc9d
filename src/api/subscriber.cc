// Subscriber: the public facade (start, wait, callbacks, stats, ack, close). The connection to
// the node is in subscriber_connection.cc, the fetch paths in subscriber_loaders.cc.
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

#include "store/file_tier.h"
#include "store/host_tier.h"
#include "subscriber_impl.h"
#include "viper/log.h"
#include "viper/node.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "subscriber";
}  // namespace

Result<FetchPath> ParseFetchPath(std::string_view name) {
  if (name == "auto") return FetchPath::kAuto;
  if (name == "map") return FetchPath::kMap;
  if (name == "copy") return FetchPath::kCopy;
  if (name == "remote") return FetchPath::kRemote;
  if (name == "file") return FetchPath::kFile;
  return Status::InvalidArgument("fetch path '" + std::string(name) + "' is not one of auto|map|copy|remote|file");
}

std::string_view fetch_path_name(FetchPath path) {
  switch (path) {
    case FetchPath::kAuto: return "auto";
    case FetchPath::kMap: return "map";
    case FetchPath::kCopy: return "copy";
    case FetchPath::kRemote: return "remote";
    case FetchPath::kFile: return "file";
  }
  return "?";
}

Subscriber::Subscriber(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Subscriber::~Subscriber() { Close(); }

Result<std::unique_ptr<Subscriber>> Subscriber::Start(const SubscriberOptions& options) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(options.model));
  if (options.chunk_bytes < (64u << 10)) return Status::InvalidArgument("chunk_bytes must be >= 64 KiB");
  if (options.liveness_probe.count() < 0 || (options.liveness_probe.count() > 0 && options.liveness_timeout.count() <= 0))
    return Status::InvalidArgument("liveness_probe must be >= 0 ms (0: no probes), and liveness_timeout > 0 ms with it; got " +
                                   std::to_string(options.liveness_probe.count()) + " and " +
                                   std::to_string(options.liveness_timeout.count()) + " ms");
  if (options.path == FetchPath::kFile && options.file_dir.empty())  // (it read ./MODEL/ of wherever it ran)
    return Status::InvalidArgument("path=file needs file_dir (the node's store_dir as seen from here)");
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->pool = std::make_shared<internal::BufferPool>(std::max<size_t>(options.buffers, 1));
  VIPER_RETURN_IF_ERROR(impl->StartGpu());
  VIPER_RETURN_IF_ERROR(impl->StartRegistry());
  auto client = impl->EnsureClient();
  if (!client.ok() && options.file_dir.empty() && !impl->registry && !options.wait_for_node) return client.status();
  if (!client.ok() && !options.wait_for_node)
    log(LogLevel::kWarn, kLog, "{}; {}", client.status().message(),
        impl->registry ? "waiting for a node to announce it"
                       : "retrying it (the file tier is read for the versions a node announces)");
  impl->spare = std::make_unique<internal::TaskQueue>("subscriber-spare");
  if (!options.alternates.empty() && options.preferred_probe.count() > 0 && !impl->registry && !options.choose_node)
    impl->prober = std::make_unique<internal::TaskQueue>("subscriber-probe");
  impl->loader = std::thread([raw = impl.get()] { raw->Run(); });
  return std::unique_ptr<Subscriber>(new Subscriber(std::move(impl)));
}

std::shared_ptr<const ModelVersion> Subscriber::latest() const { return impl_->live.load(); }

Result<std::shared_ptr<const ModelVersion>> Subscriber::WaitFor(uint64_t min_version, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  bool reached = impl_->cv.wait_for(lock, timeout, [&] {
    auto v = impl_->live.load();
    return impl_->closing || (v && v->version() >= min_version);
  });
  auto v = impl_->live.load();
  if (reached && v && v->version() >= min_version) return v;
  if (impl_->closing) return Status::Cancelled("subscriber closed");
  return Status::Timeout("version " + std::to_string(min_version) + " of " + impl_->options.model + " not live within " +
                         std::to_string(timeout.count()) + " ms (live: " + (v ? std::to_string(v->version()) : "none") + ")");
}

// The live version is handed over here, under deliver_mu: a version the loader swaps in
// meanwhile is either that one (the loader's copy of the callbacks lacks this one) or reaches
// this callback after it (the loader waits for deliver_mu). Without it a caller that sets its
// callback after Start misses a version loaded in between, and waits for it for ever.
void Subscriber::OnUpdate(std::function<void(const std::shared_ptr<const ModelVersion>&)> callback) {
  std::lock_guard<std::mutex> deliver(impl_->deliver_mu);
  std::shared_ptr<const ModelVersion> live;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->callbacks.push_back(callback);
    live = impl_->live.load();
  }
  if (live) callback(live);
}

SubscriberStats Subscriber::stats() const {
  internal::SegmentMappings::Stats kept = impl_->mappings.stats();
  std::lock_guard<std::mutex> lock(impl_->mu);
  SubscriberStats out = impl_->stats;
  out.segments_mapped = kept.mapped;
  out.segments_reused = kept.reused;
  return out;
}

Status Subscriber::last_error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_error;
}

Status Subscriber::Ack(uint64_t version) {
  std::shared_ptr<Client> c;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    c = impl_->client;
  }
  if (!c || !c->connected()) return Status::FailedPrecondition("ack of " + impl_->options.model + " version " + std::to_string(version) + ": not connected to a node");
  c->Ack(impl_->options.model, version);
  return Status::OK();
}

void Subscriber::Close() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->closing && !impl_->loader.joinable()) return;
    impl_->closing = true;
    impl_->cv.notify_all();
  }
  impl_->registry_watch.reset();  // no registry handler runs after this
  if (impl_->loader.joinable()) impl_->loader.join();
  if (impl_->spare) impl_->spare->Close();  // a spare being made is finished, not abandoned
  if (impl_->prober) impl_->prober->Close();  // a probe in flight ends within the connect timeout
  std::unique_ptr<Client> probed;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    probed = std::move(impl_->probed);  // made by a probe the loader never adopted
  }
  probed.reset();
  std::shared_ptr<Client> c;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    c = std::move(impl_->client);
  }
  c.reset();  // disconnects; the node drops our leases, versions handed out keep their mappings
}

}  // namespace viper
