--[[
  Prototype (d), stream log + per-call in-flight records: settles
  deliveries of one consumer, each on its own. A tag <id>.<count>.<token>
  is this consumer's current delivery when the call <token> still has
  deliveries out, is held by this consumer and handed out id (a plain
  search of its record), the seq is not settled (at or below the ack
  floor, or in an acked run), and, for a count above 1, the dlv state is
  "<count>:<token>". Settling moves the ack floor over contiguous seqs
  and keeps the rest as runs (first seq -> last seq, the last id in the
  group hash's r:<first>), and trims the stream below the lowest floor of
  all groups (XTRIM MINID, exact).

  KEYS[1] stream  KEYS[2] group hash  KEYS[3] exp zset  KEYS[4] calls hash
  KEYS[5] dlv hash  KEYS[6] acked runs zset  KEYS[7] floors hash
  ARGV[1] group  ARGV[2] consumer  ARGV[3..] id, count, token per tag
  Reply: { status1, ... } "ok", RQ_ACKED <id>, RQ_STALE <id>, RQ_NOT_HELD <id>
]]
local rcall = redis.call
local s, g, exp, calls, dlv, acked, floors = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local group, consumer = ARGV[1], ARGV[2]
local heldField = 'h:' .. consumer
local f = rcall('HMGET', g, heldField, 'inflight', 'floor')
local held, inflight = (f[1] or 0) + 0, (f[2] or 0) + 0
local floorId = f[3] or '0-0'
local floorSeq = string.match(floorId, '-(%d+)$') + 0
local tokenList, at = {}, {}
for i = 5, #ARGV, 3 do
  local tok = ARGV[i]
  if at[tok] == nil then
    tokenList[#tokenList + 1] = tok
    at[tok] = #tokenList
  end
end
local fields = {}
for k, tok in ipairs(tokenList) do
  fields[3 * k - 2], fields[3 * k - 1], fields[3 * k] = tok, 'h:' .. tok, 'n:' .. tok
end
local c = rcall('HMGET', calls, unpack(fields))
local runsExist = nil
local out, done, seqs, seen, settledBy = {}, {}, {}, {}, {}
local redelivered = {}
for i = 3, #ARGV, 3 do
  local id, count, tok = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local k = at[tok]
  local list = c[3 * k - 2]
  local seq = (string.match(id, '^%d+%-(%d+)$') or 0) + 0
  if not list or c[3 * k - 1] ~= consumer then
    out[#out + 1] = 'RQ_STALE ' .. id
  elseif seen[id] or not string.find(list, ',' .. id .. ',', 1, true) then
    out[#out + 1] = 'RQ_NOT_HELD ' .. id
  else
    local settled = seq <= floorSeq
    if not settled then
      if runsExist == nil then
        runsExist = rcall('EXISTS', acked) == 1
      end
      if runsExist then
        local run = rcall('ZRANGEBYSCORE', acked, seq, '+inf', 'LIMIT', '0', '1')
        settled = run[1] ~= nil and run[1] + 0 <= seq
      end
    end
    if settled then
      out[#out + 1] = 'RQ_ACKED ' .. id
    elseif count ~= '1' and rcall('HGET', dlv, id) ~= count .. ':' .. tok then
      out[#out + 1] = 'RQ_STALE ' .. id
    else
      if count ~= '1' then
        redelivered[#redelivered + 1] = id
      end
      seen[id] = true
      done[#done + 1] = id
      seqs[#seqs + 1] = seq
      settledBy[tok] = (settledBy[tok] or 0) + 1
      out[#out + 1] = 'ok'
    end
  end
end
if #done == 0 then
  return out
end
for k, tok in ipairs(tokenList) do
  local n = settledBy[tok]
  if n then
    if c[3 * k] - n <= 0 then
      rcall('HDEL', calls, tok, 'h:' .. tok, 'n:' .. tok)
      rcall('ZREM', exp, tok)
    else
      rcall('HINCRBY', calls, 'n:' .. tok, -n)
    end
  end
end
if #redelivered > 0 then
  rcall('HDEL', dlv, unpack(redelivered))
end
-- Settle: sort by seq (ids in step), then the floor and the runs.
local order = {}
for k = 1, #seqs do
  order[k] = k
end
local sorted = true
for k = 2, #seqs do
  if seqs[k] < seqs[k - 1] then
    sorted = false
    break
  end
end
if not sorted then
  table.sort(order, function(a, b)
    return seqs[a] < seqs[b]
  end)
end
local oldFloor = floorSeq
local i = 1
while i <= #order do
  local j = i
  while j < #order and seqs[order[j + 1]] - seqs[order[j]] <= 1 do
    j = j + 1
  end
  local first, last = seqs[order[i]], seqs[order[j]]
  if first <= floorSeq + 1 then
    floorSeq, floorId = last, done[order[j]]
    if runsExist == nil then
      runsExist = rcall('EXISTS', acked) == 1
    end
    if runsExist then
      local start = string.format('%d', floorSeq + 1)
      local runLast = rcall('ZSCORE', acked, start)
      if runLast then
        floorSeq = runLast + 0
        floorId = rcall('HGET', g, 'r:' .. start)
        rcall('ZREM', acked, start)
        rcall('HDEL', g, 'r:' .. start)
      end
    end
  else
    -- merging with a neighbouring run is left out of the prototype
    rcall('ZADD', acked, last, first)
    rcall('HSET', g, 'r:' .. first, done[order[j]])
    runsExist = true
  end
  i = j + 1
end
rcall('HSET', g, heldField, held - #done, 'inflight', inflight - #done, 'floor', floorId)
if floorSeq ~= oldFloor then
  local ms = string.match(floorId, '^(%d+)-')
  local trimTo = ms .. '-' .. string.format('%d', floorSeq + 1)
  rcall('HSET', floors, group, trimTo)
  if rcall('HLEN', floors) > 1 then
    local lowMs, lowSeq = nil, nil
    for _, v in ipairs(rcall('HVALS', floors)) do
      local a, b = string.match(v, '^(%d+)-(%d+)$')
      a, b = a + 0, b + 0
      if lowMs == nil or a < lowMs or (a == lowMs and b < lowSeq) then
        lowMs, lowSeq, trimTo = a, b, v
      end
    end
  end
  rcall('XTRIM', s, 'MINID', trimTo)
end
return out
