--[[
  Prototype (b), stream + PEL: claims up to n deliveries for one consumer.
  The in-flight state of a delivery is its entry in the consumer group's
  PEL (holder, delivery count, delivery time); the lease deadline is the
  delivery time + ack_wait. What is kept per fetch call, not per message:
  the call's token (the fencing word of every tag it makes) -> its
  deadline in the exp zset, and -> how many of its deliveries are still
  out in the calls hash. A call whose deadline passed is what makes a
  fetch look for expired deliveries (XPENDING IDLE), so a fetch that
  finds none pays one ZCOUNT.

  KEYS[1] stream  KEYS[2] group hash (m:<c> member, h:<c> held, inflight,
    last = last id delivered, paused)  KEYS[3] exp zset (token -> deadline
    ms)  KEYS[4] calls hash (token -> deliveries out)  KEYS[5] dead-letter
    stream
  ARGV[1] group  ARGV[2] consumer  ARGV[3] ack_wait ms  ARGV[4] max_inflight
  ARGV[5] prefetch  ARGV[6] max_deliveries  ARGV[7] n  ARGV[8] token
  Reply: { now_ms, id1, count1, payload1, ... }
  Errors: RQ_BAD_ARGUMENT token; RQ_NOT_MEMBER
]]
local rcall = redis.call
local EXPIRE_BATCH = 1000
local s, g, exp, calls, dlq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
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
local f = rcall('HMGET', g, 'm:' .. consumer, heldField, 'inflight', 'paused')
if not f[1] then
  return redis.error_reply('RQ_NOT_MEMBER consumer ' .. consumer .. ' is not a member of group ' .. group)
end
local out = {nowText}
if f[4] then
  return out
end
local held, inflight = (f[2] or 0) + 0, (f[3] or 0) + 0
local room = ARGV[7] + 0
if ARGV[4] - inflight < room then
  room = ARGV[4] - inflight
end
if ARGV[5] - held < room then
  room = ARGV[5] - held
end
local got = 0
-- Expired leases: only when some call's deadline has passed.
if room > 0 and inflight > 0 and rcall('ZCOUNT', exp, '-inf', nowText) > 0 then
  local pend = rcall('XPENDING', s, group, 'IDLE', ackWait, '-', '+', EXPIRE_BATCH)
  local claim, counts = {}, {}
  local handled = 0
  for _, e in ipairs(pend) do
    local id, holder, count = e[1], e[2], e[4]
    if count >= ARGV[6] + 0 then
      -- Dead letter: the entry goes to the dead-letter stream with its
      -- history, and leaves the PEL (the group is done with it).
      local rec = rcall('XRANGE', s, id, id)
      if rec[1] then
        rcall('XADD', dlq, '*', 'p', rec[1][2][2], 'x-rq-id', id, 'x-rq-group', group,
          'x-rq-deliveries', count, 'x-rq-reason', 'max-deliveries')
      end
      rcall('XACK', s, group, id)
      rcall('HINCRBY', g, 'h:' .. holder, -1)
      inflight = inflight - 1
      handled = handled + 1
    elseif #claim < room then
      claim[#claim + 1] = id
      counts[id] = count + 1
      if holder ~= consumer then
        rcall('HINCRBY', g, 'h:' .. holder, -1)
        held = held + 1
      end
      handled = handled + 1
    end
  end
  if #claim > 0 then
    -- min-idle = ack_wait again: XCLAIM takes only what is still expired.
    local entries = rcall('XCLAIM', s, group, consumer, ackWait, unpack(claim))
    for _, e in ipairs(entries) do
      out[#out + 1] = e[1]
      out[#out + 1] = counts[e[1]]
      out[#out + 1] = e[2][2]
      got = got + 1
    end
  end
  if #pend < EXPIRE_BATCH and handled == #pend then
    -- Every expired delivery is handled: the calls whose deadline passed
    -- have nothing out any more that is not taken back.
    local gone = rcall('ZRANGEBYSCORE', exp, '-inf', nowText)
    rcall('ZREMRANGEBYSCORE', exp, '-inf', nowText)
    rcall('HDEL', calls, unpack(gone))
  end
end
local last = nil
if room - got > 0 then
  local r = rcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', room - got, 'STREAMS', s, '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      out[#out + 1] = e[1]
      out[#out + 1] = 1
      out[#out + 1] = e[2][2]
      last = e[1]
    end
    got = got + #r[1][2]
  end
end
if got > 0 then
  rcall('ZADD', exp, string.format('%d', now + ackWait), token)
  rcall('HSET', calls, token, got)
  local newInflight = inflight + got
  if last then
    rcall('HSET', g, heldField, held + got, 'inflight', newInflight, 'last', last)
  else
    rcall('HSET', g, heldField, held + got, 'inflight', newInflight)
  end
end
return out
