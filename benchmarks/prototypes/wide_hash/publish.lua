--[[
  Prototype (c), wider structures: the log is the current one (meta seq,
  msgs hash seq -> compact record "~" + 6 bytes of publish ms + payload);
  publish is the current one's common path: seqs taken in one HINCRBY,
  records written in one variadic HSET, ids as keys of their own.

  KEYS[1] meta hash  KEYS[2] msgs hash  KEYS[3..] id keys (-> seq, PX window)
  ARGV[1] window ms  ARGV[2] wake-up channel or ""
  ARGV[3], ARGV[4], ... per message: index of its id key (0: none), payload
  Reply: { seq1, dup1, seq2, dup2, ... }
]]
local rcall = redis.call
local meta, msgs = KEYS[1], KEYS[2]
local t = rcall('TIME')
local now = t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
local lo = now % 16777216
local hi = (now - lo) / 16777216
local b6, b3 = lo % 256, hi % 256
lo, hi = (lo - b6) / 256, (hi - b3) / 256
local b5, b2 = lo % 256, hi % 256
local head = string.char(126, (hi - b2) / 256, b2, b3, (lo - b5) / 256, b5, b6)
local count = (#ARGV - 2) / 2
local anyId = false
for i = 3, #ARGV, 2 do
  if ARGV[i] ~= '0' then
    anyId = true
  end
end
local out, records = {}, {}
local seq
if not anyId then
  seq = rcall('HINCRBY', meta, 'seq', count) - count
  for i = 4, #ARGV, 2 do
    seq = seq + 1
    local field = string.format('%d', seq)
    records[#records + 1] = field
    records[#records + 1] = head .. ARGV[i]
    out[#out + 1] = field
    out[#out + 1] = 0
  end
else
  seq = (rcall('HGET', meta, 'seq') or 0) + 0
  for i = 3, #ARGV, 2 do
    local seen = nil
    if ARGV[i] ~= '0' then
      seen = rcall('GET', KEYS[ARGV[i] + 0])
    end
    if seen then
      out[#out + 1] = seen
      out[#out + 1] = 1
    else
      seq = seq + 1
      local field = string.format('%d', seq)
      records[#records + 1] = field
      records[#records + 1] = head .. ARGV[i + 1]
      if ARGV[i] ~= '0' then
        rcall('SET', KEYS[ARGV[i] + 0], field, 'PX', ARGV[1])
      end
      out[#out + 1] = field
      out[#out + 1] = 0
    end
  end
  rcall('HSET', meta, 'seq', seq)
end
if #records > 0 then
  rcall('HSET', msgs, unpack(records))
  if ARGV[2] ~= '' then
    redis.pcall('PUBLISH', ARGV[2], records[#records - 1])
  end
end
return out
