#include "redis_connection.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <fmt/format.h>

#include "core/snapshot_internal.h"

namespace viper::registry_internal {
namespace {

timeval ToTimeval(std::chrono::milliseconds ms) {
  return {static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

// "SET viper:rec:..." for messages: the verb and first argument, never a payload.
std::string CommandName(const Command& c) {
  if (c.empty()) return "(empty)";
  return c.size() > 1 ? c[0] + " " + internal::Quote(c[1], 96) : c[0];
}

// hiredis writes with write(2), which raises SIGPIPE when the server has reset the connection
// (Redis killed or restarted), and SIGPIPE's default action ends the whole process silently: the
// fault suite's producer died that way. A library must not change the process's signal
// dispositions, so for the life of this guard the calling thread blocks SIGPIPE, and a SIGPIPE
// that its writes raised meanwhile is taken back before the old mask returns; the write itself
// still fails with EPIPE, which hiredis reports. (A SIGPIPE already pending when the guard began
// is the application's: it is left alone.)
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    already_pending_ = sigismember(&pending, SIGPIPE) == 1;
    if (!already_pending_) pthread_sigmask(SIG_BLOCK, &Pipe(), &old_mask_);
  }
  ~SigpipeGuard() {
    if (already_pending_) return;
    const timespec no_wait{0, 0};
    while (sigtimedwait(&Pipe(), nullptr, &no_wait) == -1 && errno == EINTR) {
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  static const sigset_t& Pipe() {
    static const sigset_t set = [] {
      sigset_t s;
      sigemptyset(&s);
      sigaddset(&s, SIGPIPE);
      return s;
    }();
    return set;
  }
  bool already_pending_ = false;
  sigset_t old_mask_{};
};

}  // namespace

Result<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const RedisEndpoint& endpoint,
                                                                  const RegistryOptions& options) {
  std::string where = fmt::format("redis {}:{}", endpoint.host.find(':') != std::string::npos
                                                     ? "[" + endpoint.host + "]" : endpoint.host, endpoint.port);
  redisContext* c = redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, ToTimeval(options.connect_timeout));
  if (c == nullptr) return Status::ResourceExhausted(where + ": cannot allocate a hiredis context");
  std::unique_ptr<RedisConnection> conn(new RedisConnection(c, where));
  if (c->err != 0) return Status::Unavailable(where + ": cannot connect: " + c->errstr);
  if (redisSetTimeout(c, ToTimeval(options.io_timeout)) != REDIS_OK) return conn->IoError("setting the I/O timeout");
  redisEnableKeepAlive(c);
  if (!options.password.empty()) {
    // Not through Run: its errors quote the command's first argument, here the password.
    VIPER_ASSIGN_OR_RETURN(auto replies, conn->Pipeline({{"AUTH", options.password}}));
    const redisReply* r = replies.front().get();
    if (r->type == REDIS_REPLY_ERROR)
      return Status::PermissionDenied(fmt::format("{}: AUTH refused: {}", where,
                                                  internal::Quote(std::string_view(r->str, r->len), 200)));
  }
  if (endpoint.db != 0) {
    VIPER_ASSIGN_OR_RETURN(Reply r, conn->Run({"SELECT", std::to_string(endpoint.db)}));
  }
  return conn;
}

RedisConnection::~RedisConnection() { redisFree(context_); }

Status RedisConnection::IoError(std::string_view doing) const {
  std::string why = context_->errstr[0] != '\0' ? context_->errstr : "connection error";
  if (context_->err == REDIS_ERR_IO && (why.find("Resource temporarily unavailable") != std::string::npos))
    why = "no reply within the I/O timeout";
  return Status::Unavailable(fmt::format("{}: {}: {}", where_, doing, why));
}

Result<std::vector<Reply>> RedisConnection::Pipeline(const std::vector<Command>& commands) {
  if (context_->err != 0) return IoError("connection already broken");
  SigpipeGuard no_sigpipe;  // redisGetReply writes the queued commands first
  for (const auto& command : commands) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const auto& a : command) argv.push_back(a.data()), lengths.push_back(a.size());
    if (redisAppendCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data()) != REDIS_OK)
      return IoError("queueing " + CommandName(command));
  }
  std::vector<Reply> replies;
  for (const auto& command : commands) {
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) return IoError(CommandName(command));
    replies.emplace_back(static_cast<redisReply*>(raw));
  }
  return replies;
}

Result<Reply> RedisConnection::Run(const Command& command) {
  VIPER_ASSIGN_OR_RETURN(auto replies, Pipeline({command}));
  Reply r = std::move(replies.front());
  if (r->type == REDIS_REPLY_ERROR) {
    std::string_view text(r->str, r->len);
    if (text.starts_with("NOAUTH"))
      return Status::PermissionDenied(fmt::format("{}: {} refused: {} (the server requires a password: "
                                                  "--registry-password-file FILE)", where_, CommandName(command),
                                                  internal::Quote(text, 200)));
    return Status::FailedPrecondition(fmt::format("{}: {} refused: {}", where_, CommandName(command),
                                           internal::Quote(text, 200)));
  }
  return r;
}

Result<std::vector<Reply>> RedisConnection::ReadAvailable(int wake_fd, int timeout_ms) {
  std::vector<Reply> out;
  auto drain = [&]() -> Status {
    for (;;) {
      void* raw = nullptr;
      if (redisGetReplyFromReader(context_, &raw) != REDIS_OK) return IoError("reading a reply");
      if (raw == nullptr) return Status::OK();
      out.emplace_back(static_cast<redisReply*>(raw));
    }
  };
  VIPER_RETURN_IF_ERROR(drain());  // replies read along with an earlier one
  if (!out.empty()) return out;
  pollfd fds[2] = {{context_->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
  int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, timeout_ms);
  if (n < 0 && errno != EINTR) return Status::FromErrno(where_ + ": poll");
  if (n <= 0 || (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) return out;
  if (redisBufferRead(context_) != REDIS_OK) return IoError("reading");
  VIPER_RETURN_IF_ERROR(drain());
  return out;
}

std::string_view ReplyTypeName(const redisReply* reply) {
  if (reply == nullptr) return "nothing";
  switch (reply->type) {
    case REDIS_REPLY_STRING: return "a string";
    case REDIS_REPLY_ARRAY: return "an array";
    case REDIS_REPLY_INTEGER: return "an integer";
    case REDIS_REPLY_NIL: return "nil";
    case REDIS_REPLY_STATUS: return "a status";
    case REDIS_REPLY_ERROR: return "an error";
  }
  return "an unknown reply type";
}

Status ExpectOk(const Reply& reply, std::string_view what) {
  if (reply->type == REDIS_REPLY_ERROR)
    return Status::FailedPrecondition(fmt::format("{} refused: {}", what, internal::Quote(std::string_view(reply->str, reply->len), 200)));
  return Status::OK();
}

Result<std::string_view> ExpectString(const redisReply* reply, std::string_view what) {
  if (reply == nullptr || reply->type != REDIS_REPLY_STRING)
    return Status::Corruption(fmt::format("{}: expected a string, got {}", what, ReplyTypeName(reply)));
  return std::string_view(reply->str, reply->len);
}

Status ExpectArray(const redisReply* reply, std::string_view what, size_t max_elements) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY)
    return Status::Corruption(fmt::format("{}: expected an array, got {}", what, ReplyTypeName(reply)));
  if (reply->elements > max_elements)
    return Status::Corruption(fmt::format("{}: {} elements (at most {})", what, reply->elements, max_elements));
  return Status::OK();
}

}  // namespace viper::registry_internal
