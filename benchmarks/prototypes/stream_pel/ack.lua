--[[
  Prototype (b), stream + PEL: settles deliveries of one consumer, each on
  its own. A tag is <id>.<count>.<token>: it is accepted when the PEL
  holds id for this consumer with that delivery count (the count is the
  per-delivery fencing token: every delivery of an entry raises it) and
  the token is a fetch call of the group with deliveries still out.
  Then XACK, and the ack floor: the lowest id still pending (or the last
  id delivered, when none is), below which the stream is trimmed once
  every group's floor is past (XTRIM MINID, exact).

  KEYS[1] stream  KEYS[2] group hash  KEYS[3] exp zset  KEYS[4] calls hash
  KEYS[5] floors hash (group -> floor id)
  ARGV[1] group  ARGV[2] consumer  ARGV[3] lowest id of the tags
  ARGV[4] highest id of the tags  ARGV[5..] id, count, token per tag
  Reply: { status1, ... } "ok" or RQ_STALE (the PEL holds a newer delivery
    or another holder), RQ_NOT_HELD (not pending: settled, or never
    delivered)
]]
local rcall = redis.call
local s, g, exp, calls, floors = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, consumer = ARGV[1], ARGV[2]
local heldField = 'h:' .. consumer
local f = rcall('HMGET', g, heldField, 'inflight', 'last')
local held, inflight = (f[1] or 0) + 0, (f[2] or 0) + 0
local out = {}
if held == 0 then
  for i = 5, #ARGV, 3 do
    out[#out + 1] = 'RQ_NOT_HELD ' .. ARGV[i]
  end
  return out
end
-- This consumer's pending entries between the lowest and the highest tag:
-- its own PEL, read in one range.
local pend = rcall('XPENDING', s, group, ARGV[3], ARGV[4], held, consumer)
local counts = {}
for _, e in ipairs(pend) do
  counts[e[1]] = e[4]
end
local tokens, tokenList = {}, {}
for i = 7, #ARGV, 3 do
  local tok = ARGV[i]
  if tokens[tok] == nil then
    tokens[tok] = 0
    tokenList[#tokenList + 1] = tok
  end
end
local live = rcall('HMGET', calls, unpack(tokenList))
local known = {}
for k, tok in ipairs(tokenList) do
  known[tok] = live[k]
end
local ids = {}
for i = 5, #ARGV, 3 do
  local id, count, tok = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local pc = counts[id]
  if pc == nil then
    out[#out + 1] = 'RQ_NOT_HELD ' .. id
  elseif pc ~= count + 0 or not known[tok] then
    out[#out + 1] = 'RQ_STALE ' .. id
  else
    ids[#ids + 1] = id
    tokens[tok] = tokens[tok] + 1
    counts[id] = nil -- a tag repeated in the call is settled once
    out[#out + 1] = 'ok'
  end
end
if #ids == 0 then
  return out
end
rcall('XACK', s, group, unpack(ids))
for _, tok in ipairs(tokenList) do
  local k = tokens[tok]
  if k > 0 then
    if known[tok] - k <= 0 then
      rcall('HDEL', calls, tok)
      rcall('ZREM', exp, tok)
    else
      rcall('HINCRBY', calls, tok, -k)
    end
  end
end
rcall('HSET', g, heldField, held - #ids, 'inflight', inflight - #ids)
-- The ack floor: everything below the lowest pending id is settled.
local first = rcall('XPENDING', s, group, '-', '+', 1)
local floor
if first[1] then
  floor = first[1][1]
else
  local ms, seq = string.match(f[3], '^(%d+)-(%d+)$')
  floor = ms .. '-' .. string.format('%d', seq + 1)
end
rcall('HSET', floors, group, floor)
local trimTo = floor
if rcall('HLEN', floors) > 1 then
  -- The lowest floor of all groups (ids compared as ms, then seq).
  local lowMs, lowSeq = nil, nil
  for _, v in ipairs(rcall('HVALS', floors)) do
    local ms, seq = string.match(v, '^(%d+)-(%d+)$')
    ms, seq = ms + 0, seq + 0
    if lowMs == nil or ms < lowMs or (ms == lowMs and seq < lowSeq) then
      lowMs, lowSeq, trimTo = ms, seq, v
    end
  end
end
rcall('XTRIM', s, 'MINID', trimTo)
return out
