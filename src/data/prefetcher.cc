// Prefetcher: reader threads, the bounded buffer, the consumer side and the tuner thread.
// Contract: include/viper/prefetch.h; the tuner's rules: src/data/autotuner.h.
//
// Everything shared lives under one mutex (Impl::mu): a reader takes it twice per sample (claim,
// deliver), the consumer once per sample, so at the rates that matter (thousands of samples per
// second) it is never contended for long; the reads themselves run unlocked.
#include "viper/prefetch.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <numeric>
#include <random>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "autotuner.h"
#include "viper/log.h"

namespace viper {

using Clock = std::chrono::steady_clock;

SampleBuffer SampleBuffer::Allocate(size_t size) {
  size_t rounded = std::max<size_t>(64, (size + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  SampleBuffer b;
  b.data_.reset(static_cast<std::byte*>(p));
  b.size_ = size;
  return b;
}

Result<OnError> ParseOnError(std::string_view name) {
  if (name == "fail") return OnError::kFail;
  if (name == "skip") return OnError::kSkip;
  return Status::InvalidArgument(fmt::format("on_error must be 'fail' or 'skip', got '{}'", name));
}

std::string_view on_error_name(OnError on_error) { return on_error == OnError::kSkip ? "skip" : "fail"; }

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One read's outcome, waiting for the consumer in its epoch's queue.
struct Item {
  std::optional<Sample> sample;  // set: a sample; unset and error ok: skipped
  Status error;
  uint64_t bytes = 0;            // reserved for it until the consumer takes it
};

// Time integrated over the threads in a state (waiting consumers, blocked readers), readable while
// some are still in it: a consumer stuck for a whole window must show in that window.
struct StateClock {
  size_t inside = 0;
  Clock::time_point mark = Clock::now();
  Clock::duration total{0};
  Clock::duration Total(Clock::time_point now) {
    total += (now - mark) * static_cast<int64_t>(inside);
    mark = now;
    return total;
  }
  void Enter() { Total(Clock::now()), inside++; }
  void Leave() { Total(Clock::now()), inside--; }
};

// What a reader took from the epoch plan.
struct Claim {
  uint64_t id = 0, epoch = 0, position = 0, bytes = 0;
};

}  // namespace

struct Prefetcher::Impl {
  std::shared_ptr<const SampleSource> source;
  PrefetchOptions opt;
  std::vector<uint64_t> ids;  // one epoch's samples, before shuffling
  Clock::time_point start = Clock::now();

  mutable std::mutex mu;
  // Readers wait on readers_cv while they may claim (index < target_readers) and on parked_cv while
  // they may not: a notify_one for "room to claim" must reach a reader that can use it. Parked
  // readers are woken (all of them) only when target_readers grows, or at Close.
  std::condition_variable readers_cv, parked_cv, consumer_cv, tuner_cv;
  bool stopped = false;       // Close(): every thread leaves
  bool stop_claims = false;   // a failure: no new reads

  // The plan: readers claim positions of claim_epoch in order.
  uint64_t claim_epoch = 0, claim_pos = 0;
  std::vector<uint64_t> claim_order;
  bool claims_done = false;
  size_t reserved_samples = 0;  // being read or ready
  uint64_t reserved_bytes = 0, peak_bytes = 0;
  size_t target_readers = 1, buffer_samples = 1;
  bool limits_changed = false;  // SetLimits: the tuner restarts from the setting within the new caps

  // Delivery: per epoch, the finished reads by position.
  std::map<uint64_t, std::map<uint64_t, Item>> ready;
  size_t ready_samples = 0;
  uint64_t cur_epoch = 0, cur_taken = 0;
  bool finished = false;
  Status failed;
  bool closed = false;

  // Counters (for stats and the tuner).
  uint64_t delivered = 0, completed = 0, completed_bytes = 0, skipped = 0;
  std::string last_skip_error;
  StateClock consumer_wait, reader_blocked;
  size_t window_min_ready = SIZE_MAX;
  std::vector<TunerEvent> events;

  std::vector<std::thread> readers;
  std::thread tuner_thread;
  std::mutex close_mu;
  bool joined = false;

  // This rank's share of an epoch (positions rank, rank + world_size, ... of the permutation).
  uint64_t epoch_len() const { return (ids.size() - opt.rank + opt.world_size - 1) / opt.world_size; }
  void PlanEpoch(uint64_t epoch);
  bool CanClaim() const;
  Claim ClaimNext();
  Item ReadOne(const Claim& c) const;
  void Deliver(const Claim& c, Item item);
  void ReaderLoop(size_t index);
  void TunerLoop();
  void SpawnReaders(size_t n);
  // The consumer's side, under mu: the next sample, nullopt at the end of the epoch (without
  // moving past it: AdvanceEpoch does), Timeout at the deadline.
  Result<std::optional<Sample>> NextLocked(std::unique_lock<std::mutex>& lk, std::optional<Clock::time_point> deadline);
  void AdvanceEpoch();
  void Release(uint64_t bytes);
};

void Prefetcher::Impl::PlanEpoch(uint64_t epoch) {
  claim_epoch = epoch;
  claim_pos = 0;
  claim_order = ids;
  if (opt.shuffle) {
    std::mt19937_64 rng(opt.seed * 0x9E3779B97F4A7C15ull + epoch);
    std::shuffle(claim_order.begin(), claim_order.end(), rng);
  }
  if (opt.world_size > 1) {
    std::vector<uint64_t> mine;
    mine.reserve(epoch_len());
    for (size_t i = opt.rank; i < claim_order.size(); i += opt.world_size) mine.push_back(claim_order[i]);
    claim_order = std::move(mine);
  }
}

bool Prefetcher::Impl::CanClaim() const {
  if (claims_done || stop_claims || reserved_samples >= buffer_samples) return false;
  if (reserved_samples == 0) return true;  // one sample always fits, however large
  return reserved_bytes + source->bytes(claim_order[claim_pos]) <= opt.max_buffer_bytes;
}

Claim Prefetcher::Impl::ClaimNext() {
  Claim c{claim_order[claim_pos], claim_epoch, claim_pos, source->bytes(claim_order[claim_pos])};
  reserved_samples++;
  reserved_bytes += c.bytes;
  peak_bytes = std::max(peak_bytes, reserved_bytes);
  if (++claim_pos == claim_order.size()) {
    if (opt.epochs == 0 || claim_epoch + 1 < opt.epochs) {
      PlanEpoch(claim_epoch + 1);
    } else {
      claims_done = true;
    }
  }
  return c;
}

Item Prefetcher::Impl::ReadOne(const Claim& c) const {
  Item item;
  item.bytes = c.bytes;
  Status st = source->Check(c.id);
  if (st.ok()) {
    try {
      Sample s{c.id, c.epoch, c.position, source->label(c.id), SampleBuffer::Allocate(c.bytes)};
      st = source->ReadInto(c.id, {s.bytes.data(), s.bytes.size()});
      if (st.ok()) item.sample = std::move(s);
    } catch (const std::bad_alloc&) {
      st = Status::ResourceExhausted(fmt::format("{}: cannot allocate {} bytes for it", source->Describe(c.id), c.bytes));
    }
  }
  item.error = st;
  return item;
}

// The reservation of a skipped or failed read ends when it is delivered; a sample's when the
// consumer takes it.
void Prefetcher::Impl::Release(uint64_t bytes) {
  reserved_samples--;
  reserved_bytes -= bytes;
  readers_cv.notify_one();
}

void Prefetcher::Impl::Deliver(const Claim& c, Item item) {
  completed++;
  if (item.sample) {
    completed_bytes += c.bytes;
    ready_samples++;
  } else {
    if (!item.error.ok() && opt.on_error == OnError::kSkip) {
      skipped++;
      last_skip_error = item.error.ToString();
      log(LogLevel::kInfo, "prefetch", "skipping {}", last_skip_error);
      item.error = Status::OK();
    }
    if (!item.error.ok()) stop_claims = true;
    Release(c.bytes);
    item.bytes = 0;
  }
  ready[c.epoch].emplace(c.position, std::move(item));
  consumer_cv.notify_all();
}

void Prefetcher::Impl::ReaderLoop(size_t index) {
  std::unique_lock<std::mutex> lk(mu);
  while (true) {
    while (!stopped && !(index < target_readers && CanClaim())) {
      if (index >= target_readers) {
        parked_cv.wait(lk);
        continue;
      }
      // Time an active reader spends held back by a full buffer is what the tuner calls blocked.
      bool held_back = !claims_done && !stop_claims;
      if (held_back) reader_blocked.Enter();
      readers_cv.wait(lk);
      if (held_back) reader_blocked.Leave();
    }
    if (stopped) return;
    Claim c = ClaimNext();
    if (CanClaim()) readers_cv.notify_one();  // room for another reader: pass the wake-up on
    lk.unlock();
    Item item = ReadOne(c);
    lk.lock();
    Deliver(c, std::move(item));
  }
}

void Prefetcher::Impl::SpawnReaders(size_t n) {
  while (readers.size() < n) {
    size_t index = readers.size();
    readers.emplace_back([this, index] { ReaderLoop(index); });
  }
}

void Prefetcher::Impl::TunerLoop() {
  std::unique_lock<std::mutex> lk(mu);  // SetLimits writes the setting and the caps under it
  data_internal::AutoTuner tuner({target_readers, buffer_samples},
                                 {opt.max_readers, opt.max_buffer_samples, opt.max_buffer_bytes});
  Clock::time_point t0 = Clock::now();
  uint64_t delivered0 = delivered, completed0 = completed, bytes0 = completed_bytes;
  Clock::duration wait0 = consumer_wait.Total(t0), blocked0 = reader_blocked.Total(t0);
  window_min_ready = SIZE_MAX;
  std::string reason;
  while (!stopped) {
    tuner_cv.wait_for(lk, opt.tune_interval);
    if (std::exchange(limits_changed, false)) {
      tuner = data_internal::AutoTuner({target_readers, buffer_samples},
                                       {opt.max_readers, opt.max_buffer_samples, opt.max_buffer_bytes});
    }
    Clock::time_point now = Clock::now();
    Clock::duration elapsed = now - t0;
    if (stopped || elapsed < opt.tune_interval) continue;
    if (delivered - delivered0 < 16 && elapsed < 4 * opt.tune_interval) continue;
    data_internal::TunerWindow w;
    w.seconds = Seconds(elapsed);
    Clock::duration waited = consumer_wait.Total(now), blocked = reader_blocked.Total(now);
    w.consumer_wait_seconds = Seconds(waited - wait0);
    w.delivered = delivered - delivered0;
    w.completed = completed - completed0;
    w.completed_bytes = completed_bytes - bytes0;
    w.reader_blocked_seconds = Seconds(blocked - blocked0);
    w.min_ready = window_min_ready == SIZE_MAX ? 0 : window_min_ready;
    data_internal::TunerSetting s = tuner.Step(w, &reason);
    if (s.readers != target_readers || s.buffer_samples != buffer_samples) {
      target_readers = s.readers;
      buffer_samples = s.buffer_samples;
      if (events.size() < 1000) {
        events.push_back({Seconds(Clock::now() - start), s.readers, s.buffer_samples,
                          w.consumer_wait_seconds / w.seconds, w.completed / w.seconds, reason});
      }
      log(LogLevel::kDebug, "prefetch", "tuner: {}", reason);
      readers_cv.notify_all();  // readers now above the target park
      parked_cv.notify_all();   // and those now below it claim
      if (readers.size() < target_readers) {
        lk.unlock();
        std::optional<std::string> failed;
        try {
          SpawnReaders(s.readers);  // only this thread and Start spawn; Close joins this one first
        } catch (const std::system_error& e) {
          failed = e.what();
        }
        lk.lock();
        if (failed) {  // keep the readers there are
          log(LogLevel::kWarn, "prefetch", "tuner: cannot start reader {}: {}", readers.size(), *failed);
          target_readers = readers.size();
        }
      }
    }
    t0 = now;
    delivered0 = delivered, completed0 = completed, bytes0 = completed_bytes;
    wait0 = waited, blocked0 = blocked;
    window_min_ready = SIZE_MAX;
  }
}

void Prefetcher::Impl::AdvanceEpoch() {
  ready.erase(cur_epoch);
  cur_epoch++;
  cur_taken = 0;
  if (opt.epochs != 0 && cur_epoch >= opt.epochs) finished = true;
}

Result<std::optional<Sample>> Prefetcher::Impl::NextLocked(std::unique_lock<std::mutex>& lk,
                                                           std::optional<Clock::time_point> deadline) {
  while (true) {
    if (!failed.ok()) return failed;
    if (closed) return Status::Cancelled("prefetcher: closed");
    if (finished || cur_taken == epoch_len()) return std::optional<Sample>();
    auto& queue = ready[cur_epoch];
    auto it = queue.begin();
    if (it != queue.end() && (!opt.ordered || it->first == cur_taken)) {
      Item item = std::move(it->second);
      queue.erase(it);
      cur_taken++;
      if (!item.error.ok()) {
        failed = item.error;
        return failed;
      }
      if (!item.sample) continue;  // skipped
      window_min_ready = std::min(window_min_ready, ready_samples);
      ready_samples--;
      delivered++;
      Release(item.bytes);
      return std::move(item.sample);
    }
    consumer_wait.Enter();
    bool timed_out = false;
    if (!deadline) {
      consumer_cv.wait(lk);
    } else {
      timed_out = consumer_cv.wait_until(lk, *deadline) == std::cv_status::timeout;
    }
    consumer_wait.Leave();
    if (timed_out) return Status::Timeout("prefetcher: no sample became ready in time");
  }
}

// ---------------------------------------------------------------- public side

Prefetcher::Prefetcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Prefetcher::~Prefetcher() { Close(); }

namespace {

Status ValidateOptions(const SampleSource& source, const PrefetchOptions& o) {
  auto bad = [](std::string what) { return Status::InvalidArgument("PrefetchOptions: " + what); };
  if (o.max_readers < 1 || o.max_readers > 1024) return bad(fmt::format("max_readers must be in [1, 1024], got {}", o.max_readers));
  if (o.readers < 1 || o.readers > o.max_readers) {
    return bad(fmt::format("readers must be in [1, max_readers = {}], got {}", o.max_readers, o.readers));
  }
  if (o.max_buffer_samples < 1) return bad("max_buffer_samples must be >= 1");
  if (o.buffer_samples < 1 || o.buffer_samples > o.max_buffer_samples) {
    return bad(fmt::format("buffer_samples must be in [1, max_buffer_samples = {}], got {}", o.max_buffer_samples,
                           o.buffer_samples));
  }
  if (o.max_buffer_bytes < 1) return bad("max_buffer_bytes must be >= 1");
  if (o.tune_interval.count() < 1) return bad("tune_interval must be >= 1 ms");
  for (uint64_t id : o.ids) {
    if (id >= source.size()) return bad(fmt::format("id {} is out of range: the source has {} samples", id, source.size()));
  }
  if (o.ids.empty() && source.size() == 0) return bad("the source has no samples");
  const uint64_t samples = o.ids.empty() ? source.size() : o.ids.size();
  if (o.world_size < 1 || o.world_size > samples) {
    return bad(fmt::format("world_size must be in [1, samples = {}], got {}", samples, o.world_size));
  }
  if (o.rank >= o.world_size) return bad(fmt::format("rank must be in [0, world_size = {}), got {}", o.world_size, o.rank));
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<Prefetcher>> Prefetcher::Start(std::shared_ptr<const SampleSource> source,
                                                      const PrefetchOptions& options) {
  if (!source) return Status::InvalidArgument("Prefetcher::Start: no source");
  VIPER_RETURN_IF_ERROR(ValidateOptions(*source, options));
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(source);
  impl->opt = options;
  impl->ids = options.ids;
  if (impl->ids.empty()) {
    impl->ids.resize(impl->source->size());
    std::iota(impl->ids.begin(), impl->ids.end(), 0);
  }
  impl->target_readers = options.readers;
  impl->buffer_samples = options.buffer_samples;
  impl->PlanEpoch(0);
  std::unique_ptr<Prefetcher> p(new Prefetcher(std::move(impl)));
  Impl& i = *p->impl_;
  try {
    i.SpawnReaders(options.readers);
    if (options.autotune) i.tuner_thread = std::thread([&i] { i.TunerLoop(); });
  } catch (const std::system_error& e) {
    p->Close();  // joins the threads that did start
    return Status::ResourceExhausted(fmt::format("prefetcher: cannot start its threads: {}", e.what()));
  }
  return p;
}

void Prefetcher::Close() {
  Impl& i = *impl_;
  std::lock_guard<std::mutex> once(i.close_mu);
  if (i.joined) return;
  {
    std::lock_guard<std::mutex> lk(i.mu);
    i.stopped = true;
    i.closed = true;
  }
  i.readers_cv.notify_all();
  i.parked_cv.notify_all();
  i.consumer_cv.notify_all();
  i.tuner_cv.notify_all();
  if (i.tuner_thread.joinable()) i.tuner_thread.join();
  for (auto& t : i.readers) t.join();
  i.joined = true;
}

Result<std::optional<Sample>> Prefetcher::Next(std::chrono::nanoseconds timeout) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  std::optional<Clock::time_point> deadline;
  if (timeout != std::chrono::nanoseconds::max()) deadline = Clock::now() + timeout;
  auto r = impl_->NextLocked(lk, deadline);
  if (r.ok() && !r->has_value() && !impl_->finished) impl_->AdvanceEpoch();
  return r;
}

Result<std::vector<Sample>> Prefetcher::NextBatch(size_t n) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  std::vector<Sample> batch;
  batch.reserve(n);
  while (batch.size() < n) {
    VIPER_ASSIGN_OR_RETURN(std::optional<Sample> s, impl_->NextLocked(lk, std::nullopt));
    if (!s) {
      if (batch.empty() && !impl_->finished) impl_->AdvanceEpoch();
      break;
    }
    batch.push_back(std::move(*s));
  }
  return batch;
}

Status Prefetcher::SetLimits(size_t max_readers, uint64_t max_buffer_bytes) {
  if (max_readers < 1 || max_readers > 1024) {
    return Status::InvalidArgument(fmt::format("max_readers must be in [1, 1024], got {}", max_readers));
  }
  if (max_buffer_bytes < 1) return Status::InvalidArgument("max_buffer_bytes must be >= 1");
  Impl& i = *impl_;
  std::unique_lock<std::mutex> lk(i.mu);
  i.opt.max_readers = max_readers;
  i.opt.max_buffer_bytes = max_buffer_bytes;
  i.target_readers = std::min(i.target_readers, max_readers);
  i.limits_changed = true;
  // Without the tuner nothing else would start readers up to a raised cap: the setting is the cap.
  bool spawn = !i.opt.autotune && i.readers.size() < max_readers && !i.stopped;
  if (!i.opt.autotune) i.target_readers = max_readers;
  i.readers_cv.notify_all();  // readers now above the target park
  i.parked_cv.notify_all();   // and those now below it claim
  i.tuner_cv.notify_all();
  if (spawn) {
    lk.unlock();
    std::lock_guard<std::mutex> once(i.close_mu);  // Close joins the readers: not while spawning
    if (i.joined) return Status::OK();
    try {
      i.SpawnReaders(max_readers);
    } catch (const std::system_error& e) {
      return Status::ResourceExhausted(fmt::format("prefetcher: cannot start a reader: {}", e.what()));
    }
  }
  return Status::OK();
}

bool Prefetcher::finished() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->finished;
}

uint64_t Prefetcher::epoch_size() const { return impl_->epoch_len(); }

PrefetchStats Prefetcher::stats() const {
  const Impl& i = *impl_;
  std::lock_guard<std::mutex> lk(i.mu);
  PrefetchStats s;
  s.delivered = i.delivered;
  s.skipped = i.skipped;
  s.last_skip_error = i.last_skip_error;
  s.bytes_read = i.completed_bytes;
  s.epoch = i.cur_epoch;
  s.consumer_wait_seconds = Seconds(i.consumer_wait.total);
  s.readers = i.target_readers;
  s.buffer_samples = i.buffer_samples;
  s.max_readers = i.opt.max_readers;
  s.max_buffer_bytes = i.opt.max_buffer_bytes;
  s.ready = i.ready_samples;
  s.buffered_bytes = i.reserved_bytes;
  s.peak_buffered_bytes = i.peak_bytes;
  s.tuner = i.events;
  return s;
}

}  // namespace viper
