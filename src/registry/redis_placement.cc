// Placement on Redis: the tree of a model's relays, kept by three Lua scripts (redis_placement.h).
#include "redis_placement.h"

#include <fmt/format.h>

#include "core/names.h"
#include "core/snapshot_internal.h"

namespace viper::registry_internal {
namespace {

constexpr uint32_t kMaxChildren = 1024;
constexpr size_t kMaxRoots = 256;
constexpr size_t kMaxAvoid = 256;

// KEYS[1] = tree; ARGV = [prefix, id, address, host_key, children, ttl_ms, prefer, n_roots,
// root id, root address, root host_key (x n_roots), avoided address...]. Returns nil (no free
// slot) or [parent id, parent address, parent host_key, depth, siblings].
constexpr const char* kJoinScript = R"lua(
local tree, pfx, me, addr, host = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cap, ttl, prefer, nroots = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', tree, '-inf', now)
local avoid = {}
for i = 9 + 3 * nroots, #ARGV do avoid[ARGV[i]] = true end
-- The joiner's parent, avoided, is presumed dead: it leaves the tree (and frees its own slot), so
-- that its children find room at once, even in a chain. A live one takes its place again on its
-- next heartbeat (Stay answers 0).
local old = redis.call('HGET', pfx .. me, 'p')
if old and avoid[redis.call('HGET', pfx .. old, 'a') or ''] then
  redis.call('ZREM', tree, old)
  redis.call('DEL', pfx .. old)
end
local nodes, load = {}, {}
for _, id in ipairs(redis.call('ZRANGE', tree, 0, -1)) do
  local f = redis.call('HMGET', pfx .. id, 'a', 'h', 'p', 'd', 'c')
  if f[1] and id ~= me then
    nodes[id] = {a = f[1], h = f[2] or '', p = f[3], d = tonumber(f[4]) or 1, c = tonumber(f[5]) or 1}
    if f[3] then load[f[3]] = (load[f[3]] or 0) + 1 end
  end
end
for i = 0, nroots - 1 do
  local id = ARGV[9 + 3 * i]
  if id ~= me and not nodes[id] then nodes[id] = {a = ARGV[10 + 3 * i], h = ARGV[11 + 3 * i], d = 0, c = 1} end
end
local function under_me(id)
  local x, steps = id, 0
  while x and steps < 256 do
    if x == me then return true end
    local n = nodes[x]
    if not n then return false end
    x, steps = n.p, steps + 1
  end
  return steps >= 256
end
local best, bk
for id, n in pairs(nodes) do
  local l = load[id] or 0
  if not avoid[n.a] and l < n.c and not under_me(id) then
    local k = {n.a == prefer and 0 or 1, n.h == host and 0 or 1, n.d, l, id}
    local better = not best
    if best then
      for j = 1, 5 do
        if k[j] ~= bk[j] then better = k[j] < bk[j]; break end
      end
    end
    if better then best, bk = id, k end
  end
end
if not best then
  redis.call('ZREM', tree, me)
  redis.call('DEL', pfx .. me)
  return false
end
local n = nodes[best]
redis.call('DEL', pfx .. me)
redis.call('HSET', pfx .. me, 'a', addr, 'h', host, 'p', best, 'd', n.d + 1, 'c', cap)
redis.call('PEXPIRE', pfx .. me, ttl)
redis.call('ZADD', tree, now + ttl, me)
return {best, n.a, n.h, n.d + 1, load[best] or 0}
)lua";

// KEYS[1] = tree; ARGV = [prefix, id, ttl_ms]. 1: still a member (expiry and depth renewed); 0: not.
constexpr const char* kStayScript = R"lua(
local tree, pfx, me, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', tree, me)
if not score or tonumber(score) < now or redis.call('EXISTS', pfx .. me) == 0 then return 0 end
local p = redis.call('HGET', pfx .. me, 'p')
local pd = p and redis.call('HGET', pfx .. p, 'd')
redis.call('HSET', pfx .. me, 'd', (tonumber(pd) or 0) + 1)
redis.call('PEXPIRE', pfx .. me, ttl)
redis.call('ZADD', tree, now + ttl, me)
return 1
)lua";

std::string TreeKey(const std::string& model) { return "viper:tree:" + model; }

Status CheckNode(const NodeRecord& node, std::string_view what) {
  if (node.id.size() != 16 || node.id.find_first_not_of("0123456789abcdef") != std::string::npos)
    return Status::InvalidArgument(fmt::format("placement: {} id {} is not 16 lowercase hex digits", what,
                                               internal::Quote(node.id)));
  if (Status st = ValidateReplica({proto::ReplicaKind::kNode, node.host_key, node.address}); !st.ok())
    return Status::InvalidArgument(fmt::format("placement: {} {}: {}", what, node.id, st.message()));
  return Status::OK();
}

Status CheckRequest(const JoinRequest& r) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(r.model));
  VIPER_RETURN_IF_ERROR(CheckNode(r.node, "joiner"));
  for (const auto& root : r.roots) VIPER_RETURN_IF_ERROR(CheckNode(root, "root"));
  if (r.max_children < 1 || r.max_children > kMaxChildren)
    return Status::InvalidArgument(fmt::format("placement: max_children {} must be from 1 to {}", r.max_children, kMaxChildren));
  if (r.ttl.count() <= 0) return Status::InvalidArgument("placement: the membership TTL must be positive");
  if (r.roots.size() > kMaxRoots || r.avoid.size() > kMaxAvoid)
    return Status::InvalidArgument(fmt::format("placement: {} roots and {} avoided addresses (at most {} and {})",
                                               r.roots.size(), r.avoid.size(), kMaxRoots, kMaxAvoid));
  return Status::OK();
}

// The script's answer is read back like any record: what other joiners wrote is untrusted.
Result<Placement> ParsePlacement(const redisReply* reply, const std::string& where) {
  std::string what = where + ": placement reply";
  VIPER_RETURN_IF_ERROR(ExpectArray(reply, what, 5));
  if (reply->elements != 5) return Status::Corruption(what + " has " + std::to_string(reply->elements) + " elements, not 5");
  Placement out;
  VIPER_ASSIGN_OR_RETURN(std::string_view id, ExpectString(reply->element[0], what));
  VIPER_ASSIGN_OR_RETURN(std::string_view address, ExpectString(reply->element[1], what));
  VIPER_ASSIGN_OR_RETURN(std::string_view host_key, ExpectString(reply->element[2], what));
  out.parent.id = id;
  out.parent.address = address;
  out.parent.host_key = host_key;
  if (Status st = CheckNode(out.parent, "parent"); !st.ok()) return Status::Corruption(where + ": " + st.message());
  const redisReply* depth = reply->element[3];
  const redisReply* siblings = reply->element[4];
  if (depth->type != REDIS_REPLY_INTEGER || siblings->type != REDIS_REPLY_INTEGER || depth->integer < 1 ||
      depth->integer > 1 << 20 || siblings->integer < 0 || siblings->integer > kMaxChildren)
    return Status::Corruption(what + ": depth or siblings is not an integer in range");
  out.depth = static_cast<uint32_t>(depth->integer);
  out.siblings = static_cast<uint32_t>(siblings->integer);
  return out;
}

Result<Reply> Eval(RedisConnection& c, const char* script, Command args, std::string_view doing) {
  Command command = {"EVAL", script, "1"};
  command.insert(command.end(), std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  VIPER_ASSIGN_OR_RETURN(auto replies, c.Pipeline({command}));
  VIPER_RETURN_IF_ERROR(ExpectOk(replies[0], fmt::format("{}: {}", c.where(), doing)));
  return std::move(replies[0]);
}

}  // namespace

Result<Placement> JoinOn(RedisConnection& c, const JoinRequest& r) {
  VIPER_RETURN_IF_ERROR(CheckRequest(r));
  Command args = {TreeKey(r.model), TreeKey(r.model) + ":", r.node.id, r.node.address, r.node.host_key,
                  std::to_string(r.max_children), std::to_string(r.ttl.count()), r.prefer,
                  std::to_string(r.roots.size())};
  for (const auto& root : r.roots) args.insert(args.end(), {root.id, root.address, root.host_key});
  args.insert(args.end(), r.avoid.begin(), r.avoid.end());
  VIPER_ASSIGN_OR_RETURN(Reply reply, Eval(c, kJoinScript, std::move(args), "joining the tree of " + r.model));
  if (reply->type == REDIS_REPLY_NIL)
    return Status::NotFound(fmt::format("placement: no node of the tree of {} has a free child slot ({} roots, {} avoided)",
                                        r.model, r.roots.size(), r.avoid.size()));
  return ParsePlacement(reply.get(), c.where());
}

Result<bool> StayOn(RedisConnection& c, const std::string& model, const std::string& node_id,
                    std::chrono::milliseconds ttl) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  if (ttl.count() <= 0) return Status::InvalidArgument("placement: the membership TTL must be positive");
  VIPER_ASSIGN_OR_RETURN(Reply reply, Eval(c, kStayScript, {TreeKey(model), TreeKey(model) + ":", node_id,
                                                            std::to_string(ttl.count())},
                                           "staying in the tree of " + model));
  if (reply->type != REDIS_REPLY_INTEGER)
    return Status::Corruption(c.where() + ": placement stay reply is " + std::string(ReplyTypeName(reply.get())));
  return reply->integer == 1;
}

Status LeaveOn(RedisConnection& c, const std::string& model, const std::string& node_id) {
  VIPER_RETURN_IF_ERROR(ValidateModelName(model));
  VIPER_ASSIGN_OR_RETURN(auto replies, c.Pipeline({{"ZREM", TreeKey(model), node_id}, {"DEL", TreeKey(model) + ":" + node_id}}));
  for (const auto& reply : replies) VIPER_RETURN_IF_ERROR(ExpectOk(reply, c.where() + ": leaving the tree of " + model));
  return Status::OK();
}

}  // namespace viper::registry_internal
