--[[
  Prototype (d), stream log + per-call in-flight records: no consumer
  group and no PEL. A fetch reads the stream from the group's cursor
  (XRANGE) and writes one record per call, not per message: the calls
  hash holds <token> -> ",id1,id2,...," (what the call handed out),
  h:<token> -> holder, n:<token> -> how many are still out; the exp zset
  <token> -> lease deadline. A delivery that is not the first (taken
  back, then handed out again) also has a state in the dlv hash,
  id -> "<count>:<token>", so the count of a first delivery costs
  nothing. A fetch that finds no call past its deadline pays one ZCOUNT
  for leases.

  KEYS[1] stream  KEYS[2] group hash (m:<c>, h:<c>, inflight, cursor id,
    floor id, paused)  KEYS[3] exp zset  KEYS[4] calls hash  KEYS[5] dlv
    hash  KEYS[6] ready zset (seq -> id)  KEYS[7] dead-letter stream
    KEYS[8] acked runs zset (read when a call's lease ran out)
  ARGV[1] group  ARGV[2] consumer  ARGV[3] ack_wait ms  ARGV[4] max_inflight
  ARGV[5] prefetch  ARGV[6] max_deliveries  ARGV[7] n  ARGV[8] token
  Reply: { now_ms, id1, count1, payload1, ... }
]]
local rcall = redis.call
local EXPIRE_CALLS = 100
local s, g, exp, calls, dlv, ready, dlq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local group, consumer, ackWait = ARGV[1], ARGV[2], ARGV[3]
local token = ARGV[8]
if #token > 32 or not string.find(token, '^%l[%l%d]*$') then
  return redis.error_reply('RQ_BAD_ARGUMENT the token (ARGV[8]) must be a letter, then letters and digits: '
    .. token)
end
local t = rcall('TIME')
local now = t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
local nowText = string.format('%d', now)
local heldField = 'h:' .. consumer
local f = rcall('HMGET', g, 'm:' .. consumer, heldField, 'inflight', 'cursor', 'floor', 'paused')
if not f[1] then
  return redis.error_reply('RQ_NOT_MEMBER consumer ' .. consumer .. ' is not a member of group ' .. group)
end
local out = {nowText}
if f[6] then
  return out
end
local held, inflight, cursor = (f[2] or 0) + 0, (f[3] or 0) + 0, f[4] or '0-0'
-- Calls past their deadline: what they still have out is taken back.
if inflight > 0 and rcall('ZCOUNT', exp, '-inf', nowText) > 0 then
  local floorSeq = string.match(f[5] or '0-0', '-(%d+)$') + 0
  local runsKey = KEYS[8]
  for _, tok in ipairs(rcall('ZRANGEBYSCORE', exp, '-inf', nowText, 'LIMIT', '0', EXPIRE_CALLS)) do
    local c = rcall('HMGET', calls, tok, 'h:' .. tok)
    local back = 0
    for id in string.gmatch(c[1] or '', '[^,]+') do
      local seq = string.match(id, '-(%d+)$') + 0
      local settled = seq <= floorSeq
      if not settled then
        local run = rcall('ZRANGEBYSCORE', runsKey, seq, '+inf', 'LIMIT', '0', '1')
        settled = run[1] ~= nil and run[1] + 0 <= seq
      end
      local st = rcall('HGET', dlv, id)
      local count, owner = 1, tok
      if st then
        local a, b = string.match(st, '^(%d+):(.*)$')
        count, owner = a + 0, b
      end
      if not settled and owner == tok then
        back = back + 1
        if count >= ARGV[6] + 0 then
          local rec = rcall('XRANGE', s, id, id)
          rcall('XADD', dlq, '*', 'p', rec[1] and rec[1][2][2] or '', 'x-rq-id', id, 'x-rq-deliveries', count)
          rcall('HDEL', dlv, id) -- settling it (the floor) is left out of the prototype
        else
          rcall('HSET', dlv, id, count .. ':')
          rcall('ZADD', ready, seq, id)
        end
      end
    end
    if c[2] then
      rcall('HINCRBY', g, 'h:' .. c[2], -back)
      if c[2] == consumer then
        held = held - back
      end
    end
    inflight = inflight - back
    rcall('HDEL', calls, tok, 'h:' .. tok, 'n:' .. tok)
    rcall('ZREM', exp, tok)
  end
end
local room = ARGV[7] + 0
if ARGV[4] - inflight < room then
  room = ARGV[4] - inflight
end
if ARGV[5] - held < room then
  room = ARGV[5] - held
end
local got = 0
local ids = {}
if room > 0 and rcall('EXISTS', ready) == 1 then
  local due = rcall('ZRANGE', ready, '0', room - 1)
  for _, id in ipairs(due) do
    rcall('ZREM', ready, id)
    local rec = rcall('XRANGE', s, id, id)
    local count = string.match(rcall('HGET', dlv, id) or '1:', '^(%d+):') + 1
    if rec[1] then
      rcall('HSET', dlv, id, count .. ':' .. token)
      ids[#ids + 1] = id
      out[#out + 1] = id
      out[#out + 1] = count
      out[#out + 1] = rec[1][2][2]
      got = got + 1
    end
  end
end
local newCursor = nil
if room - got > 0 then
  local entries = rcall('XRANGE', s, '(' .. cursor, '+', 'COUNT', room - got)
  for _, e in ipairs(entries) do
    ids[#ids + 1] = e[1]
    out[#out + 1] = e[1]
    out[#out + 1] = 1
    out[#out + 1] = e[2][2]
  end
  got = got + #entries
  newCursor = ids[#ids]
end
if got > 0 then
  rcall('HSET', calls, token, ',' .. table.concat(ids, ',') .. ',', 'h:' .. token, consumer, 'n:' .. token, got)
  rcall('ZADD', exp, string.format('%d', now + ackWait), token)
  if newCursor then
    rcall('HSET', g, heldField, held + got, 'inflight', inflight + got, 'cursor', newCursor)
  else
    rcall('HSET', g, heldField, held + got, 'inflight', inflight + got)
  end
end
return out
