// libFuzzer target for what either side of the bootstrap handshake receives (src/net/bootstrap.h):
// any frame a TCP client sends a node's listener (HELLO, PROOF, RESULT) or a node sends a client
// (CHALLENGE, RESULT), then the UCX worker address a PROOF or an accepted RESULT carries, the way
// the engine takes it. Any byte string must give a size or an error from its header, a frame or an
// error from its whole, never crash; a parsed frame must re-encode to the same bytes, and so must
// whatever its typed decoder accepts. Proofs are computed and checked over what was decoded (the
// node's path for a PROOF, the client's for a CHALLENGE and a RESULT). A decoded worker address then goes
// through CheckUcxWorkerAddress (src/net/ucx_address.h), and every address it accepts is handed to
// a real UCX worker's ucp_ep_create, as the engine does: UCX must not abort or read out of bounds
// on it. The worker has only UCX's "self" transport, so no endpoint ever connects to
// anything (addresses in mutated inputs point anywhere): UCX unpacks the address and finds no
// common transport, which is the part that aborted the node (docs/ARCHITECTURE.md).
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "net/bootstrap.h"
#include "net/ucx_address.h"

using namespace viper::net::detail;

namespace {

struct SelfWorker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<std::byte> address;

  SelfWorker() {
    ::setenv("UCX_TLS", "self", 1);
    ::setenv("UCX_UNIFIED_MODE", "n", 1);
    ::setenv("UCX_ADDRESS_DEBUG_INFO", "n", 1);
    // UCX reports each address it cannot use at error level: millions of lines otherwise.
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_FATAL;
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) std::abort();
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM;
    if (ucp_init(&params, config, &context) != UCS_OK) std::abort();
    ucp_config_release(config);
    ucp_worker_params_t wparams{};
    if (ucp_worker_create(context, &wparams, &worker) != UCS_OK) std::abort();
    ucp_address_t* a = nullptr;
    size_t n = 0;
    if (ucp_worker_get_address(worker, &a, &n) != UCS_OK) std::abort();
    const auto* first = reinterpret_cast<const std::byte*>(a);
    address.assign(first, first + n);
    ucp_worker_release_address(worker, a);
  }

  // What the engine's CreateEndpoint does with an address that passed the check, then a close.
  void Connect(const std::vector<std::byte>& peer) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h ep = nullptr;
    if (ucp_ep_create(worker, &params, &ep) != UCS_OK) return;
    ucp_request_param_t close{};
    close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    close.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucp_ep_close_nbx(ep, &close);
    while (UCS_PTR_IS_PTR(request) && ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
  }
};

uint64_t g_frames = 0, g_checked = 0, g_to_ucx = 0;  // printed at exit: the figures of a run

void PrintCounts() {
  std::fprintf(stderr, "bootstrap_fuzz: %llu frames parsed, %llu worker addresses checked, %llu accepted and given "
               "to ucp_ep_create\n", static_cast<unsigned long long>(g_frames), static_cast<unsigned long long>(g_checked),
               static_cast<unsigned long long>(g_to_ucx));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static SelfWorker self;
  static const bool registered = std::atexit(PrintCounts) == 0;
  (void)registered;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  if (size >= kBootstrapHeader) {
    auto whole = BootstrapFrameSize(bytes.first(kBootstrapHeader));
    if (whole.ok() && (*whole < kBootstrapHeader || *whole > kBootstrapHeader + kMaxBootstrapBody)) std::abort();
  }
  auto frame = ParseBootstrapFrame(bytes);
  if (!frame.ok()) return 0;
  auto same = [&](const std::vector<std::byte>& encoded) {
    if (encoded.size() != size || !std::equal(encoded.begin(), encoded.end(), bytes.begin())) std::abort();
  };
  same(EncodeBootstrapFrame(frame->type, frame->flags, frame->body));
  ++g_frames;
  const Nonce nonce{};
  std::vector<std::byte> address;
  switch (frame->type) {
    case FrameType::kHello:
      if (auto m = DecodeHello(*frame); m.ok()) same(EncodeHello(*m));
      return 0;
    case FrameType::kResult: {
      auto m = DecodeResult(*frame);
      if (!m.ok()) return 0;
      (void)ResultCodeText(m->code);
      if (m->code != ResultCode::kAccepted) return 0;  // a refusal's text is sanitised, not re-encoded
      same(EncodeResult(*m));
      if (m->address_proof)
        (void)viper::crypto::EqualConstantTime(AddressProof("token", nonce, nonce, self.address, m->node_address),
                                               *m->address_proof);
      address = m->node_address;
      break;
    }
    case FrameType::kChallenge: {
      auto m = DecodeChallenge(*frame);
      if (m.ok()) {
        same(EncodeChallenge(*m));
        if (m->proof) (void)viper::crypto::EqualConstantTime(NodeProof("token", nonce, m->nonce), *m->proof);
      }
      return 0;
    }
    case FrameType::kProof: {
      auto m = DecodeProof(*frame);
      if (!m.ok()) return 0;
      same(EncodeProof(*m));
      if (m->proof) (void)viper::crypto::EqualConstantTime(ClientProof("token", nonce, nonce, m->client_address), *m->proof);
      address = m->client_address;
      break;
    }
  }
  ++g_checked;
  if (CheckUcxWorkerAddress(address, self.address).ok()) ++g_to_ucx, self.Connect(address);
  return 0;
}
