// Node: bulk sends of a version's bytes to a peer, chunk by chunk with a bounded window.
#include "viper/node.h"

#include <algorithm>
#include <cstring>

#include "net/engine.h"
#include "node_impl.h"
#include "viper/log.h"

namespace viper {

namespace {

constexpr std::string_view kLog = "node";

}  // namespace

void Node::Impl::StartBulkSend(net::PeerId peer, const proto::Fetch& m, const proto::VersionInfo& info,
                               std::shared_ptr<BulkSend> send) {
  send->peer = peer;
  send->request_id = m.request_id;
  send->tag = m.tag;
  if (m.offset >= send->bytes.size())
    return SendError(peer, m.request_id, proto::ErrorCode::kBadRequest,
                     "FETCH offset " + std::to_string(m.offset) + " of " + m.model + " version " +
                         std::to_string(info.version) + ": must be below its size " + std::to_string(send->bytes.size()));
  send->offset = m.offset;
  send->chunk = proto::ClampChunkBytes(m.chunk_bytes, options.chunk_bytes);
  send->chunks = static_cast<uint32_t>((send->bytes.size() - send->offset + send->chunk - 1) / send->chunk);
  send->started_ns = WallClockNs();
  proto::FetchOk ok;
  ok.request_id = m.request_id;
  ok.mode = proto::FetchMode::kSend;
  ok.info = info;
  ok.chunk_bytes = send->chunk;
  ok.chunks = send->chunks;
  ok.detail = send->detail;
  if (send->sealed_later) ok.encoding = proto::Encoding::kFullSealedLater;  // SEALED follows (node_early.cc)
  Send(peer, ok);
  PumpBulkSend(send);
}

// Keeps up to chunks_in_flight chunks in flight; each completion sends the next. A send that
// forwards a version still arriving waits (parked) for the bytes of its next chunk to land.
void Node::Impl::PumpBulkSend(const std::shared_ptr<BulkSend>& send) {
  while (!send->failed && send->next < send->chunks && send->next - send->done < options.chunks_in_flight) {
    if (send->incoming && !NextChunkReady(send)) return;
    uint32_t index = send->next++;
    uint64_t begin = send->offset + static_cast<uint64_t>(index) * send->chunk;
    auto piece = send->bytes.subspan(begin, std::min<uint64_t>(send->chunk, send->bytes.size() - begin));
    bool early = send->incoming != nullptr;  // the version was not complete here yet
    // A version sealed later: the header its writer rewrites at the seal goes from the copy taken
    // as it landed, never from the segment (SEALED brings the final one).
    std::shared_ptr<std::vector<std::byte>> own;
    if (send->sealed_later && send->provisional_header && begin < send->provisional_header->size()) {
      const auto& header = *send->provisional_header;
      const uint64_t from_header = std::min<uint64_t>(header.size() - begin, piece.size());
      own = std::make_shared<std::vector<std::byte>>(piece.size());
      std::memcpy(own->data(), header.data() + begin, from_header);
      std::memcpy(own->data() + from_header, piece.data() + from_header, piece.size() - from_header);
      piece = std::span<const std::byte>(*own);
    }
    engine->SendBulk(send->peer, send->tag + index, piece, [this, send, early, own, n = piece.size()](const Status& st) {
      send->done++;
      if (!st.ok()) {
        if (!send->failed) log(LogLevel::kInfo, kLog, "transfer to peer {} abandoned: {}", send->peer, st.message());
        send->failed = true;
        return;
      }
      bytes_sent += n;
      if (early) bytes_sent_incoming += n;
      if (send->done == send->chunks && !send->failed) fetch_send.Record(WallClockNs() - send->started_ns);
      // A whole transfer of bytes that were here times this peer's path for the delta decision.
      if (!early && send->done == send->chunks && !send->failed && deltas)
        deltas->RecordFullSend(send->peer, send->bytes.size() - send->offset, WallClockNs() - send->started_ns);
      PumpBulkSend(send);
    });
  }
}

}  // namespace viper
