// Subscriber: resuming a remote transfer that broke midway from its landed prefix at the next
// holder tried (a FETCH with an offset), instead of fetching the whole version again.
#include <utility>

#include "subscriber_impl.h"
#include "viper/log.h"
#include "viper/node.h"

namespace viper {

namespace {
constexpr std::string_view kLog = "subscriber";

// The buffer of a version finished from a prefix: the connections whose engines may still hold
// receives posted into it close before the buffer goes back (to the pool or the landing zone).
struct ResumedBuffer {
  std::shared_ptr<const void> owner;
  std::vector<std::shared_ptr<Client>> posted;
  ~ResumedBuffer() { posted.clear(); }
};
}  // namespace

void Subscriber::Impl::KeepPartial(TransferPrefix prefix, internal::BufferPool::Lease buffer, ProgressFn landed,
                                   const std::string& from, const std::shared_ptr<Client>& shared) {
  DropPartial();
  Partial p;
  p.first_landed = prefix.landed;
  p.prefix = std::move(prefix);
  p.buffer = std::move(buffer);
  p.landed = std::move(landed);
  p.from = from;
  if (shared) p.posted.push_back(shared);
  log(LogLevel::kInfo, kLog, "{} version {}: transfer from {} broke after {} of {} bytes; the next holder resumes there",
      options.model, p.prefix.info.version, from, p.prefix.landed, p.prefix.info.size);
  partial = std::move(p);
}

void Subscriber::Impl::DropPartial() {
  if (!partial) return;
  for (const auto& c : partial->posted) retired_buffers.emplace_back(c, partial->buffer.owner);
  partial.reset();
  std::erase_if(retired_buffers, [](const auto& r) { return r.first.expired(); });
}

Result<std::shared_ptr<ModelVersion>> Subscriber::Impl::LoadResumed(const proto::VersionInfo& info, Client& client,
                                                                    const std::shared_ptr<Client>& shared) {
  Partial& p = *partial;
  const TransferPrefix& prefix = p.prefix;
  if (prefix.info.version != info.version || prefix.info.size != info.size || prefix.info.checksum != info.checksum) {
    DropPartial();
    return LoadRemote(info, client, shared);
  }
  const uint64_t offset = prefix.landed;
  std::optional<uint64_t> received_checksum;
  auto no_buffer = [](const proto::VersionInfo&) -> Result<std::span<std::byte>> {
    return Status::Internal("a resumed transfer lands in its prefix's buffer");
  };
  auto ok = client.FetchSend(
      info.model, info.version, no_buffer, [&](uint64_t done, uint64_t total) { if (p.landed) p.landed(done, total); },
      options.verify_checksum ? &received_checksum : nullptr, &p.prefix);
  if (!ok.ok()) {
    if (shared) p.posted.push_back(shared);  // its receives may still be posted into the buffer
    if (ok.status().code() == StatusCode::kInvalidArgument && offset == p.prefix.landed) {
      // A node that predates FETCH offsets refuses it as Malformed: it can still send it all.
      log(LogLevel::kWarn, kLog, "{} version {}: {} cannot resume at byte {} ({}); fetching it whole there",
          options.model, info.version, client.address(), offset, ok.status().message());
      DropPartial();
      return LoadRemote(info, client, shared);
    }
    return ok.status();
  }
  auto mv = std::make_shared<ModelVersion>();
  mv->info = ok->info;
  mv->path = FetchPath::kRemote;
  mv->wire_bytes = ok->info.size - offset;
  mv->reason = "resumed at byte " + std::to_string(offset) + " of " + std::to_string(ok->info.size) +
               " (the first " + std::to_string(p.first_landed) + " landed from " + p.from + ")";
  mv->timings.fetched_ns = WallClockNs();
  auto owner = std::make_shared<ResumedBuffer>();
  owner->owner = p.buffer.owner;
  owner->posted = std::move(p.posted);
  std::span<std::byte> bytes = p.buffer.data;
  partial.reset();
  VIPER_RETURN_IF_ERROR(Finish(*mv, bytes, owner, options.verify_checksum, received_checksum));
  return mv;
}

}  // namespace viper
