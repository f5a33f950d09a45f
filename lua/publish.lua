--[[
  Appends messages to a queue, each getting the next seq, skipping any whose
  id was seen inside the de-duplication window. Each id is a key of its own
  that Redis expires at the end of the window, so ids cost no cleanup work.

  Input:
    KEYS[1] meta     hash  seq (last assigned)
    KEYS[2] msgs     hash  seq -> record
    KEYS[3] floors   hash  group -> ack floor (read: is there any group?)
    KEYS[4] sched    zset  seq -> not-before (ms) of delayed publishes
    KEYS[5..] id keys (string "<seq>:<expires_ms>"; PX = the window), one
        per message that has an id, in message order. The expiry is in the
        scripts' clock, so a test clock decides what is a duplicate; Redis's
        own TTL removes the key.
    ARGV[1] now in ms, or "" for the server's TIME
    ARGV[2] de-duplication window, ms
    ARGV[3] mandatory: "1" refuses the batch when the queue has no group
    ARGV[4] channel to announce new messages on, or ""
    ARGV[5], ARGV[6], ARGV[7] ... per message: index of its id key in KEYS
        (0 = no id), delay in ms (0 = none), body
        "<headers_len>:<headers_json><payload>"
  Output:
    { seq1, duplicate1, seq2, duplicate2, ... }, duplicate 1 when the id was
    seen: seq is then the seq of the first publish
  Errors (nothing is stored):
    RQ_UNROUTABLE  mandatory publish to a queue without a group
]]
--@include read_now

local rcall = redis.call
local TEST_CLOCK_TTL_SLACK = 86400000 -- ms, see the ttl below
local metaKey = KEYS[1]
local msgsKey = KEYS[2]
local floorsKey = KEYS[3]
local schedKey = KEYS[4]

local now = readNow(ARGV[1])
local window = tonumber(ARGV[2])
local channel = ARGV[4]

if ARGV[3] == '1' and rcall('HLEN', floorsKey) == 0 then
  return redis.error_reply('RQ_UNROUTABLE the queue has no group to deliver to')
end

rcall('ZREMRANGEBYSCORE', schedKey, '-inf', now)

-- The stored expiry decides what is a duplicate; the key's TTL only cleans
-- up. With a time passed by a test clock, real time says nothing about it,
-- so the key lives a day longer than the window.
local ttl = math.max(1, window)
if ARGV[1] ~= '' then
  ttl = window + TEST_CLOCK_TTL_SLACK
end

local out = {}
local last = nil
for i = 5, #ARGV, 3 do
  local idKey, delay, body = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), ARGV[i + 2]
  local seen = nil
  if idKey > 0 then
    local value = rcall('GET', KEYS[idKey])
    if value then
      local seq, expires = string.match(value, '^(%d+):(%d+)$')
      if seq and tonumber(expires) > now then
        seen = seq
      end
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
    if idKey > 0 then
      rcall('SET', KEYS[idKey], seq .. ':' .. (now + window), 'PX', ttl)
    end
    out[#out + 1] = seq
    out[#out + 1] = 0
    last = seq
  end
end
if last ~= nil and channel ~= '' then
  -- Only a wake-up hint: a refusal must not fail a publish already stored.
  redis.pcall('PUBLISH', channel, last)
end
return out
