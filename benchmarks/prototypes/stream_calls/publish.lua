--[[
  Prototype (d), stream log + per-call in-flight records: appends messages
  to the queue's stream with explicit ids <seq>-<ms>: seq one queue-wide
  counter first, so that ids sort by seq, seqs are gap-free, and the ack
  floor, acked runs, XRANGE and XTRIM MINID all work on seqs alone; the
  publish time second, where it costs no bytes of its own. An entry is
  the record: one field "p", the payload (the field name is shared by
  the listpack's master entry).

  KEYS[1] the stream  KEYS[2] meta hash (seq: the last assigned)
  KEYS[3..] id keys (string -> stream id, PX = window)
  ARGV[1] window ms  ARGV[2] wake-up channel or ""
  ARGV[3], ARGV[4], ... per message: index of its id key (0: none), payload
  Reply: { id1, dup1, ... }
]]
local rcall = redis.call
local s, meta = KEYS[1], KEYS[2]
local t = rcall('TIME')
local msText = '-' .. t[1] .. string.sub(string.format('%06d', t[2]), 1, 3)
local count = (#ARGV - 2) / 2
local anyId = false
for i = 3, #ARGV, 2 do
  if ARGV[i] ~= '0' then
    anyId = true
  end
end
local seq
if anyId then
  seq = (rcall('HGET', meta, 'seq') or 0) + 0
else
  seq = rcall('HINCRBY', meta, 'seq', count) - count
end
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
    last = string.format('%d', seq) .. msText
    rcall('XADD', s, last, 'p', ARGV[i + 1])
    if idKey ~= '0' then
      rcall('SET', KEYS[idKey + 0], last, 'PX', ARGV[1])
    end
    out[#out + 1] = last
    out[#out + 1] = 0
  end
end
if anyId and last then
  rcall('HSET', meta, 'seq', seq)
end
if last and ARGV[2] ~= '' then
  redis.pcall('PUBLISH', ARGV[2], last)
end
return out
