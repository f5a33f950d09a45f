--[[
  Prototype (c), wider structures: one hash per group holds every delivery
  state, seq -> "<count>:<token>", and nothing else is written per
  message. What the current layout keeps per delivery and is the same for
  every delivery of one fetch call (the holder, the lease deadline, the
  first and last delivery time) is kept once per call: the calls hash
  (<token> -> the seqs it handed out, h:<token> -> holder, n:<token> ->
  how many are still out) and the exp zset (<token> -> lease deadline).
  A fetch that finds no call past its deadline pays one ZCOUNT for leases.

  KEYS[1] meta  KEYS[2] msgs  KEYS[3] group hash (m:<c>, h:<c>, inflight,
    cursor, floor, paused)  KEYS[4] dlv hash  KEYS[5] exp zset  KEYS[6]
    calls hash  KEYS[7] ready zset (seq -> seq: taken back, due now)
    KEYS[8] dead-letter list
  ARGV[1] group  ARGV[2] consumer  ARGV[3] ack_wait ms  ARGV[4] max_inflight
  ARGV[5] prefetch  ARGV[6] max_deliveries  ARGV[7] n  ARGV[8] token
  Reply: { now_ms, seq1, count1, record1, ... }
]]
local rcall = redis.call
local EXPIRE_CALLS = 100
local meta, msgs, g, dlv, exp, calls, ready, dlq =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
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
local f = rcall('HMGET', g, 'm:' .. consumer, heldField, 'inflight', 'cursor', 'paused')
if not f[1] then
  return redis.error_reply('RQ_NOT_MEMBER consumer ' .. consumer .. ' is not a member of group ' .. group)
end
local out = {nowText}
if f[5] then
  return out
end
local held, inflight, cursor = (f[2] or 0) + 0, (f[3] or 0) + 0, (f[4] or 0) + 0
-- Calls past their deadline: what they still have out goes back, ready
-- now, or to the dead letters after max_deliveries.
if inflight > 0 and rcall('ZCOUNT', exp, '-inf', nowText) > 0 then
  for _, tok in ipairs(rcall('ZRANGEBYSCORE', exp, '-inf', nowText, 'LIMIT', '0', EXPIRE_CALLS)) do
    local c = rcall('HMGET', calls, tok, 'h:' .. tok)
    local back = 0
    for seq in string.gmatch(c[1] or '', '%d+') do
      local st = rcall('HGET', dlv, seq)
      local count, owner = string.match(st or '', '^(%d+):(%l[%l%d]*)$')
      if owner == tok then
        back = back + 1
        if count + 0 >= ARGV[6] + 0 then
          rcall('RPUSH', dlq, seq .. ':' .. count .. ':' .. (rcall('HGET', msgs, seq) or ''))
          rcall('HDEL', dlv, seq)
          rcall('HDEL', msgs, seq) -- settling it (the floor) is left out of the prototype
        else
          rcall('ZADD', ready, seq, seq)
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
local states, seqs = {}, {}
if room > 0 and rcall('EXISTS', ready) == 1 then
  local due = rcall('ZRANGE', ready, '0', room - 1)
  if #due > 0 then
    rcall('ZREM', ready, unpack(due))
    local recs = rcall('HMGET', msgs, unpack(due))
    local sts = rcall('HMGET', dlv, unpack(due))
    for i, seq in ipairs(due) do
      local count = string.match(sts[i] or '', '^(%d+):') or '0'
      count = count + 1
      if recs[i] then
        states[#states + 1] = seq
        states[#states + 1] = count .. ':' .. token
        seqs[#seqs + 1] = seq
        out[#out + 1] = seq
        out[#out + 1] = count
        out[#out + 1] = recs[i]
        got = got + 1
      end
    end
  end
end
local newCursor = nil
if room - got > 0 then
  local last = (rcall('HGET', meta, 'seq') or 0) + 0
  local upto = cursor + room - got
  if upto > last then
    upto = last
  end
  if upto > cursor then
    local fields = {}
    for seq = cursor + 1, upto do
      fields[#fields + 1] = string.format('%d', seq)
    end
    local recs = rcall('HMGET', msgs, unpack(fields))
    local first = token and ('1:' .. token)
    for i, field in ipairs(fields) do
      if recs[i] then
        states[#states + 1] = field
        states[#states + 1] = first
        seqs[#seqs + 1] = field
        out[#out + 1] = field
        out[#out + 1] = 1
        out[#out + 1] = recs[i]
        got = got + 1
      end
    end
    newCursor = fields[#fields]
  end
end
if got > 0 then
  rcall('HSET', dlv, unpack(states))
  rcall('HSET', calls, token, table.concat(seqs, ','), 'h:' .. token, consumer, 'n:' .. token, got)
  rcall('ZADD', exp, string.format('%d', now + ackWait), token)
end
if newCursor then
  rcall('HSET', g, heldField, held + got, 'inflight', inflight + got, 'cursor', newCursor)
elseif got > 0 then
  rcall('HSET', g, heldField, held + got, 'inflight', inflight + got)
end
return out
