// Client side of delta transfers: FETCH with a base, DELTA_PART receives under a byte budget, and
// decoding parts into the caller's buffer while later ones travel (docs/PROTOCOL.md, DELTA).
#include <algorithm>
#include <chrono>
#include <cstring>

#include "client_impl.h"
#include "viper/delta.h"
#include "viper/log.h"
#include "viper/snapshot.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "client";
// Parts received but not decoded yet, at most (plus one part of any size when none is held).
constexpr uint64_t kInboxBudgetBytes = 64ull << 20;
constexpr uint32_t kMaxParts = 1u << 24;  // the tag space of one FETCH
}  // namespace

void Client::Impl::OnDeltaPart(const proto::DeltaPart& part) {
  std::shared_ptr<DeltaInbox> inbox;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = inboxes.find(part.request_id);
    if (it != inboxes.end()) inbox = it->second;
  }
  if (!inbox) {
    log(LogLevel::kWarn, kLog, "node sent DELTA_PART {} of request {}, which has no open delta stream", part.index,
        part.request_id);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(inbox->mu);
    std::string bad = inbox->last_announced        ? "after the last part"
                      : part.index != inbox->announced ? "out of order (expected part " + std::to_string(inbox->announced) + ")"
                      : part.index >= kMaxParts    ? "beyond the tag space"
                      : part.bytes == 0            ? "empty"
                                                   : "";
    if (!bad.empty()) {
      if (inbox->error.ok())
        inbox->error = Status::Corruption("node sent DELTA_PART " + std::to_string(part.index) + " " + bad);
      inbox->cv.notify_all();
      return;
    }
    inbox->announced++;
    inbox->last_announced = part.last;
    inbox->unposted.emplace_back(part.index, part.bytes);
  }
  PostDeltaReceives(inbox);
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(inbox->mu);
    finished = inbox->discard && inbox->last_announced;
  }
  if (finished) {  // a stream the reader gave up: its last part is drained, forget it
    std::lock_guard<std::mutex> lock(mu);
    inboxes.erase(part.request_id);
  }
}

// Posts receives for announced parts while the budget allows. Any thread.
void Client::Impl::PostDeltaReceives(const std::shared_ptr<DeltaInbox>& inbox) {
  for (;;) {
    std::unique_lock<std::mutex> lock(inbox->mu);
    if (inbox->unposted.empty()) return;
    auto [index, bytes] = inbox->unposted.front();
    if (inbox->outstanding > 0 && inbox->outstanding + bytes > kInboxBudgetBytes && !inbox->discard) return;
    inbox->unposted.pop_front();
    inbox->outstanding += bytes;
    lock.unlock();
    auto buffer = delta_buffers->Acquire(bytes);
    buffer->resize(bytes);
    engine->RecvBulk(node, inbox->tag + index, *buffer, [inbox, buffer, index](const Status& st) {
      std::lock_guard<std::mutex> held(inbox->mu);
      inbox->completed++;
      if (!st.ok()) {
        if (inbox->error.ok()) inbox->error = st.WithContext("delta part " + std::to_string(index));
      } else {
        inbox->received_bytes += buffer->size();
      }
      if (st.ok() && !inbox->discard) {
        inbox->ready.emplace(index, buffer);
      } else {
        inbox->outstanding -= buffer->size();
      }
      inbox->cv.notify_all();
    });
  }
}

bool Client::Impl::OnDeltaError(const proto::Error& error) {
  std::shared_ptr<DeltaInbox> inbox;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = inboxes.find(error.request_id);
    if (error.request_id == 0 || it == inboxes.end() || pending.count(error.request_id) != 0) return false;
    inbox = it->second;
    inboxes.erase(it);  // the node sends nothing more for this request
  }
  std::lock_guard<std::mutex> lock(inbox->mu);
  if (inbox->error.ok()) inbox->error = StatusFromError(error);
  inbox->cv.notify_all();
  return true;
}

// The reader is done with the stream. A stream given up midway stays registered in discard mode
// until its last part is announced, so that the node's remaining sends complete (and are dropped)
// instead of waiting on this connection.
void Client::Impl::CloseInbox(uint64_t request_id, const std::shared_ptr<DeltaInbox>& inbox) {
  {
    std::lock_guard<std::mutex> lock(inbox->mu);
    inbox->discard = true;
    for (auto& [index, bytes] : inbox->ready) inbox->outstanding -= bytes->size();
    inbox->ready.clear();
  }
  PostDeltaReceives(inbox);  // drains what was announced: those sends complete and are dropped
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(inbox->mu);
    more = !inbox->last_announced && inbox->error.ok();
  }
  if (more) return;  // stays registered: later parts are received and dropped (OnDeltaPart)
  std::lock_guard<std::mutex> lock(mu);
  auto it = inboxes.find(request_id);
  if (it != inboxes.end() && it->second == inbox) inboxes.erase(it);
}

Result<DeltaFetch> Client::FetchSendWithBase(const std::string& model, uint64_t version, const DeltaBase& base,
                                             const BufferProvider& provide, const ProgressFn& progress,
                                             TransferPrefix* resume, bool* answered_with_delta,
                                             const DeltaPartFn& on_part) {
  if (resume != nullptr) *resume = TransferPrefix{};  // this transfer starts from the beginning
  uint64_t tag = impl_->next_tag.fetch_add(1ull << 24);
  auto inbox = std::make_shared<DeltaInbox>();
  inbox->tag = tag;
  uint64_t id = 0;
  std::shared_ptr<Arrivals> state;
  auto registered = [&](uint64_t rid) {
    id = rid;
    state = impl_->TrackTransfer(rid);  // for a full answer (an ERROR may abort it)
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->inboxes[rid] = inbox;  // for a delta answer (its parts follow FETCH_OK at once)
  };
  proto::Fetch fetch{0, model, version, proto::FetchMode::kSend, tag, 0, base.version, base.checksum};
  auto answered = impl_->RequestSend(fetch, registered);
  if (!answered.ok() || answered->encoding != proto::Encoding::kDelta) {
    if (id != 0) impl_->ForgetInbox(id);
  }
  if (!answered.ok()) {
    if (id != 0) impl_->ForgetTransfer(id);
    return answered.status();
  }
  proto::FetchOk ok = std::move(answered).value();
  if (answered_with_delta != nullptr) *answered_with_delta = ok.encoding == proto::Encoding::kDelta;
  if (ok.encoding != proto::Encoding::kDelta) {  // full, or full and sealed later
    DeltaFetch out;
    auto received = impl_->ReceiveChunks(std::move(ok), tag, state, provide, progress, &out.data_checksum, resume);
    impl_->ForgetTransfer(id);
    if (!received.ok()) return received.status();
    out.ok = std::move(received).value();
    out.wire_bytes = out.ok.info.size;
    return out;
  }
  impl_->ForgetTransfer(id);
  auto received = impl_->ReceiveDelta(ok, inbox, base, provide, progress, on_part);
  impl_->CloseInbox(ok.request_id, inbox);
  return received;
}

void Client::Impl::ForgetInbox(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu);
  inboxes.erase(request_id);
}

// Decodes the parts in order as they arrive; hashes the data region as its prefix is decoded.
Result<DeltaFetch> Client::Impl::ReceiveDelta(const proto::FetchOk& ok, const std::shared_ptr<DeltaInbox>& inbox,
                                              const DeltaBase& base, const BufferProvider& provide,
                                              const ProgressFn& progress, const DeltaPartFn& on_part) {
  const uint64_t size = ok.info.size;
  const std::string what = ok.info.model + " version " + std::to_string(ok.info.version) + " as a delta against " +
                           std::to_string(ok.base_version);
  if (ok.base_version != base.version)
    return Status::Corruption(what + ": the node answered with a delta against another base than " +
                              std::to_string(base.version));
  VIPER_ASSIGN_OR_RETURN(std::span<std::byte> buffer, provide(ok.info));
  if (buffer.size() < size) return Status::Internal("receive buffer smaller than the version");
  buffer = buffer.first(size);
  DeltaDecoder decoder(base.bytes, base.checksum, buffer);
  std::optional<Checksum64Stream> stream;
  uint64_t data_begin = UINT64_MAX, hashed = 0;
  auto hash_decoded = [&] {
    const uint64_t done = decoder.decoded_bytes();
    if (data_begin == UINT64_MAX && done >= 8) {
      uint64_t n = 0;
      std::memcpy(&n, buffer.data(), 8);
      data_begin = n <= size - 8 ? 8 + n : size;  // a hostile length just hashes nothing: Parse rejects it
      if (n <= size - 8) stream.emplace();
      hashed = data_begin;
    }
    if (stream && done > hashed) {
      stream->Update(buffer.subspan(hashed, done - hashed));
      hashed = done;
    }
  };
  DeltaFetch out;
  out.ok = ok;
  uint32_t next = 0;
  bool last = false;
  std::unique_lock<std::mutex> lock(inbox->mu);
  auto deadline = std::chrono::steady_clock::now() + options.timeout;
  while (!last) {
    bool woke = inbox->cv.wait_until(lock, deadline, [&] { return !inbox->error.ok() || inbox->ready.count(next) != 0; });
    if (!inbox->error.ok()) return inbox->error.WithContext(what);
    if (!woke)
      return Status::Timeout(what + ": stalled after " + std::to_string(decoder.decoded_bytes()) + " of " +
                             std::to_string(size) + " bytes");
    std::shared_ptr<std::vector<std::byte>> part = std::move(inbox->ready[next]);
    inbox->ready.erase(next);
    last = inbox->last_announced && next + 1 == inbox->announced;
    lock.unlock();
    if (on_part) on_part(next, part, last);  // passed on before this decode: downstream decodes alongside
    Status fed = decoder.Feed(*part);
    const size_t part_bytes = part->size();
    out.wire_bytes += part_bytes;
    {
      std::lock_guard<std::mutex> held(inbox->mu);
      inbox->outstanding -= part_bytes;
    }
    part.reset();  // back to the pool (unless passed on) before the next receives are posted
    PostDeltaReceives(inbox);
    if (!fed.ok()) return fed.WithContext(what);
    hash_decoded();
    if (progress) progress(decoder.decoded_bytes(), size);
    deadline = std::chrono::steady_clock::now() + options.timeout;  // progress resets the timer
    ++next;
    lock.lock();
  }
  lock.unlock();
  if (!decoder.complete())
    return Status::Corruption(what + ": the stream ended after " + std::to_string(decoder.decoded_bytes()) + " of " +
                              std::to_string(size) + " bytes");
  if (stream) out.data_checksum = stream->Digest();
  log(LogLevel::kDebug, kLog, "{}: {} delta bytes for {}", what, out.wire_bytes, size);
  return out;
}

}  // namespace viper
