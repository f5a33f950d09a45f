--[[
  Appends messages to a queue, each getting the next seq, skipping any whose
  id was seen inside the de-duplication window.

  Input:
    KEYS[1] meta     hash  seq (last assigned)
    KEYS[2] msgs     hash  seq -> record
    KEYS[3] floors   hash  group -> ack floor (read: is there any group?)
    KEYS[4] ids      hash  message id -> seq, inside the window
    KEYS[5] id_exp   zset  message id -> expiry (ms)
    KEYS[6] sched    zset  seq -> not-before (ms) of delayed publishes
    ARGV[1] now in ms, or "" for the server's TIME
    ARGV[2] de-duplication window, ms
    ARGV[3] mandatory: "1" refuses the batch when the queue has no group
    ARGV[4] channel to announce new messages on, or ""
    ARGV[5], ARGV[6], ARGV[7] ... per message: id ("" = none), delay in ms
        (0 = none), body "<headers_len>:<headers_json><payload>"
  Output:
    { seq1, duplicate1, seq2, duplicate2, ... }, duplicate 1 when the id was
    seen: seq is then the seq of the first publish
  Errors (nothing is stored):
    RQ_UNROUTABLE  mandatory publish to a queue without a group
]]
--@include read_now

local rcall = redis.call
local metaKey = KEYS[1]
local msgsKey = KEYS[2]
local floorsKey = KEYS[3]
local idsKey = KEYS[4]
local idExpKey = KEYS[5]
local schedKey = KEYS[6]

local now = readNow(ARGV[1])
local window = tonumber(ARGV[2])
local channel = ARGV[4]
local count = (#ARGV - 4) / 3

if ARGV[3] == '1' and rcall('HLEN', floorsKey) == 0 then
  return redis.error_reply('RQ_UNROUTABLE the queue has no group to deliver to')
end

-- Forget ids whose window is over; at least as many as this call may add,
-- so the index never grows faster than it shrinks.
local stale = rcall('ZRANGEBYSCORE', idExpKey, '-inf', now, 'LIMIT', 0, math.max(100, 2 * count))
for _, id in ipairs(stale) do
  rcall('HDEL', idsKey, id)
  rcall('ZREM', idExpKey, id)
end

rcall('ZREMRANGEBYSCORE', schedKey, '-inf', now)

local out = {}
local last = nil
for i = 5, #ARGV, 3 do
  local id, delay, body = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local seen = nil
  if id ~= '' then
    seen = rcall('HGET', idsKey, id)
    -- The cleanup above is bounded; an id it has not reached yet may be
    -- past its window already.
    if seen and tonumber(rcall('ZSCORE', idExpKey, id) or '0') <= now then
      seen = nil
    end
  end
  if seen then
    out[#out + 1] = tonumber(seen)
    out[#out + 1] = 1
  else
    local seq = rcall('HINCRBY', metaKey, 'seq', 1)
    local notBefore = ''
    if delay > 0 then
      notBefore = now + delay
      rcall('ZADD', schedKey, notBefore, seq)
    end
    rcall('HSET', msgsKey, seq, notBefore .. ':' .. now .. ':' .. body)
    if id ~= '' then
      rcall('HSET', idsKey, id, seq)
      rcall('ZADD', idExpKey, now + window, id)
    end
    out[#out + 1] = seq
    out[#out + 1] = 0
    last = seq
  end
end
if last ~= nil and channel ~= '' then
  rcall('PUBLISH', channel, last)
end
return out
