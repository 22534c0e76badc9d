// The options tables of Node, Publisher and Subscriber: one row per field, shared by the C++
// struct's defaults and the Python keyword arguments.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api_bindings.h"

namespace viper_py {

using viper::Status;
using viper::StatusCode;

// A secret read back from an options object: whether one is set, never its value.
namespace {
std::string SecretShown(const std::string& secret) { return secret.empty() ? "" : "(set)"; }
}  // namespace

OptionsTable<viper::NodeOptions> NodeOptionsTable() {
  using O = viper::NodeOptions;
  OptionsTable<O> t;
  t.Plain("listen", &O::listen, "HOST:PORT to listen on; port 0 = any free port")
      .Plain("advertise", &O::advertise,
             "host other hosts reach this node at (address, registry, replicas); empty = the listen address, or "
             "this host's own for 0.0.0.0 / ::")
      .Plain("name", &O::name, "shown to peers; empty = node-<pid>")
      .Path("store_dir", &O::store_dir, "file tier directory; empty = no file tier")
      .Plain("keep_host_versions", &O::keep_host_versions, "versions per model kept in shared memory")
      .Plain("keep_file_versions", &O::keep_file_versions, "versions per model kept on the file tier")
      .Plain("host_max_bytes", &O::host_max_bytes,
             "shared memory the node's segments may take; beyond it a publish fails (0 = half of /dev/shm)")
      .Plain("host_max_models", &O::host_max_models,
             "models the node holds in shared memory; one more fails to publish (0 = no cap)")
      .Plain("token", &O::token, "shared secret every peer must present; empty = none")
      .Plain("insecure", &O::insecure, "listen beyond loopback without a token (refused otherwise)")
      .Plain("recover", &O::recover, "on start, load each model's latest file into memory")
      .Plain("unflushed_budget_bytes", &O::unflushed_budget_bytes,
             "shared memory kept by versions not yet on the file tier (queued or failed flushes)")
      .Seconds("peer_liveness_probe", &O::peer_liveness_probe,
               "seconds without a sign of life from a peer before the node pings it (0: never; a peer whose host "
               "or network was cut sends nothing)")
      .Seconds("peer_liveness_timeout", &O::peer_liveness_timeout,
               "seconds a pinged peer has to answer before the node drops it (its leases released)")
      .Seconds("peer_transfer_stall", &O::peer_transfer_stall,
               "seconds a peer may let every bulk transfer with the node (bytes sent to it, PUBLISH bytes from it) "
               "stand still before it is dropped (0: never)")
      .Plain("chunk_bytes", &O::chunk_bytes, "bulk transfer chunk size")
      .Plain("chunks_in_flight", &O::chunks_in_flight, "bulk sends outstanding per transfer")
      .Plain("segment_prefix", &O::segment_prefix, "name prefix of the shared-memory segments")
      .Named("delta", &O::delta, viper::ParseDeltaMode, viper::delta_mode_name,
             "deltas to consumers that fetch over the network: off, auto (when smaller and faster) or always")
      .Plain("delta_bases", &O::delta_bases, "older versions per model kept as delta bases")
      .Plain("delta_threads", &O::delta_threads, "encoder threads of the node's deltas")
      .Plain("registry", &O::registry, "shared registry to register in: 'embedded' or redis://HOST:PORT[/DB]; empty = none")
      .Named("registry_password_file", &O::registry_password, viper::ReadRegistryPasswordFile, SecretShown,
             "file holding the registry's Redis AUTH password (owner-only, whitespace stripped)");
  return t;
}

OptionsTable<viper::PublisherOptions> PublisherOptionsTable() {
  using O = viper::PublisherOptions;
  OptionsTable<O> t;
  t.Plain("model", &O::model, "the model's name")
      .Named("mode", &O::mode, viper::ParsePublishMode, viper::publish_mode_name,
             "async: publish() returns after the copy; sync: after the version is announced")
      .Plain("alignment", &O::alignment, "tensor alignment in the snapshot, a power of two in [1, 4096] (1 = gap-free)")
      .Plain("max_in_flight", &O::max_in_flight, "async versions queued before publish() blocks")
      .Plain("cut_through", &O::cut_through,
             "announce a version to remote readers while publish() copies it (False: after its commit)")
      .Include(&O::node, NodeOptionsTable());
  return t;
}

OptionsTable<viper::SubscriberOptions> SubscriberOptionsTable() {
  using O = viper::SubscriberOptions;
  OptionsTable<O> t;
  t.Plain("model", &O::model, "the model's name")
      .Plain("connect", &O::connect, "HOST:PORT of the node (unused with a registry)")
      .Strings("alternates", &O::alternates,
               "HOST:PORT of nodes to subscribe through, in order, while connect is unreachable or silent")
      .Seconds("preferred_probe", &O::preferred_probe,
               "seconds between tries of connect while on an alternate; once it answers the subscriber moves "
               "back to it between two versions (0: stay on the alternate)")
      .Plain("wait_for_node", &O::wait_for_node,
             "start while no node is reachable yet and keep trying (False: raise if none answers)")
      .Seconds("reconnect_max", &O::reconnect_max, "longest wait between reconnect tries (the backoff starts at 0.1 s)")
      .Plain("registry", &O::registry, "find the node in this registry instead: 'embedded' or redis://HOST:PORT[/DB]")
      .Named("registry_password_file", &O::registry_password, viper::ReadRegistryPasswordFile, SecretShown,
             "file holding the registry's Redis AUTH password (owner-only, whitespace stripped)")
      .Plain("token", &O::token, "the node's shared secret")
      .Plain("name", &O::name, "shown to the node")
      .Named("path", &O::path, viper::ParseFetchPath, viper::fetch_path_name,
             "auto, map, copy, remote or file (needs file_dir)")
      .Plain("verify_checksum", &O::verify_checksum, "verify bytes that crossed the network or came from a file")
      .Plain("verify_local", &O::verify_local, "also verify mapped and copied bytes of this host's node")
      .Path("file_dir", &O::file_dir, "the node's store_dir as seen from here (the file fallback)")
      .Plain("chunk_bytes", &O::chunk_bytes, "bulk transfer chunk size asked for")
      .Seconds("request_timeout", &O::request_timeout, "seconds a request to the node may take")
      .Seconds("liveness_probe", &O::liveness_probe,
               "seconds without a message from the node before it is asked to answer (0: never; a node "
               "whose host or network was cut sends nothing)")
      .Seconds("liveness_timeout", &O::liveness_timeout,
               "seconds the node has to answer a liveness probe before the connection counts as lost")
      .Plain("buffers", &O::buffers, "reused receive buffers kept (copy, remote and file paths)")
      .Plain("ack_on_live", &O::ack_on_live,
             "ACK each version to the node when it goes live here (False: call ack(version) once it is served)")
      .Plain("pipelined", &O::pipelined,
             "with the node on another host, also fetch versions it is still receiving, as they land")
      .Plain("delta", &O::delta, "offer the live version to the node as a delta base (remote path)")
      .Plain("gpu_device", &O::gpu_device,
             "CUDA device each version is also placed on (device-to-device from a GPU producer on this host, else "
             "host-to-device); -1: none. viper.Subscriber(device=N) sets it")
      .Plain("gpu_in_place", &O::gpu_in_place, "with gpu_device: read the producer's GPU buffer in place under a lease")
      .Plain("gpu_early", &O::gpu_early,
             "with gpu_device, on the producer's host: go live from the producer's GPU copy as soon as it is complete, "
             "without host bytes (the version's mapping is empty; load_into copies on the GPU)");
  return t;
}

void BindOptionsClasses(py::module_& m) {
  BindOptions(m, "_NodeOptions", "viper.Node", NodeOptionsTable());
  BindOptions(m, "_PublisherOptions", "viper.Publisher", PublisherOptionsTable());
  BindOptions(m, "_SubscriberOptions", "viper.Subscriber", SubscriberOptionsTable());
}

}  // namespace viper_py
