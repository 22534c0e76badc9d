// One connection to a Redis server over hiredis (synchronous), with replies as owning values.
//
// Everything a reply carries is untrusted: callers check its type before use (ExpectString,
// ExpectArray, ...), and every error names the server and the command. After an I/O error the
// connection is broken for good (hiredis cannot resume a half-read reply): drop it and connect
// again. Thread-safety: none; one owner at a time.
#pragma once

#include <hiredis/hiredis.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "registry_internal.h"

namespace viper::registry_internal {

struct ReplyFree {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;
using Command = std::vector<std::string>;

class RedisConnection {
 public:
  // Connects, sets the I/O timeout and selects the endpoint's database.
  static Result<std::unique_ptr<RedisConnection>> Connect(const RedisEndpoint& endpoint, const RegistryOptions& options);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends every command, then reads every reply: one round trip. An error reply (-ERR ...) comes
  // back as a reply of type REDIS_REPLY_ERROR; only I/O errors and timeouts fail the call.
  Result<std::vector<Reply>> Pipeline(const std::vector<Command>& commands);
  // One command; an error reply becomes a FailedPrecondition status naming the command (only I/O
  // failures are Unavailable: the connection is then broken).
  Result<Reply> Run(const Command& command);

  // Subscriber mode: waits up to `timeout_ms` (-1: forever) for the socket or `wake_fd` to be
  // readable, then returns every complete reply buffered (possibly none).
  Result<std::vector<Reply>> ReadAvailable(int wake_fd, int timeout_ms);

  const std::string& where() const { return where_; }  // "redis 127.0.0.1:6379"

 private:
  RedisConnection(redisContext* context, std::string where) : context_(context), where_(std::move(where)) {}
  Status IoError(std::string_view doing) const;
  redisContext* context_;
  std::string where_;
};

// Reply checks: an error names `what` and the type found.
Status ExpectOk(const Reply& reply, std::string_view what);  // anything but an error reply
Result<std::string_view> ExpectString(const redisReply* reply, std::string_view what);
Status ExpectArray(const redisReply* reply, std::string_view what, size_t max_elements);
std::string_view ReplyTypeName(const redisReply* reply);

}  // namespace viper::registry_internal
