#include "viper/publisher.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "core/memory.h"
#include "core/names.h"
#include "hash_follower.h"
#include "net/protocol.h"
#include "store/host_tier.h"
#include "task_queue.h"
#include "test_hooks.h"
#include "viper/log.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "publisher";

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Result<PublishMode> ParsePublishMode(std::string_view name) {
  if (name == "sync") return PublishMode::kSync;
  if (name == "async") return PublishMode::kAsync;
  return Status::InvalidArgument("publish mode '" + std::string(name) + "' is not one of sync|async");
}

std::string_view publish_mode_name(PublishMode mode) { return mode == PublishMode::kSync ? "sync" : "async"; }

Draft::Draft() = default;
Draft::Draft(Draft&&) noexcept = default;
Draft& Draft::operator=(Draft&&) noexcept = default;
Draft::~Draft() = default;

std::span<std::byte> Draft::tensor(std::string_view name) const {
  if (!layout_) return {};
  const TensorInfo* t = layout_->find(name);
  if (t == nullptr) return {};
  std::span<std::byte> bytes = early_ ? early_->data() : lease_->data();
  return bytes.subspan(layout_->data_offset() + t->begin, t->nbytes());
}

namespace internal {
// What the scheduler learns from this publisher: stalls directly, and t_c from the ACKs the node
// receives (ACK time - end of that version's stall). Shared with the node's on_ack callback.
struct PolicyFeedback {
  std::shared_ptr<Scheduler> scheduler;
  std::mutex mu;
  std::map<uint64_t, int64_t> stall_end_ns;  // version -> CLOCK_REALTIME when its publish returned

  void Published(uint64_t version, int64_t stall_ns) {
    scheduler->ReportPublishStall(std::chrono::nanoseconds(stall_ns));
    std::lock_guard<std::mutex> lock(mu);
    stall_end_ns[version] = WallClockNs();
    while (stall_end_ns.size() > 64) stall_end_ns.erase(stall_end_ns.begin());
  }
  void Acked(uint64_t version) {
    int64_t now = WallClockNs();
    std::lock_guard<std::mutex> lock(mu);
    auto it = stall_end_ns.find(version);
    if (it != stall_end_ns.end()) scheduler->ReportUpdateLatency(std::chrono::nanoseconds(now - it->second));
  }
};
}  // namespace internal

struct Publisher::Impl {
  internal::TaskQueue hasher{"publisher-hash"};  // checksums Publish() copies as they happen
  internal::TaskQueue background{"publisher"};   // seals and announces in publish order
  // Makes the host tier's next segment while training runs (HostTier::KeepSpare): without it the
  // first keep_versions + 1 publishes each create and fault in a fresh segment on the caller's
  // thread. Its own thread, so that an async seal never waits behind it.
  internal::TaskQueue spare{"publisher-spare"};
  std::atomic<bool> preparing{false};  // a Prepare() segment is queued or being made
  std::atomic<bool> closing{false};
  std::mutex order;  // from a version's number to its place in `background` (Enqueue)
  std::mutex mu;
  Status first_error;  // since the last Wait()
  std::atomic<uint64_t> announced{0};
  std::shared_ptr<internal::PolicyFeedback> feedback;  // with options.scheduler
};

Publisher::Publisher(const PublisherOptions& options, std::unique_ptr<Node> node)
    : options_(options), node_(std::move(node)), impl_(std::make_unique<Impl>()) {}

Publisher::~Publisher() {
  // Queued versions are drained while the node and impl_ still live: the tasks refer to both,
  // and resetting impl_ first would null the pointer under a running task.
  impl_->closing = true;  // a queued spare is not made any more
  impl_->background.Close();
  impl_->hasher.Close();  // after background: a queued seal may still wait for its checksum
  impl_->spare.Close();
  impl_.reset();
  node_.reset();
}

Result<std::unique_ptr<Publisher>> Publisher::Start(const PublisherOptions& options) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(options.model));
  if (options.max_in_flight < 1) return Status::InvalidArgument("max_in_flight must be >= 1");
  // Checked here, not at the first Begin(): a publisher that cannot lay out any version is refused.
  if (options.alignment == 0 || options.alignment > kMaxAlignment || (options.alignment & (options.alignment - 1)) != 0)
    return Status::InvalidArgument("alignment " + std::to_string(options.alignment) + " is not a power of two in [1, " +
                                   std::to_string(kMaxAlignment) + "]");
  NodeOptions node_options = options.node;
  std::shared_ptr<internal::PolicyFeedback> feedback;
  if (options.scheduler) {
    if (node_options.on_ack) return Status::InvalidArgument("PublisherOptions: scheduler and node.on_ack cannot both be set");
    feedback = std::make_shared<internal::PolicyFeedback>();
    feedback->scheduler = options.scheduler;
    node_options.on_ack = [feedback, model = options.model](const std::string& acked_model, uint64_t version) {
      if (acked_model == model) feedback->Acked(version);
    };
  }
  VIPER_ASSIGN_OR_RETURN(auto node, Node::Start(node_options));
  auto publisher = std::unique_ptr<Publisher>(new Publisher(options, std::move(node)));
  publisher->impl_->feedback = std::move(feedback);
  return publisher;
}

uint64_t Publisher::announced_version() const { return impl_->announced.load(); }

void Publisher::KeepSpareLater(uint64_t size) {
  impl_->spare.Post([this, size] {
    if (impl_->closing) return;
    Status st = node_->host_tier().KeepSpare(size);
    if (!st.ok()) log(LogLevel::kWarn, kLog, "{}: {}", options_.model, st.message());
  });
}

void Publisher::NoteAnnounced(uint64_t version) {
  uint64_t prev = impl_->announced.load();
  while (prev < version && !impl_->announced.compare_exchange_weak(prev, version)) {}
}

Result<Draft> Publisher::Begin(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata) {
  VIPER_ASSIGN_OR_RETURN(SnapshotLayout layout, SnapshotLayout::Make(tensors, metadata, options_.alignment));
  // Back-pressure: never more than max_in_flight versions waiting to be sealed.
  impl_->background.WaitBelow(options_.max_in_flight);
  // A segment Prepare() queued is about to exist: take it rather than make another beside it.
  if (impl_->preparing) impl_->spare.Drain(std::chrono::minutes(10));
  Draft draft;
  draft.publish_ns = WallClockNs();
  draft.layout_ = std::make_shared<const SnapshotLayout>(std::move(layout));
  VIPER_ASSIGN_OR_RETURN(WriteLease lease, node_->Allocate(draft.layout_->total_bytes()));
  draft.lease_ = std::make_unique<WriteLease>(std::move(lease));
  draft.layout_->ZeroPadding(draft.lease_->data());
  return draft;
}

Status Publisher::Prepare(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata) {
  VIPER_ASSIGN_OR_RETURN(SnapshotLayout layout, SnapshotLayout::Make(tensors, metadata, options_.alignment));
  impl_->preparing = true;
  impl_->spare.Post([this, size = layout.total_bytes()] {
    if (!impl_->closing) {
      Status st = node_->host_tier().KeepSpare(size);
      if (!st.ok()) log(LogLevel::kWarn, kLog, "{}: preparing a segment: {}", options_.model, st.message());
    }
    impl_->preparing = false;
  });
  return Status::OK();
}

Result<PublishResult> Publisher::Publish(const std::vector<TensorData>& tensors, const PublishInfo& info) {
  const int64_t start = SteadyNs();
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back(t.spec);
  VIPER_ASSIGN_OR_RETURN(Draft draft, Begin(specs, info.metadata));
  const SnapshotLayout& layout = *draft.layout_;
  for (size_t i = 0; i < tensors.size(); ++i) {  // all checked before the hash thread follows
    if (tensors[i].bytes.size() != layout.tensors()[i].nbytes()) {
      return Status::InvalidArgument("tensor " + tensors[i].spec.name + ": " + std::to_string(tensors[i].bytes.size()) +
                                     " bytes given, shape and dtype need " + std::to_string(layout.tensors()[i].nbytes()));
    }
  }
  std::span<std::byte> whole = draft.lease_->data();
  std::span<std::byte> data = whole.subspan(layout.data_offset(), layout.data_bytes());
  // Remote readers (consumers and relays on other hosts) start receiving while the copy runs: the
  // version is announced now and each copied chunk advances its landed watermark.
  std::unique_lock<std::mutex> order;
  if (AnnouncesEarly(draft)) {
    order = std::unique_lock<std::mutex>(impl_->order);
    VIPER_RETURN_IF_ERROR(AnnounceEarly(draft, info));
  }
  IncomingVersion* early = draft.early_.get();
  const auto& hooks = node_->options().test_hooks;
  const auto landed_hook = hooks ? hooks->publish_landed : nullptr;
  // Both modes copy with the hash thread one chunk behind, hashing the source chunk the copy just
  // read while it is still in cache (hash_follower.h): the checksum costs no second pass over
  // memory. Chunks: small enough to stay cached between the two cores, large enough that the
  // hand-offs (one futex wake each) cost nothing measurable.
  constexpr uint64_t kCopyChunk = 2 << 20;
  std::vector<internal::HashFollower::Piece> pieces;
  pieces.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) pieces.push_back({layout.tensors()[i].begin, tensors[i].bytes});
  auto follower = std::make_shared<internal::HashFollower>(layout.data_bytes(), std::move(pieces));
  draft.checksum_ = follower->result();
  impl_->hasher.Post([follower] { follower->Run(); });
  const int64_t copy_start = SteadyNs();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = layout.tensors()[i];  // tensors are laid out in the given order
    for (uint64_t at = 0; at < t.nbytes(); at += kCopyChunk) {
      uint64_t n = std::min(kCopyChunk, t.nbytes() - at);
      StreamingCopy(data.subspan(t.begin + at, n), tensors[i].bytes.subspan(at, n));
      follower->Advance(t.begin + at + n);  // padding before t was zeroed by Begin
      if (early) {
        early->Landed(layout.data_offset() + t.begin + at + n);
        if (landed_hook) landed_hook(options_.model, draft.version_, layout.data_offset() + t.begin + at + n, whole.size());
      }
    }
  }
  if (early) early->Landed(whole.size());
  follower->Advance(layout.data_bytes());
  // The caller may change its tensors once Publish returns (async mode): the hash must be done
  // with them. It is one chunk behind, so this waits for about one chunk's hash.
  draft.checksum_.wait();
  return Enqueue(std::move(draft), info, start, SteadyNs() - copy_start, std::move(order));
}

bool Publisher::AnnouncesEarly(const Draft& draft) const {
  return options_.cut_through && draft.layout_->data_offset() <= proto::kMaxSealedHeaderBytes &&
         node_->HasEarlyReaders(options_.model);
}

// Reserves the version's number, writes a provisional header (checksum 0) and hands the segment to
// the node as a version being produced (Node::Produce), which tells remote readers at once.
Status Publisher::AnnounceEarly(Draft& draft, const PublishInfo& info) {
  VIPER_ASSIGN_OR_RETURN(draft.version_, node_->ReserveVersion(options_.model));
  VersionStamp stamp{options_.model, draft.version_, info.step, static_cast<uint64_t>(WallClockNs()), 0, info.loss};
  VIPER_RETURN_IF_ERROR(draft.layout_->WriteHeader(draft.lease_->data(), stamp));
  draft.early_recycled_ = draft.lease_->recycled();
  VIPER_ASSIGN_OR_RETURN(auto produced, node_->Produce(std::move(*draft.lease_), VersionInfoOf(draft, info, 0)));
  draft.lease_.reset();
  draft.early_ = std::move(produced);
  return Status::OK();
}

proto::VersionInfo Publisher::VersionInfoOf(const Draft& draft, const PublishInfo& info, uint64_t checksum) const {
  proto::VersionInfo vi;
  vi.model = options_.model;
  vi.version = draft.version_;
  vi.size = draft.layout_->total_bytes();
  vi.checksum = checksum;
  vi.step = info.step;
  vi.publish_ns = draft.publish_ns;
  vi.metadata = draft.layout_->user_metadata();
  if (info.loss) vi.metadata[std::string(kMetaLoss)] = std::to_string(*info.loss);
  return vi;
}

Result<PublishResult> Publisher::Commit(Draft draft, const PublishInfo& info) {
  if (!draft.layout_ || !draft.lease_ || !*draft.lease_) return Status::InvalidArgument("commit of an empty or already committed draft");
  const int64_t start = SteadyNs();
  // Every byte is written now: remote readers start receiving while the seal hashes them, so the
  // checksum pass and the transfer overlap (the caller wrote the tensors in any order, so there
  // was no landed watermark to announce earlier).
  std::unique_lock<std::mutex> order;
  if (AnnouncesEarly(draft)) {
    VIPER_RETURN_IF_ERROR(CheckCommitMetadata(draft, info));  // before anyone is told of the version
    order = std::unique_lock<std::mutex>(impl_->order);
    VIPER_RETURN_IF_ERROR(AnnounceEarly(draft, info));
    const uint64_t size = draft.early_->data().size();
    draft.early_->Landed(size);
    if (const auto& hooks = node_->options().test_hooks; hooks && hooks->publish_landed)
      hooks->publish_landed(options_.model, draft.version_, size, size);
  }
  return Enqueue(std::move(draft), info, start, 0, std::move(order));
}

Status Publisher::CheckCommitMetadata(const Draft& draft, const PublishInfo& info) const {
  for (const auto& [key, value] : info.metadata) {
    if (draft.layout_->user_metadata().count(key) == 0 || draft.layout_->user_metadata().at(key) != value)
      return Status::InvalidArgument("metadata key " + key + " must be given to Begin() (the header is laid out there)");
  }
  return Status::OK();
}

// PublishResult::delta's promise, set once: by the node when the delta is encoded (or not made),
// or by a publish that failed before the commit.
struct Publisher::DeltaPromise {
  std::promise<PreparedDelta> promise;
  std::shared_future<PreparedDelta> future = promise.get_future().share();
  std::atomic<bool> set{false};
  void Set(const PreparedDelta& d) {
    if (!set.exchange(true)) promise.set_value(d);
  }
};

// Reserves the version number now (versions follow call order), then seals and announces on the
// background thread (async) or here (sync).
Result<PublishResult> Publisher::Enqueue(Draft draft, const PublishInfo& info, int64_t started_ns, int64_t copy_ns,
                                         std::unique_lock<std::mutex> order) {
  // On failure the draft's segment goes back to the pool: not while the hash thread still reads it.
  auto fail = [&draft](Status why) {
    if (draft.checksum_.valid()) draft.checksum_.wait();
    return why;
  };
  if (Status st = CheckCommitMetadata(draft, info); !st.ok()) return fail(st);
  if (!order.owns_lock()) order = std::unique_lock<std::mutex>(impl_->order);
  if (draft.version_ == 0) {
    auto reserved = node_->ReserveVersion(options_.model);
    if (!reserved.ok()) return fail(reserved.status());
    draft.version_ = *reserved;
  }
  const uint64_t version = draft.version_;
  PublishResult result;
  result.version = version;
  result.copy_ns = copy_ns;
  result.recycled = draft.early_ ? draft.early_recycled_ : draft.lease_->recycled();
  result.bytes = draft.layout_->total_bytes();
  auto delta = std::make_shared<DeltaPromise>();
  result.delta = delta->future;

  auto seal_and_commit = [this, version, info, delta, draft = std::move(draft)]() mutable -> Status {
    VersionStamp stamp;
    stamp.model = options_.model;
    stamp.version = version;
    stamp.step = info.step;
    stamp.time_ns = static_cast<uint64_t>(WallClockNs());
    stamp.loss = info.loss;
    std::span<std::byte> bytes = draft.early_ ? draft.early_->data() : draft.lease_->data();
    if (draft.checksum_.valid()) {
      stamp.checksum = draft.checksum_.get();  // hashed while Publish copied (padding zeroed at Begin)
      VIPER_RETURN_IF_ERROR(draft.layout_->WriteHeader(bytes, stamp));
    } else if (draft.early_) {
      // A draft announced at Commit is being sent already: its data is only read here (Seal would
      // zero the padding again, writing under the sends; Begin zeroed it).
      stamp.checksum = checksum64(bytes.subspan(draft.layout_->data_offset(), draft.layout_->data_bytes()));
      VIPER_RETURN_IF_ERROR(draft.layout_->WriteHeader(bytes, stamp));
    } else {
      VIPER_RETURN_IF_ERROR(draft.layout_->Seal(bytes, &stamp));
    }
    proto::VersionInfo vi = VersionInfoOf(draft, info, stamp.checksum);
    const uint64_t size = vi.size;
    if (draft.early_) {  // announced while copied: its readers get the checksum and final header now
      VIPER_RETURN_IF_ERROR(draft.early_->Seal(vi));
      VIPER_RETURN_IF_ERROR(draft.early_->Commit().status());
      draft.early_.reset();
    } else {
      VIPER_RETURN_IF_ERROR(node_->Commit(std::move(*draft.lease_), std::move(vi)).status());
    }
    node_->WhenDeltaPrepared(options_.model, version, [delta](const PreparedDelta& d) { delta->Set(d); });
    NoteAnnounced(version);
    KeepSpareLater(size);
    return Status::OK();
  };

  if (options_.mode == PublishMode::kSync) {
    Status st = seal_and_commit();
    if (!st.ok()) return st.WithContext("publish of " + options_.model + " version " + std::to_string(version));
  } else {
    auto task = std::make_shared<decltype(seal_and_commit)>(std::move(seal_and_commit));
    impl_->background.Post([this, task, version, delta] {
      Status st = (*task)();
      if (st.ok()) return;
      delta->Set(PreparedDelta{.why_not = "the publish failed: " + st.message()});
      log(LogLevel::kError, kLog, "publish of {} version {} failed: {}", options_.model, version, st.message());
      std::lock_guard<std::mutex> lock(impl_->mu);
      if (impl_->first_error.ok()) impl_->first_error = st;
    });
  }
  result.stall_ns = SteadyNs() - started_ns;
  if (impl_->feedback) impl_->feedback->Published(version, result.stall_ns);
  return result;
}

Result<bool> Publisher::Due(int64_t iteration, double loss) {
  if (!options_.scheduler) return Status::FailedPrecondition("Publisher::Due needs PublisherOptions::scheduler");
  return options_.scheduler->Step(iteration, loss);
}

Result<std::optional<PublishResult>> Publisher::PublishIfDue(int64_t iteration, double loss,
                                                             const std::vector<TensorData>& tensors, PublishInfo info) {
  VIPER_ASSIGN_OR_RETURN(bool due, Due(iteration, loss));
  if (!due) return std::optional<PublishResult>();
  if (iteration < 0) return Status::InvalidArgument("iteration must be >= 0");
  info.step = static_cast<uint64_t>(iteration);
  info.loss = loss;
  VIPER_ASSIGN_OR_RETURN(PublishResult published, Publish(tensors, info));
  return std::optional<PublishResult>(std::move(published));
}

Status Publisher::Wait(std::chrono::milliseconds timeout) {
  if (!impl_->background.Drain(timeout)) return Status::Timeout("queued publishes still running");
  std::lock_guard<std::mutex> lock(impl_->mu);
  Status st = impl_->first_error;
  impl_->first_error = Status::OK();
  return st;
}

}  // namespace viper
