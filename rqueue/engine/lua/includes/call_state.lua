--[[
  Call records: the first deliveries of one fetch from the cursor, in a
  stream log's group sent the call keys (includes/group_keys.lua: callsKey,
  callExpKey, callSeqKey). A fetch that takes at least CALL_MIN messages
  from the cursor (fetch.lua) writes one record for them instead of a
  delivery state and a lease per seq:
    calls  field <token> = "<first seq> <fetch ms> <out> <bytes> <holder>":
           one byte per seq from the first, "1" while that seq is out on
           the call, "0" once it is settled, split out, or was never handed
           out by the call (a seq the scan passed); out counts the "1"s
    cexp   <token> -> the call's deadline (ms)
    cseq   <token> -> its first seq
           (each set also holds SKIPLIST_PIN at +inf, includes/group_keys.lua)
    group field "callout": the seqs out on calls. The holder's count in
           the consumers hash includes its call deliveries, so in flight
           is ZCOUNT lease + callout (deliveriesOut, includes/group_keys.lua).
  A seq is out on at most one path: its byte is "1" in a call, or it has a
  delivery state, never both. Call ranges are disjoint and rise with the
  cursor, so the call that may hold seq s is the one with the highest first
  seq at or below s.

  Only fetch's scan and expiry, the ack of a call's own delivery and an
  extension handle calls as they are. Everything else splits the call
  deliveries it touches first: a split gives a seq today's state
  "1:<holder>:<ms>:<ms>:<token>" and a lease at the call's deadline, clears
  its byte and lowers out and callout (the record goes at out 0), after
  which the per-message code runs unchanged.

  A record that does not parse raises RQ_CORRUPT (rqueue doctor --repair
  splits what it can and deletes it). A token in cexp or cseq without a
  record is dropped from both by a split that meets it.

  (Few top-level helpers: fetch's main chunk is near Lua's 200 locals.)
]]
--@include group_keys
--@include group_names
--@include bulk

-- How many seqs left calls in this script call (callStore): fetch keeps
-- callout from its first read of the group hash by it.
local callsLeft = 0

-- The call record of token, parsed ({first, ms, out, bytes, holder}); nil
-- when there is none. raw: the record when read already. Raises
-- RQ_CORRUPT when it does not parse.
local function callRead(token, raw)
  raw = raw or rcall('HGET', callsKey, token)
  if not raw then
    return nil
  end
  -- The head by a pattern, the bytes and the holder by plain finds: a
  -- pattern over the bytes costs a call of thousands of seqs dearly at
  -- every ack of one.
  local first, ms, out, at = string.match(raw, '^(%d+) (%d+) (%d+) ()')
  local space = at and string.find(raw, ' ', at, true)
  local holder = space and string.sub(raw, space + 1)
  if not holder or holder == '' or string.find(holder, ' ', 1, true) or space == at then
    error('RQ_CORRUPT ' .. callsKey .. ' field ' .. token .. ' holds ' .. string.sub(raw, 1, 60)
      .. ', not a call record; `rqueue doctor --repair` splits it out')
  end
  return {first = first + 0, ms = ms, out = out + 0, bytes = string.sub(raw, at, space - 1), holder = holder}
end

-- Writes back call c of token after k of its seqs left it: the record, or
-- at out 0 its deletion; callout lowered by k.
local function callStore(token, c, k)
  if k == 0 then
    return
  end
  c.out = c.out - k
  if c.out <= 0 then
    rcall('HDEL', callsKey, token)
    rcall('ZREM', callExpKey, token)
    rcall('ZREM', callSeqKey, token)
  else
    rcall('HSET', callsKey, token, c.first .. ' ' .. c.ms .. ' ' .. c.out .. ' ' .. c.bytes .. ' ' .. c.holder)
  end
  rcall('HINCRBY', groupKey, 'callout', -k)
  callsLeft = callsLeft + k
end

-- Splits out of call token the seqs whose bytes are "1": all of them, or
-- those in want (seq -> true) when given. Returns how many. A token
-- without a record (deleted) leaves cexp and cseq, and returns 0, true and
-- the call's first seq as cseq held it (false when it held none): which
-- seqs the call held went with the record, so the caller can only report it.
local function splitCall(token, want)
  local c = callRead(token)
  if not c then
    local first = rcall('ZSCORE', callSeqKey, token)
    rcall('ZREM', callExpKey, token)
    rcall('ZREM', callSeqKey, token)
    return 0, true, first
  end
  local deadline = rcall('ZSCORE', callExpKey, token) or c.ms
  local state = '1:' .. c.holder .. ':' .. c.ms .. ':' .. c.ms .. ':' .. token
  local bytes, states, leases = {}, {}, {'+inf', SKIPLIST_PIN}
  local k = 0
  for i = 1, #c.bytes do
    local b = string.sub(c.bytes, i, i)
    if b == '1' then
      local seq = c.first + i - 1
      if not want or want[seq] then
        local field = string.format('%d', seq)
        states[#states + 1] = field
        states[#states + 1] = state
        leases[#leases + 1] = deadline
        leases[#leases + 1] = field
        b = '0'
        k = k + 1
      end
    end
    bytes[i] = b
  end
  if k > 0 then
    bulk('HSET', dlvKey, states)
    bulk('ZADD', leaseKey, leases)
    c.bytes = table.concat(bytes)
    callStore(token, c, k)
  end
  return k
end

-- For seq s (a number) out on a call: the delivery state a split would give
-- it, and the call's token; nil when it is out on none. Changes nothing
-- (status, an ack's check of another's tag).
local function callStateOf(s)
  local found = rcall('ZRANGE', callSeqKey, string.format('%d', s), '-inf', 'BYSCORE', 'REV', 'LIMIT', '0', '1')
  local c = found[1] and callRead(found[1])
  if not c then
    return nil
  end
  local i = s - c.first + 1
  if i < 1 or i > #c.bytes or string.sub(c.bytes, i, i) ~= '1' then
    return nil
  end
  return '1:' .. c.holder .. ':' .. c.ms .. ':' .. c.ms .. ':' .. found[1], found[1]
end

-- 1 when the group has call records, else 0 (always for a group without
-- call keys: a hash log). The records, not "callout", say so: a damaged
-- count hides no call. Raises RQ_LAYOUT for a stream log's call sent no
-- call keys, which could not see the calls.
local function callsOut()
  if not callsKey then
    if string.byte(msgsKey, -1) == 103 then -- 103: 'g' of ":log"
      error('RQ_LAYOUT ' .. msgsKey .. ' is a stream log: the call must be sent the call keys of group '
        .. groupName .. ' (' .. string.sub(msgsKey, 1, -4) .. 'calls:' .. groupName .. ', cexp, cseq)')
    end
    return 0
  end
  return rcall('EXISTS', callsKey)
end

-- Splits the seqs (numbers or seq strings) out of their calls, one split
-- per call met. Returns how many were out on calls.
local function splitSeqs(seqs)
  if #seqs == 0 or callsOut() == 0 then
    return 0
  end
  local byToken, tokens = {}, {}
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    local _, token = nil, nil
    if seq then
      _, token = callStateOf(seq)
    end
    if token then
      if not byToken[token] then
        byToken[token] = {}
        tokens[#tokens + 1] = token
      end
      byToken[token][seq] = true
    end
  end
  local k = 0
  for _, token in ipairs(tokens) do
    k = k + splitCall(token, byToken[token])
  end
  return k
end

-- Splits seq s (a number or a seq string) out of its call, when it is out
-- on one. Returns true when it was.
local function splitSeq(s)
  return splitSeqs({s}) > 0
end

-- For a tag (seq, a number; countText and token as sent) of a seq without
-- a delivery state: when the tag is the call's own delivery of seq to
-- consumerName, splits it out and answers true (its state is there now);
-- when seq is out on a call otherwise, answers false and the state a split
-- would give it, by which the caller judges the tag, changing nothing.
local function splitTag(seq, countText, token)
  if callsOut() == 0 then
    return false
  end
  local state, callToken = callStateOf(seq)
  if not state then
    return false
  end
  if countText == '1' and token == callToken and string.sub(state, 1, #consumerName + 3) == '1:' .. consumerName .. ':' then
    splitCall(callToken, {[seq] = true})
    return true
  end
  return false, state
end

-- Splits every call that meets seqs low..high (numbers).
local function splitRange(low, high)
  if callsOut() == 0 then
    return
  end
  local tokens = rcall('ZRANGE', callSeqKey, string.format('%d', low), '-inf', 'BYSCORE', 'REV', 'LIMIT', '0', '1')
  for _, token in ipairs(rcall('ZRANGEBYSCORE', callSeqKey, '(' .. string.format('%d', low),
    string.format('%d', high))) do
    tokens[#tokens + 1] = token
  end
  for _, token in ipairs(tokens) do
    splitCall(token)
  end
end

-- Splits every call held by member (nil: every call; then the tokens of
-- cexp and cseq without a record go too).
local function splitHeldBy(member)
  if callsOut() == 0 and member then
    return
  end
  if not callsKey then
    return
  end
  local all = rcall('HGETALL', callsKey)
  for i = 1, #all, 2 do
    if member == nil or callRead(all[i], all[i + 1]).holder == member then
      splitCall(all[i])
    end
  end
  if member == nil then
    for _, key in ipairs({callExpKey, callSeqKey}) do
      for _, token in ipairs(rcall('ZRANGE', key, '0', '-1')) do
        if token ~= SKIPLIST_PIN and rcall('HEXISTS', callsKey, token) == 0 then
          rcall('ZREM', key, token)
        end
      end
    end
  end
end

-- The batch ack's check of tag (field, count 1, token) against the calls
-- (cache: token -> parsed record, or false when none): the seq (a number)
-- when the call has it out to consumerName, which this batch takes
-- (c.taken, c.n; once); else nil.
local function callTag(field, token, cache)
  local seq = tonumber(field)
  if not seq or string.format('%d', seq) ~= field then
    return nil
  end
  local c = cache[token]
  if c == nil then
    c = callRead(token) or false
    if c then
      c.taken, c.n = {}, 0
    end
    cache[token] = c
  end
  if not c or c.holder ~= consumerName then
    return nil
  end
  local i = seq - c.first + 1
  if i < 1 or i > #c.bytes or string.sub(c.bytes, i, i) ~= '1' then
    return nil
  end
  local spans = c.spans
  if spans then
    -- Taken by a range of this call already (includes/ack_ranges.lua):
    -- listed twice. The spans ascend: a binary search, so that tags beside
    -- a range of many gaps cost log(spans) each.
    local lo, hi = 1, #spans / 2
    while lo <= hi do
      local mid = math.floor((lo + hi) / 2)
      if i < spans[2 * mid - 1] then
        hi = mid - 1
      elseif i > spans[2 * mid] then
        lo = mid + 1
      else
        return seq, true
      end
    end
  end
  if not c.taken[i] then -- (listed twice: the caller's check of seqs seen names it)
    c.taken[i] = true
    c.n = c.n + 1
  end
  return seq
end

-- Writes what callTag took (its cache): each call's bytes, out and
-- callout. Returns how many seqs left calls.
local function callAcksStore(cache)
  local total = 0
  for token, c in pairs(cache) do
    if c and c.n > 0 then
      local spans = c.spans
      if spans and next(c.taken) == nil then
        -- Ranges alone (includes/ack_ranges.lua): their spans of bytes, in
        -- order, become 0s by whole pieces.
        local pieces, at = {}, 1
        for j = 1, #spans, 2 do
          pieces[#pieces + 1] = string.sub(c.bytes, at, spans[j] - 1)
          pieces[#pieces + 1] = string.rep('0', spans[j + 1] - spans[j] + 1)
          at = spans[j + 1] + 1
        end
        pieces[#pieces + 1] = string.sub(c.bytes, at)
        c.bytes = table.concat(pieces)
      else
        if spans then
          for j = 1, #spans, 2 do
            for i = spans[j], spans[j + 1] do
              c.taken[i] = true
            end
          end
        end
        local bytes = {}
        for i = 1, #c.bytes do
          bytes[i] = c.taken[i] and '0' or string.sub(c.bytes, i, i)
        end
        c.bytes = table.concat(bytes)
      end
      callStore(token, c, c.n)
      total = total + c.n
    end
  end
  return total
end

-- An extension's tags ARGV[first], ARGV[first + 1], ... (seq, count, token
-- triples) that name seqs out on calls to consumerName: a call whose every
-- seq still out is named gets deadline (cexp); the named seqs of a call
-- named in part are split out, to be extended per message. Returns the
-- ARGV indexes of the tags extended here (index -> true).
local function extendCalls(first, deadline)
  local extended = {}
  if callsOut() == 0 then
    return extended
  end
  local cache, tokenOf = {}, {}
  for i = first, #ARGV, 3 do
    if ARGV[i + 1] == '1' and callTag(ARGV[i], ARGV[i + 2], cache) then
      tokenOf[i] = ARGV[i + 2]
    end
  end
  local whole = {}
  for token, c in pairs(cache) do
    if c and c.n > 0 then
      if c.n == c.out then
        rcall('ZADD', callExpKey, deadline, token)
        whole[token] = true
      else
        local want = {}
        for i in pairs(c.taken) do
          want[c.first + i - 1] = true
        end
        splitCall(token, want)
      end
    end
  end
  for i, token in pairs(tokenOf) do
    if whole[token] then
      extended[i] = true
    end
  end
  return extended
end

-- Splits out the seqs out on member's calls that known (seq ->
-- "<count>.<token>") does not list as that call's delivery: a heartbeat's
-- sync then hands them back per message.
local function splitUnknown(member, known)
  if callsOut() == 0 then
    return
  end
  local all = rcall('HGETALL', callsKey)
  for i = 1, #all, 2 do
    local c = callRead(all[i], all[i + 1])
    if c.holder == member then
      local want, any = {}, false
      for j = 1, #c.bytes do
        local seq = c.first + j - 1
        if string.sub(c.bytes, j, j) == '1' and known[seq] ~= '1.' .. all[i] then
          want[seq], any = true, true
        end
      end
      if any then
        splitCall(all[i], want)
      end
    end
  end
end
