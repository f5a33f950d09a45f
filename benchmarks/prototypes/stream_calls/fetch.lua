--[[
  Prototype (d), stream log + per-call in-flight records: no consumer
  group, no PEL, and no write per message. A fetch hands out new entries
  from the group's cursor (a seq) and keeps one record per call: the
  calls hash holds <token> -> "<first seq> <out>", <out> one byte per
  entry the call took from the cursor, "1" while it is out and "0" once
  settled or when it went by the per-message path (the entries are
  contiguous: seqs are gap-free and nothing above the cursor is trimmed),
  h:<token> -> holder, n:<token> -> how many are still out, x:<token> ->
  the seqs it handed out by the per-message path (redeliveries, parked
  seqs: each with a state in the dlv hash, seq -> "<count>:<token>"); the exp
  zset <token> -> lease deadline. A first delivery's count (1) costs
  nothing. A fetch that finds no call past its deadline pays one ZCOUNT
  for leases.

  With ARGV[9] "read" the script reads the new entries (XRANGE) and
  returns them; with "claim" it only claims them and returns their first
  seq and how many: the client reads them with XRANGE <first> + COUNT <k>
  (no one can settle or trim them before: they are this call's).

  With ARGV[10] a number e above 0 (the flow-control measurement of
  docs/storage-prototypes.md), every seq the cursor takes that is a
  multiple of e is not handed out in the call's range: its byte in the
  record is "0", it is parked in the ready zset, as a message the cursor
  meets and may not hand out by range (priority, ordering key, delay),
  and the same call hands it out by the per-message path, as a
  redelivery: read from the stream (one XRANGE per run of consecutive
  seqs), a dlv state "1:<token>", listed in x:<token>.
  ARGV[10] absent or 0: no seq takes that path.

  KEYS[1] stream  KEYS[2] group hash (m:<c>, h:<c>, inflight, cursor,
    floor, paused)  KEYS[3] exp zset  KEYS[4] calls hash  KEYS[5] dlv
    hash  KEYS[6] ready zset (seq -> seq)  KEYS[7] dead-letter stream
    KEYS[8] meta hash (seq: the last assigned)
  ARGV[1] group  ARGV[2] consumer  ARGV[3] ack_wait ms  ARGV[4] max_inflight
  ARGV[5] prefetch  ARGV[6] max_deliveries  ARGV[7] n  ARGV[8] token
  ARGV[9] "read" or "claim"  ARGV[10] e (optional, see above)
  Reply: { now_ms, new entries as XRANGE returns them ("read") or
    {first seq, k} ("claim"; {first seq, k, "<parked seq>,..."} when seqs
    of the range were parked: the client drops them from its range),
    then the per-message path (redeliveries and parked seqs): "read":
    id1, count1, payload1, ...; "claim": seq1, count1, seq2, ... (the
    client reads those entries: a seq of the claimed range from its
    XRANGE of the range, any other with an XRANGE of its own) }
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
local f = rcall('HMGET', g, 'm:' .. consumer, heldField, 'inflight', 'cursor', 'paused')
if not f[1] then
  return redis.error_reply('RQ_NOT_MEMBER consumer ' .. consumer .. ' is not a member of group ' .. group)
end
if f[5] then
  return {nowText, {}}
end
local held, inflight, cursor = (f[2] or 0) + 0, (f[3] or 0) + 0, (f[4] or 0) + 0
-- Calls past their deadline: what they still have out is taken back,
-- ready now, or dead-lettered after max_deliveries.
local function takeBack(seq, count)
  if count >= ARGV[6] + 0 then
    local rec = rcall('XRANGE', s, seq, seq)
    rcall('XADD', dlq, '*', 'p', rec[1] and rec[1][2][2] or '', 'x-rq-seq', seq, 'x-rq-deliveries', count)
    rcall('HDEL', dlv, seq) -- settling it (the floor) is left out of the prototype
  else
    rcall('HSET', dlv, seq, count .. ':')
    rcall('ZADD', ready, seq, seq)
  end
end
if inflight > 0 and rcall('ZCOUNT', exp, '-inf', nowText) > 0 then
  for _, tok in ipairs(rcall('ZRANGEBYSCORE', exp, '-inf', nowText, 'LIMIT', '0', EXPIRE_CALLS)) do
    local c = rcall('HMGET', calls, tok, 'h:' .. tok, 'n:' .. tok, 'x:' .. tok)
    local first, out = string.match(c[1] or '', '^(%d+) (%d+)$')
    if first then
      local p = 0
      while true do
        p = string.find(out, '1', p + 1, true)
        if not p then
          break
        end
        takeBack(string.format('%d', first + p - 1), 1)
      end
    end
    for seq in string.gmatch(c[4] or '', '%d+') do
      local count, owner = string.match(rcall('HGET', dlv, seq) or '', '^(%d+):(.*)$')
      if owner == tok then
        takeBack(seq, count + 0)
      end
    end
    local back = (c[3] or 0) + 0
    if c[2] then
      rcall('HINCRBY', g, 'h:' .. c[2], -back)
      if c[2] == consumer then
        held = held - back
      end
    end
    inflight = inflight - back
    rcall('HDEL', calls, tok, 'h:' .. tok, 'n:' .. tok, 'x:' .. tok)
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
local reply = {nowText, {}}
local got = 0
local again = {}
-- The per-message path: the lowest seqs of the ready zset, their counts
-- raised (a seq without a dlv state was never handed out: count 1) and
-- their states "<count>:<token>" written. One command each for the zset,
-- the states read and the states written, whatever the number of seqs;
-- the entries are read one XRANGE per run of consecutive seqs.
local function fromReady(limit)
  local seqs = rcall('ZRANGE', ready, '0', limit - 1)
  if #seqs == 0 then
    return
  end
  rcall('ZREM', ready, unpack(seqs))
  local states = rcall('HMGET', dlv, unpack(seqs))
  local sets = {}
  if ARGV[9] == 'claim' then
    -- The client reads the entries (in its XRANGE of the call's range, or
    -- one XRANGE per run of seqs outside it): no payload crosses into Lua.
    for m, seq in ipairs(seqs) do
      local count = string.match(states[m] or '0:', '^(%d+):') + 1
      sets[#sets + 1] = seq
      sets[#sets + 1] = count .. ':' .. token
      again[#again + 1] = seq
      reply[#reply + 1] = seq
      reply[#reply + 1] = count
    end
    got = got + #seqs
    rcall('HSET', dlv, unpack(sets))
    return
  end
  local i = 1
  while i <= #seqs do
    local j = i
    while j < #seqs and seqs[j + 1] + 0 == seqs[j] + 1 do
      j = j + 1
    end
    local recs = rcall('XRANGE', s, seqs[i], seqs[j])
    local at = 1
    for m = i, j do
      local rec = recs[at]
      if rec and string.match(rec[1], '^(%d+)') == seqs[m] then
        at = at + 1
        local count = string.match(states[m] or '0:', '^(%d+):') + 1
        sets[#sets + 1] = seqs[m]
        sets[#sets + 1] = count .. ':' .. token
        again[#again + 1] = seqs[m]
        reply[#reply + 1] = rec[1]
        reply[#reply + 1] = count
        reply[#reply + 1] = rec[2][2]
        got = got + 1
      end
    end
    i = j + 1
  end
  if #sets > 0 then
    rcall('HSET', dlv, unpack(sets))
  end
end
if room > 0 and rcall('EXISTS', ready) == 1 then
  fromReady(room)
end
local fields = {}
local k = room - got
local every = tonumber(ARGV[10] or '0') or 0
if k > 0 then
  local first = string.format('%d', cursor + 1)
  local entries = nil
  if ARGV[9] == 'claim' then
    local last = (rcall('HGET', KEYS[8], 'seq') or 0) + 0
    if last - cursor < k then
      k = last - cursor
    end
  else
    entries = rcall('XRANGE', s, first, '+', 'COUNT', k)
    k = #entries
  end
  if k > 0 then
    local bits = string.rep('1', k)
    local parked = {}
    if every > 0 then
      local parts, at, members = {}, 1, {}
      local seq = cursor + 1 + (every - (cursor + 1) % every) % every
      while seq <= cursor + k do
        local i = seq - cursor
        parts[#parts + 1] = string.rep('1', i - at)
        parts[#parts + 1] = '0'
        at = i + 1
        local seqText = string.format('%d', seq)
        members[#members + 1] = seqText
        members[#members + 1] = seqText
        parked[#parked + 1] = seqText
        seq = seq + every
      end
      parts[#parts + 1] = string.rep('1', k - at + 1)
      bits = table.concat(parts)
      if #members > 0 then
        rcall('ZADD', ready, unpack(members))
      end
    end
    if #parked < k then
      if entries == nil then
        reply[2] = {first, k}
        if #parked > 0 then
          reply[2][3] = table.concat(parked, ',')
        end
      elseif #parked > 0 then
        local kept = {}
        for i = 1, k do
          if string.byte(bits, i) == 49 then -- "1"
            kept[#kept + 1] = entries[i]
          end
        end
        reply[2] = kept
      else
        reply[2] = entries
      end
      fields = {token, first .. ' ' .. bits}
    end
    got = got + k - #parked
    cursor = cursor + k
    if #parked > 0 then
      fromReady(#parked)
    end
  end
end
if got > 0 then
  fields[#fields + 1] = 'h:' .. token
  fields[#fields + 1] = consumer
  fields[#fields + 1] = 'n:' .. token
  fields[#fields + 1] = got
  if #again > 0 then
    fields[#fields + 1] = 'x:' .. token
    fields[#fields + 1] = table.concat(again, ',')
  end
  rcall('HSET', calls, unpack(fields))
  rcall('ZADD', exp, string.format('%d', now + ackWait), token)
  rcall('HSET', g, heldField, held + got, 'inflight', inflight + got, 'cursor', string.format('%d', cursor))
end
return reply
