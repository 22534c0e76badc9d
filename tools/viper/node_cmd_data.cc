// `viper data jobs|stats|set-budget --node HOST:PORT`: the control plane of a node's data service
// (viper.data.DataService, python/viper/_data_service.py): the jobs attached, their stats, and a
// job's reader and memory budget set at run time.
//
// The service speaks frames over TCP: a big-endian u32 JSON length, a u32 blob length, the JSON
// object, the blob (protocol 2). With a token, both ends prove they hold it: the service's first
// frame carries its nonce, the first request (`hello`) `auth` = HMAC-SHA256(token, that nonce) in
// hex and a nonce of ours, and the service's reply `proof` = HMAC-SHA256(token, "viper-data service
// " + our nonce), without which nothing is sent to it.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/crypto.h"
#include "node_common.h"

namespace viper::cli {
namespace {

using nlohmann::json;

constexpr uint32_t kMaxJson = 16u << 20;
constexpr double kTimeoutSeconds = 10;
constexpr int kProtocol = 2;

class ServiceConnection {
 public:
  ~ServiceConnection() {
    if (fd_ >= 0) ::close(fd_);
  }

  Status Connect(const std::string& address) {
    size_t colon = address.rfind(':');
    std::string host = address.substr(0, colon), port = address.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      return Status::Unavailable("--node " + address + ": cannot resolve " + host + ": " + ::gai_strerror(rc));
    }
    Status last = Status::Unavailable("--node " + address + ": no address");
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      timeval tv{static_cast<time_t>(kTimeoutSeconds), 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = fd;
        ::freeaddrinfo(res);
        return Status::OK();
      }
      last = Status::FromErrno("--node " + address + ": cannot connect to the data service");
      ::close(fd);
    }
    ::freeaddrinfo(res);
    return last;
  }

  Status Send(const json& message) {
    std::string body = message.dump();
    uint32_t n = htonl(static_cast<uint32_t>(body.size())), m = 0;
    std::string frame(8, '\0');
    std::memcpy(frame.data(), &n, 4);
    std::memcpy(frame.data() + 4, &m, 4);
    frame += body;
    size_t done = 0;
    while (done < frame.size()) {
      ssize_t w = ::send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Status::FromErrno("sending to the data service");
      done += static_cast<size_t>(w);
    }
    return Status::OK();
  }

  Result<json> Receive() {
    char header[8];
    VIPER_RETURN_IF_ERROR(ReadExact(header, 8));
    uint32_t n = 0, m = 0;
    std::memcpy(&n, header, 4);
    std::memcpy(&m, header + 4, 4);
    n = ntohl(n), m = ntohl(m);
    if (n > kMaxJson || m != 0) {
      return Status::Corruption("the data service sent a frame of " + std::to_string(n) + " + " + std::to_string(m) +
                                " bytes: not a control reply");
    }
    std::string body(n, '\0');
    VIPER_RETURN_IF_ERROR(ReadExact(body.data(), n));
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return Status::Corruption("the data service's reply is not a JSON object");
    return j;
  }

 private:
  Status ReadExact(char* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd_, p + got, n - got, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::Timeout("the data service did not answer");
      if (r < 0) return Status::FromErrno("receiving from the data service");
      if (r == 0) return Status::Unavailable("the data service closed the connection");
      got += static_cast<size_t>(r);
    }
    return Status::OK();
  }
  int fd_ = -1;
};

struct DataFlags {
  std::string node, job, memory;
  int64_t readers = 0;
  AuthFlags auth;
};

int CallUnchecked(const std::string& command, const DataFlags& f, json request, const char* field);

// The hello reply's `proof` is HMAC-SHA256(token, "viper-data service " + nonce), compared in
// constant time.
bool ServiceProved(const std::string& token, const std::string& nonce, const json& reply) {
  if (!reply.contains("proof") || !reply["proof"].is_string()) return false;
  auto got = crypto::FromHex(reply["proof"].get<std::string>());
  crypto::Mac want = crypto::HmacSha256(token, "viper-data service " + nonce);
  return got.ok() && crypto::EqualConstantTime(*got, want);
}

// Connects, authenticates, sends `request` and prints the reply's `field` as JSON. A reply of the
// wrong shape (a field of the wrong type) is the service's fault: one line, exit 1.
int Call(const std::string& command, const DataFlags& f, json request, const char* field) {
  try {
    return CallUnchecked(command, f, std::move(request), field);
  } catch (const json::exception& e) {
    return Fail(command, Status::Corruption("--node " + f.node + ": a malformed reply: " + e.what()));
  }
}

int CallUnchecked(const std::string& command, const DataFlags& f, json request, const char* field) {
  auto token = f.auth.Resolve();
  if (!token.ok()) return Fail(command, token.status());
  ServiceConnection c;
  if (Status st = c.Connect(f.node); !st.ok()) return Fail(command, st);
  auto hello = c.Receive();
  if (!hello.ok()) return Fail(command, Status(hello.status().code(), "--node " + f.node + ": " + hello.status().message()));
  if (hello->value("service", "") != "viper-data" || hello->value("protocol", 0) != kProtocol) {
    return Fail(command, Status::InvalidArgument("--node " + f.node + " is not a viper data service (protocol " +
                                                 std::to_string(kProtocol) + ")"));
  }
  auto nonce_bytes = crypto::RandomBytes(16);
  if (!nonce_bytes.ok()) return Fail(command, nonce_bytes.status());
  const std::string nonce = crypto::ToHex(*nonce_bytes);
  std::string auth;
  if (!token->empty()) auth = crypto::ToHex(crypto::HmacSha256(*token, hello->value("nonce", "")));
  for (json req : {json{{"op", "hello"}, {"auth", auth}, {"nonce", nonce}}, std::move(request)}) {
    if (Status st = c.Send(req); !st.ok()) return Fail(command, st);
    auto reply = c.Receive();
    if (!reply.ok()) return Fail(command, reply.status());
    if (reply->contains("error")) {
      std::string why = (*reply)["error"].is_string() ? (*reply)["error"].get<std::string>() : (*reply)["error"].dump();
      // A refused token is not a bad argument (exit 2) but a refusal, as a node's (exit 1); the
      // service's other refusals are of a request's values, which are the arguments.
      Status refused = why.rfind("unauthenticated", 0) == 0 ? Status::PermissionDenied("")
                                                             : Status::InvalidArgument("");
      return Fail(command, Status(refused.code(), "the data service at " + f.node + " refused: " + why));
    }
    if (req["op"] == "hello") {
      if (!token->empty() && !ServiceProved(*token, nonce, *reply)) {
        return Fail(command, Status::PermissionDenied("--node " + f.node + " did not prove that it holds the token: "
                                                      "not the service meant (another process on its port), or one "
                                                      "with another token or none"));
      }
      continue;
    }
    std::cout << reply->at(field).dump(1) << std::endl;
  }
  return 0;
}

int RunSetBudget(const DataFlags& f) {
  json req{{"op", "set_budget"}, {"job", f.job}};
  if (f.readers == 0 && f.memory.empty()) {
    return Fail("data set-budget", Status::InvalidArgument("give --readers, --memory or both"));
  }
  if (f.readers != 0) req["readers"] = f.readers;
  if (!f.memory.empty()) {
    auto bytes = ParseBytes(f.memory, "--memory");
    if (!bytes.ok()) return Fail("data set-budget", bytes.status());
    if (*bytes < (1u << 20)) {
      return Fail("data set-budget", Status::InvalidArgument("--memory '" + f.memory + "': must be at least 1MiB (" +
                                                             std::to_string(1u << 20) + " bytes)"));
    }
    req["memory"] = *bytes;
  }
  return Call("data set-budget", f, req, "budget");
}

ViperCommand data_command(
    "data", "Control a node's data service: its jobs, their stats, a job's reader and memory budget",
    [](CLI::App& app) -> RunFn {
      app.require_subcommand(1);
      auto f = std::make_shared<DataFlags>();
      auto node = [&](CLI::App* sub) {
        sub->add_option("--node", f->node, "The data service's HOST:PORT (viper.data.DataService)")
            ->required()
            ->check(HostPort());
        f->auth.Add(*sub);
      };
      auto chosen = std::make_shared<RunFn>();
      CLI::App* jobs = app.add_subcommand("jobs", "The jobs attached now: budget, processes, readers, bytes read ahead");
      node(jobs);
      jobs->callback([f, chosen] { *chosen = [f] { return Call("data jobs", *f, json{{"op", "jobs"}}, "jobs"); }; });
      CLI::App* stats = app.add_subcommand("stats", "Per job: wait, cache hits, source bytes; the cache's memory");
      node(stats);
      stats->callback([f, chosen] { *chosen = [f] { return Call("data stats", *f, json{{"op", "stats"}}, "stats"); }; });
      CLI::App* set = app.add_subcommand("set-budget", "Set a job's reader threads and read-ahead memory now");
      node(set);
      set->add_option("--job", f->job, "The job's name (as `viper data jobs` lists it)")->required()->check(Text(128));
      set->add_option("--readers", f->readers, "Reader threads (1-1024)")->check(IntegerIn(1, 1024));
      set->add_option("--memory", f->memory, "Bytes read ahead: 64MiB, 1G, ... (at least 1MiB)")->check(Text(32));
      set->callback([f, chosen] { *chosen = [f] { return RunSetBudget(*f); }; });
      return [chosen] { return *chosen ? (*chosen)() : 2; };
    },
    65);

}  // namespace
}  // namespace viper::cli
