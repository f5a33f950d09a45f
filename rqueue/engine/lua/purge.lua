--[[
  Purges one group's backlog: every message the group has not settled and
  that is not in flight (due and delayed redeliveries, and everything its
  cursor has not read yet, delayed publishes included) is settled as purged.
  In-flight deliveries are left to their consumers (RabbitMQ's queue.purge).
  Records go once every group has settled them, as for acks.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the most messages to purge in this call
  Output:
    { purged, more } with more = 1 when the group still has a backlog
  Work: at most ARGV[8] messages per call; call again while more is 1.
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include bulk
--@include settle
--@include record_event

local limit = tonumber(ARGV[8])
local seqs = {}

for _, key in ipairs({readyKey, delayKey}) do
  if #seqs < limit then
    local waiting = rcall('ZRANGE', key, 0, limit - #seqs - 1)
    if #waiting > 0 then
      bulk('ZREM', key, waiting)
      bulk('HDEL', dlvKey, waiting)
      for _, s in ipairs(waiting) do
        seqs[#seqs + 1] = tonumber(s)
      end
    end
  end
end

local cursor = tonumber(rcall('HGET', groupKey, 'cursor') or '0')
local last = tonumber(rcall('HGET', metaKey, 'seq') or '0')
local upto = math.min(last, cursor + limit - #seqs)
for s = cursor + 1, upto do
  seqs[#seqs + 1] = s
end
if upto > cursor then
  rcall('HSET', groupKey, 'cursor', upto)
end

settleMany(seqs)
if #seqs > 0 then
  rcall('HINCRBY', groupKey, 'purged', #seqs)
  recordEvent('purged-messages', #seqs, 'purge')
end
local more = 0
if upto < last or rcall('ZCARD', readyKey) > 0 or rcall('ZCARD', delayKey) > 0 then
  more = 1
end
return {#seqs, more}
