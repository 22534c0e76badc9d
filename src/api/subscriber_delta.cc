// Subscriber side of delta transfers: the live version is offered to the node as the base; a
// delta is decoded into a spare buffer and verified before it goes live (docs/ARCHITECTURE.md
// "Delta updates").
#include "seal.h"
#include "subscriber_impl.h"
#include "viper/log.h"
#include "viper/node.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "subscriber";
}  // namespace

std::optional<Subscriber::Impl::DeltaAttempt> Subscriber::Impl::LoadRemoteDelta(const proto::VersionInfo& info,
                                                                                 Client& client,
                                                                                 const std::shared_ptr<Client>& shared) {
  std::shared_ptr<const ModelVersion> base = live.load();  // held: its bytes are the base while decoding
  if (!options.delta || !base || base->version() >= info.version || base->info.checksum == 0 ||
      base->snapshot.bytes().size() != base->info.size)
    return std::nullopt;
  DeltaBase offered{base->version(), base->info.checksum, base->snapshot.bytes()};
  internal::BufferPool::Lease buffer;
  ProgressFn landed;  // a landing zone (relay) forwards the decoded prefix as it grows
  bool as_delta = false;  // set by the client from FETCH_OK before it asks for the buffer
  DeltaPartFn pass_on;    // a landing zone (relay) passes the delta's parts on as they arrive
  auto provide = [&](const proto::VersionInfo& actual) {
    return ReceiveBuffer(actual, &buffer, &landed, as_delta ? &offered : nullptr, &pass_on);
  };
  TransferPrefix prefix;
  // The version's bytes (received, or decoded from the delta) go to this consumer's GPU as their
  // prefix grows, as in LoadRemote.
  std::shared_ptr<DeviceStaging> staging = gpu ? StageOnDevice(info, client) : nullptr;
  auto fetched = client.FetchSendWithBase(info.model, info.version, offered, provide,
                                          [&](uint64_t done, uint64_t total) {
                                            if (landed) landed(done, total);
                                            if (staging) StageReceived(*staging, buffer.data, done, total);
                                          },
                                          &prefix, &as_delta,
                                          [&](uint32_t index, std::shared_ptr<const std::vector<std::byte>> part,
                                              bool last) {
                                            if (pass_on) pass_on(index, std::move(part), last);
                                          });
  if (!fetched.ok()) {
    // A full answer that broke after some chunks landed is finished by the next holder (resume).
    StatusCode code = fetched.status().code();
    if (prefix.landed > 0 && buffer.owner) {
      KeepPartial(std::move(prefix), std::move(buffer), std::move(landed), client.address(), shared);
      return DeltaAttempt{fetched.status(), false};
    }
    // A full answer that stalled or lost its connection may still have receives posted into the
    // buffer (see LoadRemote); a delta's parts land in the client's own memory, never in it.
    if (code == StatusCode::kTimeout || code == StatusCode::kUnavailable) poisoned_buffer = std::move(buffer.owner);
    // A delta that did not decode, or that the node gave up after it started (base evicted), is
    // fetched in full. A FETCH the node refused before any FETCH_OK (it has no such version) is
    // not: the same request in full would get the same answer.
    bool retry = code == StatusCode::kCorruption || (code == StatusCode::kNotFound && as_delta);
    return DeltaAttempt{fetched.status(), retry};
  }
  const bool delta = fetched->ok.encoding == proto::Encoding::kDelta;
  auto mv = std::make_shared<ModelVersion>();
  mv->info = fetched->ok.info;
  mv->path = FetchPath::kRemote;
  mv->wire_bytes = fetched->wire_bytes;
  mv->delta_base = delta ? fetched->ok.base_version : 0;
  mv->reason = delta ? fetched->ok.detail + " (" + std::to_string(fetched->wire_bytes) + " bytes received)"
                     : "full: " + fetched->ok.detail;
  if (fetched->ok.encoding == proto::Encoding::kFullSealedLater) {
    // Received while the node's producer (or upstream) still wrote it: its identity came last.
    if (Status sealed = internal::CheckSeal(options.token, fetched->ok.info, "node " + client.address()); !sealed.ok())
      return DeltaAttempt{sealed, false};
    mv->reason = std::string(kSealedLaterReason) + "; " + mv->reason;
  }
  mv->timings.fetched_ns = WallClockNs();
  // A decoded delta is always verified: it is made from two inputs and our own decoder.
  Status st = Finish(*mv, buffer.data, buffer.owner, delta || options.verify_checksum, fetched->data_checksum);
  if (!st.ok()) {
    if (!delta) return DeltaAttempt{st, false};
    return DeltaAttempt{st.WithContext(info.model + " version " + std::to_string(info.version) +
                                       " decoded from its delta against " + std::to_string(mv->delta_base)),
                        true};
  }
  if (delta)
    log(LogLevel::kDebug, kLog, "{} version {}: delta of {} bytes against {}", info.model, info.version,
        fetched->wire_bytes, mv->delta_base);
  if (staging) FinishStaging(*staging, *mv);
  return DeltaAttempt{std::move(mv), false};
}

}  // namespace viper
