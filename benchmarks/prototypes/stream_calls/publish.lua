--[[
  Prototype (d), stream log + per-call in-flight records: appends messages
  to the queue's stream with explicit ids <ms>-<seq>, seq one queue-wide
  counter (so that seqs are contiguous and the ack floor and acked runs
  work on them as they do now) and ms the publish time (never below the
  last entry's, which XADD requires). An entry is the record: one field
  "p", the payload.

  KEYS[1] the stream  KEYS[2] meta hash (seq, ms: the last entry's)
  KEYS[3..] id keys (string -> stream id, PX = window)
  ARGV[1] window ms  ARGV[2] wake-up channel or ""
  ARGV[3], ARGV[4], ... per message: index of its id key (0: none), payload
  Reply: { id1, dup1, ... }
]]
local rcall = redis.call
local s, meta = KEYS[1], KEYS[2]
local t = rcall('TIME')
local now = t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
local m = rcall('HMGET', meta, 'seq', 'ms')
local seq = (m[1] or 0) + 0
local ms = (m[2] or 0) + 0
if now > ms then
  ms = now
end
local msText = string.format('%d', ms) .. '-'
local out = {}
local last = nil
for i = 3, #ARGV, 2 do
  local idKey = ARGV[i]
  local seen = nil
  if idKey ~= '0' then
    seen = rcall('GET', KEYS[idKey + 0])
  end
  if seen then
    out[#out + 1] = seen
    out[#out + 1] = 1
  else
    seq = seq + 1
    last = msText .. string.format('%d', seq)
    rcall('XADD', s, last, 'p', ARGV[i + 1])
    if idKey ~= '0' then
      rcall('SET', KEYS[idKey + 0], last, 'PX', ARGV[1])
    end
    out[#out + 1] = last
    out[#out + 1] = 0
  end
end
if last then
  rcall('HSET', meta, 'seq', seq, 'ms', ms)
  if ARGV[2] ~= '' then
    redis.pcall('PUBLISH', ARGV[2], last)
  end
end
return out
