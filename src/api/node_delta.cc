// DeltaStore: bases, delta encoding and delta sends of a node (src/api/node_delta.h).
#include "node_delta.h"

#include <algorithm>
#include <cstdio>

#include "test_hooks.h"
#include "viper/log.h"

namespace viper {

namespace {

constexpr std::string_view kLog = "delta";
constexpr uint32_t kBlockBytes = 1u << 20;
constexpr uint32_t kBlocksPerPart = 4;   // a part covers 4 MiB of the target: sent while the next is encoded
constexpr double kDefaultBandwidth = 1.5e9;   // bytes/s of a remote full send until one is measured
constexpr double kDefaultEncodeRate = 1.0e9;  // target bytes/s of the encoder until one is measured
constexpr double kDecodeRate = 2.0e9;         // target bytes/s of a consumer's decoder (measured: ARCHITECTURE)
constexpr double kMaxRatio = 0.9;             // a delta is sent only if below this fraction of the snapshot
constexpr uint64_t kMinMeasuredSend = 16ull << 20;
// FETCH_OK's detail for a delta a relay passes on (tests and users look for "passed on").
constexpr std::string_view kPassedOn = " (passed on as it arrives from the upstream)";
constexpr size_t kMinPoolBytes = 16ull << 20;  // free part vectors kept before any delta is finished

double Ewma(double old, double sample) { return old <= 0 ? sample : 0.7 * old + 0.3 * sample; }

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

}  // namespace

DeltaStore::DeltaStore(NodeOptions options, HostTier* host, net::Engine* engine, std::atomic<uint64_t>* egress)
    : options_(std::move(options)),
      host_(host),
      engine_(engine),
      egress_(egress),
      parts_pool_(std::make_shared<internal::VectorPool>(kMinPoolBytes)),
      encoders_() {
  for (size_t i = 0; i < std::max<size_t>(1, options_.delta_threads); ++i) {
    scratch_.push_back(std::make_unique<DeltaScratch>());
    encoders_.push_back(std::make_unique<internal::TaskQueue>("node-delta-" + std::to_string(i)));
  }
}

DeltaStore::~DeltaStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, job] : jobs_) {
      std::lock_guard<std::mutex> held(job->mu);
      job->cancelled = true;
      job->senders.clear();
    }
  }
  for (auto& q : encoders_) q->Close();  // queued encodes see `cancelled` and return at once
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.clear();
  bases_.clear();
}

std::function<void()> DeltaStore::OnCommit(const proto::VersionInfo& info, bool eager) {
  if (options_.delta_bases == 0) return [] {};
  auto lease = host_->Acquire(info.model, info.version);
  if (!lease.ok()) return [] {};  // already retired: nothing to keep
  auto snapshot = Snapshot::Parse(lease->data(), nullptr);
  if (!snapshot.ok()) {
    log(LogLevel::kWarn, kLog, "{} version {} is not kept as a delta base: {}", info.model, info.version,
        snapshot.status().message());
    return [] {};
  }
  std::vector<std::pair<std::shared_ptr<DeltaJob>, bool>> stale;  // and whether its base was evicted
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = bases_[info.model];
    list.push_back(Base{info.version, info.checksum, *lease, std::move(snapshot).value()});
    std::vector<uint64_t> evicted;
    while (list.size() > options_.delta_bases + 1) {
      evicted.push_back(list.front().version);
      list.pop_front();
    }
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      const auto& [model, base, target] = it->first;
      bool base_gone = std::find(evicted.begin(), evicted.end(), base) != evicted.end();
      if (model != info.model || (!base_gone && target >= info.version)) {
        ++it;
        continue;
      }
      {
        // A finished delta nobody is receiving gives its parts back now, so that the encode that
        // starts below reuses their memory.
        std::lock_guard<std::mutex> held(it->second->mu);
        if (it->second->done && it->second->senders.empty()) {
          it->second->parts.clear();
          it->second->slots.clear();
        }
      }
      stale.emplace_back(it->second, base_gone);
      it = jobs_.erase(it);
    }
    if (eager && list.size() >= 2 && WorthEncodingLocked(info.model, info.size))
      JobLocked(info.model, list[list.size() - 2], list.back());
  }
  for (auto& [job, base_gone] : stale) {
    std::lock_guard<std::mutex> lock(job->mu);
    bool streamed = !job->senders.empty();
    // An unfinished encode whose base is evicted stops (its consumers fall back to the full
    // snapshot); one towards an older target stops only if nobody is receiving it.
    if (!job->done && !job->cancelled && (base_gone || !streamed)) {
      job->cancelled = true;
      job->error = Status::NotFound(
          "delta of " + job->model + " " + std::to_string(job->base_version) + " -> " +
          std::to_string(job->target_version) + " stopped: " +
          (base_gone ? "base version " + std::to_string(job->base_version) + " was evicted (delta_bases " +
                           std::to_string(options_.delta_bases) + ")"
                     : "version " + std::to_string(info.version) + " superseded it") +
          "; fetch in full");
    }
  }
  return [this, stale = std::move(stale)] {
    for (auto& entry : stale) engine_->Post([this, job = entry.first] { Pump(job); });
  };
}

std::shared_ptr<DeltaJob> DeltaStore::JobLocked(const std::string& model, const Base& base, const Base& target) {
  Key key{model, base.version, target.version};
  if (auto it = jobs_.find(key); it != jobs_.end()) return it->second;
  DeltaOptions delta_options;
  delta_options.block_bytes = kBlockBytes;
  auto encoder = DeltaEncoder::Make(base.snapshot, base.checksum, target.snapshot, target.checksum, delta_options);
  if (!encoder.ok()) {
    log(LogLevel::kError, kLog, "cannot plan the delta of {} {} -> {}: {}", model, base.version, target.version,
        encoder.status().message());
    return nullptr;
  }
  auto job = std::make_shared<DeltaJob>();
  job->model = model;
  job->base_version = base.version;
  job->target_version = target.version;
  job->target_size = target.snapshot.bytes().size();
  job->total_parts = static_cast<uint32_t>(std::max<size_t>(1, (encoder->blocks() + kBlocksPerPart - 1) / kBlocksPerPart));
  job->encoder.emplace(std::move(encoder).value());
  job->base_lease = base.lease;
  job->target_lease = target.lease;
  job->base = base.snapshot;
  job->target = target.snapshot;
  job->slots.resize(job->total_parts);
  if (auto it = part_sizes_.find(model); it != part_sizes_.end()) job->part_size_hints = it->second;
  job->workers_left = static_cast<uint32_t>(encoders_.size());
  jobs_[key] = job;
  for (size_t i = 0; i < encoders_.size(); ++i) encoders_[i]->Post([this, job, i] { Encode(job, i); });
  return job;
}

// Encoder threads: each takes the next part not yet taken; finished parts join the job's
// in-order prefix, which the senders stream as soon as it grows.
void DeltaStore::Encode(const std::shared_ptr<DeltaJob>& job, size_t worker) {
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->started_ns == 0) job->started_ns = WallClockNs();
  }
  DeltaScratch& scratch = *scratch_[worker];
  const DeltaEncoder& enc = *job->encoder;  // reset by Finish only, after every thread is done here
  for (;;) {
    uint32_t p = 0;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      if (job->cancelled || job->next_part >= job->total_parts) break;
      p = job->next_part++;
    }
    auto part = parts_pool_->Acquire(p < job->part_size_hints.size() ? job->part_size_hints[p] : 0);
    if (p == 0) enc.AppendHeader(part.get());
    const size_t first = static_cast<size_t>(p) * kBlocksPerPart;
    const size_t last = std::min(first + kBlocksPerPart, enc.blocks());
    for (size_t i = first; i < last; ++i) enc.EncodeBlock(i, scratch, part.get());
    if (options_.test_hooks && options_.test_hooks->delta_part) {
      options_.test_hooks->delta_part(DeltaPartEvent{job->model, job->base_version, job->target_version, p, part.get()});
    }
    {
      std::lock_guard<std::mutex> lock(job->mu);
      job->slots[p] = std::move(part);
      while (job->parts.size() < job->total_parts && job->slots[job->parts.size()]) {
        auto& next = job->slots[job->parts.size()];
        job->encoded_bytes += next->size();
        job->parts.push_back(std::move(next));
      }
      job->target_done = enc.target_end_of(std::min(job->parts.size() * kBlocksPerPart, enc.blocks()));
      // Not worth finishing: a quarter in, nobody is receiving it and it is not smaller.
      if (!job->cancelled && job->senders.empty() && job->target_done >= job->target_size / 4 &&
          static_cast<double>(job->encoded_bytes) > kMaxRatio * static_cast<double>(job->target_done)) {
        job->cancelled = true;
        job->error = Status::FailedPrecondition("the delta of " + job->model + " " + std::to_string(job->base_version) +
                                                " -> " + std::to_string(job->target_version) + " is not smaller");
      }
    }
    engine_->Post([this, job] { Pump(job); });
  }
  int64_t started = 0;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (--job->workers_left != 0) return;
    started = job->started_ns;
  }
  Finish(job, WallClockNs() - started);
}

void DeltaStore::Finish(const std::shared_ptr<DeltaJob>& job, int64_t encode_ns) {
  PreparedDelta prepared;
  std::vector<std::function<void(const PreparedDelta&)>> callbacks;
  bool done = false;
  uint64_t covered = 0, encoded = 0;
  std::vector<uint32_t> part_sizes;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    done = !job->cancelled && job->parts.size() == job->total_parts;
    job->done = done;
    job->encode_ns = encode_ns;
    covered = job->target_done;
    encoded = job->encoded_bytes;
    if (done)
      for (const auto& part : job->parts) part_sizes.push_back(static_cast<uint32_t>(part->size()));
    callbacks.swap(job->on_done);
    job->encoder.reset();  // the bytes are encoded: the snapshots and their leases can go
    job->base = Snapshot();
    job->target = Snapshot();
    job->base_lease = ReadLease();
    job->target_lease = ReadLease();
    prepared.prepared = done;
    prepared.base_version = job->base_version;
    prepared.bytes = done ? encoded : 0;
    prepared.snapshot_bytes = job->target_size;
    prepared.encode_ns = encode_ns;
    if (!done) prepared.why_not = job->error.ok() ? "the delta was not finished" : job->error.message();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (covered > 0 && encode_ns > 0) encode_rate_ = Ewma(encode_rate_, covered * 1e9 / static_cast<double>(encode_ns));
    if (done && job->forwarded) {
      // What the upstream's encode achieved is this model's ratio here too (ExpectsDelta).
      last_ratio_[job->model] = static_cast<double>(encoded) / static_cast<double>(std::max<uint64_t>(1, job->target_size));
      stats_.forwarded++;
      stats_.forwarded_bytes += encoded;
    } else if (done) {
      parts_pool_->set_budget(std::max<size_t>(kMinPoolBytes, encoded + encoded / 2));
      part_sizes_[job->model] = std::move(part_sizes);
      last_ratio_[job->model] = static_cast<double>(encoded) / static_cast<double>(std::max<uint64_t>(1, covered));
      stats_.encoded++;
      stats_.encoded_bytes += encoded;
      stats_.target_bytes += job->target_size;
    } else {
      stats_.cancelled++;
    }
  }
  if (done && job->forwarded)
    log(LogLevel::kInfo, kLog, "{} {} -> {}: delta of {} bytes for {} passed on as received", job->model,
        job->base_version, job->target_version, encoded, job->target_size);
  else if (done)
    log(LogLevel::kInfo, kLog, "{} {} -> {}: delta of {} bytes for {} ({:.1f}x) in {}", job->model, job->base_version,
        job->target_version, encoded, job->target_size, static_cast<double>(job->target_size) / std::max<uint64_t>(1, encoded),
        Seconds(encode_ns / 1e9));
  for (auto& fn : callbacks) fn(prepared);
  engine_->Post([this, job] { Pump(job); });
}

bool DeltaStore::Predict(const std::string& model, DeltaJob* job, net::PeerId peer, uint64_t size, std::string* why) {
  // With nothing encoded yet and no earlier delta of the model, the delta is assumed as big as
  // the snapshot (full): unrelated versions must not cost an encode plus a full-size stream.
  double bandwidth = kDefaultBandwidth, encode_rate = kDefaultEncodeRate, prior = 1.0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bandwidth_ > 0) bandwidth = bandwidth_;
    if (auto it = peer_bandwidth_.find(peer); it != peer_bandwidth_.end() && it->second > 0) bandwidth = it->second;
    if (encode_rate_ > 0) encode_rate = encode_rate_;
    if (auto it = last_ratio_.find(model); it != last_ratio_.end()) prior = it->second;
  }
  uint64_t done_bytes = 0, encoded = 0;
  bool finished = false;
  if (job != nullptr) {
    std::lock_guard<std::mutex> lock(job->mu);
    if (!job->error.ok()) {
      *why = job->error.message();
      return false;
    }
    done_bytes = job->target_done;
    encoded = job->encoded_bytes;
    finished = job->done;
  }
  const auto s = static_cast<double>(size);
  const double ratio = done_bytes > 0 ? static_cast<double>(encoded) / static_cast<double>(done_bytes) : prior;
  const double delta_bytes = finished ? static_cast<double>(encoded) : ratio * s;
  const double full = s / bandwidth;
  // The stages overlap part by part: the slowest one sets the pace.
  const double t = std::max({finished ? 0.0 : (s - static_cast<double>(done_bytes)) / encode_rate,
                             delta_bytes / bandwidth, s / kDecodeRate});
  std::string figures = std::to_string(static_cast<uint64_t>(delta_bytes)) + (finished ? "" : " (estimated)") +
                        " delta bytes for " + std::to_string(size) + ", predicted " + Seconds(t) + " against " +
                        Seconds(full) + " in full";
  if (delta_bytes > kMaxRatio * s) {
    *why = "delta not smaller: " + figures;
    return false;
  }
  if (t >= full) {
    *why = "delta predicted slower: " + figures;
    return false;
  }
  *why = figures;
  return true;
}

bool DeltaStore::TryStart(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info, std::string* why) {
  std::shared_ptr<DeltaJob> job;
  std::optional<Base> base_copy, target_copy;  // a job to make if the prediction says it pays
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Base* base = nullptr;
    const Base* target = nullptr;
    if (auto it = bases_.find(m.model); it != bases_.end()) {
      for (const Base& b : it->second) {
        if (b.version == m.base_version) base = &b;
        if (b.version == info.version) target = &b;
      }
    }
    if (options_.delta_bases == 0 || options_.delta == DeltaMode::kOff) {
      *why = "deltas are off on this node";
    } else if (base == nullptr || base->checksum != m.base_checksum) {
      *why = "base version " + std::to_string(m.base_version) + (base ? " differs from" : " is not among") +
             " the bases kept here (delta_bases " + std::to_string(options_.delta_bases) + ")";
    } else if (target == nullptr || base->version >= target->version) {
      *why = "no delta is kept towards version " + std::to_string(info.version);
    } else if (auto it = jobs_.find(Key{m.model, base->version, target->version}); it != jobs_.end()) {
      job = it->second;  // being encoded (eagerly, or for another consumer) or done
    } else {
      base_copy = *base;
      target_copy = *target;
    }
    if (!job && !base_copy) {
      stats_.declined++;
      return false;
    }
  }
  bool stopped = false;  // the job gave up: not smaller, or its base evicted
  if (job) {
    std::lock_guard<std::mutex> lock(job->mu);
    if (!job->error.ok()) {
      stopped = true;
      *why = job->error.message();
    }
  }
  const bool always = options_.delta == DeltaMode::kAlways;
  const bool forwarded = job && job->forwarded;  // received from the upstream as a delta: smaller, no encode here
  if (stopped || (!always && !forwarded && !Predict(m.model, job.get(), peer, info.size, why))) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.declined++;
    return false;  // a delta not made yet is not started for nothing
  }
  *why = "delta against version " + std::to_string(m.base_version) +
         (always      ? " (node set to always send deltas)"
          : forwarded ? std::string(kPassedOn)
                      : ": " + *why);
  if (!job) {
    std::lock_guard<std::mutex> lock(mu_);
    job = JobLocked(m.model, *base_copy, *target_copy);
    if (!job) {
      *why = "the delta could not be planned";
      stats_.declined++;
      return false;
    }
  }
  StartSend(job, peer, m, info, *why);
  return true;
}

void DeltaStore::StartSend(const std::shared_ptr<DeltaJob>& job, net::PeerId peer, const proto::Fetch& m,
                           const proto::VersionInfo& info, const std::string& why) {
  auto send = std::make_shared<DeltaSend>();
  send->job = job;
  send->peer = peer;
  send->request_id = m.request_id;
  send->tag = m.tag;
  send->started_ns = WallClockNs();
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->senders.push_back(send);
  }
  proto::FetchOk ok{m.request_id, proto::FetchMode::kSend, info, "", 0, 0, proto::Encoding::kDelta, m.base_version, why};
  (void)engine_->Send(peer, proto::Encode(ok));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.sent++;
  }
  PumpSend(send);
}

// ---------------------------------------------------------------- forwarding (relays)

std::shared_ptr<DeltaJob> DeltaStore::StartForwarding(const proto::VersionInfo& target, uint64_t base_version,
                                                      uint64_t base_checksum) {
  if (options_.delta == DeltaMode::kOff || options_.delta_bases == 0 || !options_.forward_deltas) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  Key key{target.model, base_version, target.version};
  if (jobs_.count(key) != 0) return nullptr;
  auto job = std::make_shared<DeltaJob>();
  job->model = target.model;
  job->base_version = base_version;
  job->base_checksum = base_checksum;
  job->target_version = target.version;
  job->target_size = target.size;
  job->forwarded = true;
  job->total_parts = UINT32_MAX;  // until the last part
  job->started_ns = WallClockNs();
  jobs_[key] = job;
  return job;
}

bool DeltaStore::AddForwardedPart(const std::shared_ptr<DeltaJob>& job, uint32_t index,
                                  std::shared_ptr<const std::vector<std::byte>> part, bool last) {
  std::string wrong;  // why the part cannot follow the ones passed on so far
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->cancelled || job->done) return false;
    if (index != job->parts.size()) {
      wrong = "delta part " + std::to_string(index) + " arrived out of order (expected " +
              std::to_string(job->parts.size()) + ")";
    } else if (!part || part->empty()) {
      wrong = "delta part " + std::to_string(index) + " is empty";
    } else if (job->encoded_bytes + part->size() > job->target_size) {
      // Held until the version is complete: a stream beyond the version's own size is no delta
      // worth passing on (an upstream sends none above kMaxRatio), and is not held in memory.
      wrong = "the delta grew past the version's " + std::to_string(job->target_size) + " bytes at part " +
              std::to_string(index);
    } else {
      job->encoded_bytes += part->size();
      job->parts.push_back(std::move(part));
      if (last) {
        job->total_parts = static_cast<uint32_t>(job->parts.size());
        job->target_done = job->target_size;
      }
    }
  }
  if (!wrong.empty()) {  // a gap would corrupt the peers' streams: they fall back instead
    StopForwarding(job, wrong);
    return false;
  }
  if (last) Finish(job, 0);  // counts it, runs WhenPrepared's callbacks and pumps
  else engine_->Post([this, job] { Pump(job); });
  return true;
}

void DeltaStore::StopForwarding(const std::shared_ptr<DeltaJob>& job, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->done) return;  // complete: its sends finish from the parts held
    job->cancelled = true;
    if (job->error.ok()) job->error = Status::NotFound("the delta received from the upstream broke off here: " + why);
    job->parts.clear();  // its sends stop at the error; a part in flight holds its own reference
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(Key{job->model, job->base_version, job->target_version});
    if (it != jobs_.end() && it->second == job) jobs_.erase(it);
    stats_.cancelled++;
  }
  engine_->Post([this, job] { Pump(job); });
}

bool DeltaStore::TryForward(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info) {
  std::shared_ptr<DeltaJob> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(Key{m.model, m.base_version, info.version});
    if (it == jobs_.end()) return false;
    job = it->second;
  }
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (!job->forwarded || job->base_checksum != m.base_checksum || !job->error.ok()) return false;
  }
  StartSend(job, peer, m, info, "delta against version " + std::to_string(m.base_version) + std::string(kPassedOn));
  return true;
}

// Progress thread: every live send of the job takes what is newly encoded.
void DeltaStore::Pump(const std::shared_ptr<DeltaJob>& job) {
  std::vector<std::shared_ptr<DeltaSend>> sends;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    sends = job->senders;
  }
  for (auto& send : sends) PumpSend(send);
}

// The send is done (all parts sent, or given up): the job stops owning it. REQUIRES: job.mu held.
void DeltaStore::Retire(DeltaJob& job, const std::shared_ptr<DeltaSend>& send) {
  send->finished = true;
  std::erase(job.senders, send);
}

// Progress thread: sends encoded parts while fewer than chunks_in_flight are in flight.
void DeltaStore::PumpSend(const std::shared_ptr<DeltaSend>& send) {
  DeltaJob& job = *send->job;
  for (;;) {
    std::shared_ptr<const std::vector<std::byte>> part;
    Status abandoned;
    bool last = false;  // total_parts grows from unknown while a forwarded job receives: read it here
    {
      std::lock_guard<std::mutex> lock(job.mu);
      if (send->finished) return;
      if (!job.error.ok() && send->next < job.total_parts) {
        abandoned = job.error;
        Retire(job, send);
      } else if (send->in_flight >= options_.chunks_in_flight || send->next >= job.parts.size()) {
        return;
      } else {
        part = job.parts[send->next];
        last = send->next + 1 == job.total_parts;
      }
    }
    if (!abandoned.ok()) {
      log(LogLevel::kInfo, kLog, "delta to peer {} abandoned: {}", send->peer, abandoned.message());
      (void)engine_->Send(send->peer, proto::Encode(proto::Error{send->request_id, proto::ErrorCode::kNotFound,
                                                                  abandoned.message()}));
      return;
    }
    const uint32_t index = send->next++;
    send->in_flight++;
    (void)engine_->Send(send->peer, proto::Encode(proto::DeltaPart{send->request_id, index,
                                                                    static_cast<uint32_t>(part->size()), last}));
    engine_->SendBulk(send->peer, send->tag + index, *part, [this, send, part](const Status& st) {
      DeltaJob& job = *send->job;
      send->in_flight--;
      if (!st.ok()) {
        if (!send->finished) log(LogLevel::kInfo, kLog, "delta to peer {} abandoned: {}", send->peer, st.message());
        std::lock_guard<std::mutex> lock(job.mu);
        Retire(job, send);
        return;
      }
      send->sent_bytes += part->size();
      *egress_ += part->size();
      bool all_sent = false;
      {
        std::lock_guard<std::mutex> lock(job.mu);
        all_sent = send->next == job.total_parts && send->in_flight == 0;
        if (all_sent) Retire(job, send);
      }
      if (all_sent) {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.sent_bytes += send->sent_bytes;
        return;
      }
      PumpSend(send);
    });
  }
}

// A FETCH with a base of a version the producer is still writing waits for the delta (after the
// commit) instead of taking the full bytes as they land only when this model's deltas are
// predicted to pay, as the eager encode predicts it; nothing measured yet: the bytes as they land.
bool DeltaStore::ExpectsDelta(const std::string& model, uint64_t size) const {
  if (options_.delta == DeltaMode::kOff) return false;
  if (options_.delta == DeltaMode::kAlways) return true;
  std::lock_guard<std::mutex> lock(mu_);
  auto ratio = last_ratio_.find(model);
  if (ratio == last_ratio_.end() || encode_rate_ <= 0) return false;
  const double s = static_cast<double>(size), bandwidth = bandwidth_ > 0 ? bandwidth_ : kDefaultBandwidth;
  const double t = std::max({s / encode_rate_, ratio->second * s / bandwidth, s / kDecodeRate});
  return ratio->second <= kMaxRatio && t < s / bandwidth;
}

// The eager encode after a commit is skipped while this model's deltas are predicted not to pay
// (from its last finished delta, the encoder's rate and the bandwidth), except every 8th version,
// which keeps those figures fresh. REQUIRES: mu_ held.
bool DeltaStore::WorthEncodingLocked(const std::string& model, uint64_t size) {
  if (options_.delta == DeltaMode::kAlways) return true;
  auto ratio = last_ratio_.find(model);
  if (ratio == last_ratio_.end() || encode_rate_ <= 0) return true;  // nothing measured: find out
  if (++eager_commits_[model] % 8 == 0) return true;
  const double s = static_cast<double>(size), bandwidth = bandwidth_ > 0 ? bandwidth_ : kDefaultBandwidth;
  const double t = std::max({s / encode_rate_, ratio->second * s / bandwidth, s / kDecodeRate});
  bool worth = ratio->second <= kMaxRatio && t < s / bandwidth;
  if (!worth) stats_.skipped++;
  return worth;
}

void DeltaStore::RecordFullSend(net::PeerId peer, uint64_t bytes, int64_t ns) {
  if (bytes < kMinMeasuredSend || ns <= 0) return;
  const double rate = static_cast<double>(bytes) * 1e9 / static_cast<double>(ns);
  std::lock_guard<std::mutex> lock(mu_);
  // A peer's first full send is cold (its receive buffer faulted in, memory registered) and only
  // marks the peer: measured at 0.18 GB/s against 0.6 warm on one host, it made every later delta
  // of `viper bench --only delta` look 3x better than it was, and with deltas sent from then on
  // no full send corrected it.
  auto [mine, first] = peer_bandwidth_.try_emplace(peer, 0.0);
  if (first) {
    if (peer_bandwidth_.size() > 1024 && peer_bandwidth_.begin() != mine)
      peer_bandwidth_.erase(peer_bandwidth_.begin());  // ids grow: the oldest peer
    return;
  }
  bandwidth_ = Ewma(bandwidth_, rate);
  mine->second = Ewma(mine->second, rate);
}

void DeltaStore::WhenPrepared(const std::string& model, uint64_t version,
                              std::function<void(const PreparedDelta&)> fn) {
  std::shared_ptr<DeltaJob> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = bases_.find(model);
    if (it != bases_.end()) {
      const auto& list = it->second;
      for (size_t i = 1; i < list.size() && !job; ++i) {
        if (list[i].version != version) continue;
        auto j = jobs_.find(Key{model, list[i - 1].version, version});
        if (j != jobs_.end()) job = j->second;
      }
    }
  }
  PreparedDelta none;
  none.why_not = options_.delta_bases == 0 || options_.delta == DeltaMode::kOff
                     ? "deltas are off on this node"
                     : "no delta prepared for version " + std::to_string(version) +
                           " (made only while a remote consumer subscribes, and not for a first version)";
  if (!job) return fn(none);
  PreparedDelta now;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (!job->done && !job->cancelled) {
      job->on_done.push_back(std::move(fn));
      return;
    }
    now.prepared = job->done;
    now.base_version = job->base_version;
    now.bytes = job->done ? job->encoded_bytes : 0;
    now.snapshot_bytes = job->target_size;
    now.encode_ns = job->encode_ns;
    if (!job->done) now.why_not = job->error.message();
  }
  fn(now);
}

DeltaStats DeltaStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace viper
