// A program of another project, built against an installed Viper (tests/install/install_test.sh):
// with find_package(viper) + viper::viper, and with pkg-config. It publishes one version of a
// small model from an embedded node, subscribes to it in the same process, checks the bytes that
// arrive, and builds a snapshot by hand. Prints "ok <version> <bytes>" and exits 0, or names what
// failed and exits 1.
#include <viper/log.h>
#include <viper/publisher.h>
#include <viper/subscriber.h>
#include <viper/version.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int Fail(const char* what, const viper::Status& status) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  viper::set_log_level(viper::LogLevel::kWarn);
  std::vector<float> weights(4096);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<float>(i) * 0.5f;
  const std::vector<viper::TensorData> tensors = {
      {{"w", viper::DType::kF32, {64, 64}}, std::as_bytes(std::span<const float>(weights))}};

  auto built = viper::BuildSnapshot(tensors, viper::VersionStamp{});
  if (!built.ok()) return Fail("BuildSnapshot", built.status());

  viper::PublisherOptions popts;
  popts.model = "installed";
  popts.mode = viper::PublishMode::kSync;
  popts.node.segment_prefix = "viperinst";
  auto publisher = viper::Publisher::Start(popts);
  if (!publisher.ok()) return Fail("Publisher::Start", publisher.status());

  viper::SubscriberOptions sopts;
  sopts.model = "installed";
  sopts.connect = (*publisher)->address();
  auto subscriber = viper::Subscriber::Start(sopts);
  if (!subscriber.ok()) return Fail("Subscriber::Start", subscriber.status());

  auto published = (*publisher)->Publish(tensors);
  if (!published.ok()) return Fail("Publish", published.status());
  auto live = (*subscriber)->WaitFor(published->version, std::chrono::seconds(30));
  if (!live.ok()) return Fail("WaitFor", live.status());

  const viper::Snapshot& snapshot = (*live)->snapshot;
  const viper::TensorInfo* w = snapshot.find("w");
  if (w == nullptr) return Fail("find", viper::Status::NotFound("tensor w is not in the received version"));
  auto bytes = snapshot.tensor_data(*w);
  if (bytes.size() != weights.size() * sizeof(float) || std::memcmp(bytes.data(), weights.data(), bytes.size()) != 0)
    return Fail("compare", viper::Status::Internal("tensor w differs from what was published"));
  std::printf("ok version %llu, %zu bytes, snapshot %zu bytes, viper %s\n",
              static_cast<unsigned long long>((*live)->version()), bytes.size(), built->bytes().size(),
              viper::kVersionString);
  return 0;
}
