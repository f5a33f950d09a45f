--[[
  What became of one message: found by its seq, or by its id through the
  de-duplication key publish wrote (an index that Redis expires with the
  window: no other write on the publish path), and, per group, whether it
  is waiting to be read, delayed, in flight (with whom, how many
  deliveries), waiting for a redelivery, acked, dead-lettered or dropped
  (with the reason, from the events stream). Changes nothing.

  Input:
    KEYS[1] meta     hash    seq (last assigned), inc (incarnation)
    KEYS[2] msgs     hash    seq -> record
    KEYS[3] floors   hash    group -> ack floor
    KEYS[4] events   stream  dead-letters, drops and replays (capped)
    KEYS[5] the id key (string "<seq>:<expires_ms>:<incarnation>"), or the
      meta key again when the message is named by its seq
    then 4 keys per group named in ARGV[4..]: its dlv (delivery states),
      acked (runs above the floor), delay (due times) and reopen (the seqs
      a replay reopened, replay.lua: unsettled again, whatever the floor
      and the acked runs say)
    then the pinned hash (seq -> groups that reopened it; in a stream log's
      queue also the records of those seqs, includes/log.lua)
    --@layout stream
    then, for a stream log only, 2 keys per group in the same order: its
      calls (token -> call record) and cseq (token -> first seq), by which
      a first delivery out on a call is found (includes/call_state.lua)
    --@end
    then, for a stream log only, its side hash (the records of the messages
      published with a priority or a key, includes/log.lua)
    ARGV[1] now in ms, or "" for the server's TIME
    ARGV[2] the seq, or "" to read it from the id key (KEYS[5])
    ARGV[3] the most events to read, newest first, for a dead letter's reason
    ARGV[4..] group names, in the order of their keys
  Output:
    { found (0: unknown), seq, last seq, published_ms ("" when the record is
      gone), not_before_ms ("" when none or already due), then per group: name, state,
      consumer, deliveries, reason }
    state is one of: pending (not read yet), delayed (a delayed publish or
    redelivery not yet due), in-flight (consumer holds it, deliveries made),
    waiting (a redelivery due now), acked (settled, and no dead-letter or
    drop in the events read), dead-lettered, dropped (reason given), or
    unknown-group (the group was deleted meanwhile)
  Errors: RQ_BAD_ARGUMENT a seq that is not a whole number >= 1; RQ_LAYOUT
    KEYS[2] is the log key of the other layout than the queue's, or a stream
    log's call was not sent its side hash last (includes/layout.lua).
]]
--@include log_one
--@include layout
--@include read_now
--@include record
--@include delivery_state

local rcall = redis.call
local now = readNow(ARGV[1])
local fields = rcall('HMGET', KEYS[1], 'seq', 'inc', 'layout')
local sideKey = sentSideKey(KEYS[2])
local wrongLayout = layoutError(KEYS[1], KEYS[2], fields[3], fields[1]) or sideKeyError(KEYS[2], sideKey)
if wrongLayout then
  return wrongLayout
end
local last, inc = tonumber(fields[1] or '0') or 0, fields[2] or ''

local seq = nil
if ARGV[2] ~= '' then
  seq = tonumber(ARGV[2])
  if not (seq and seq >= 1 and seq % 1 == 0) then
    return redis.error_reply('RQ_BAD_ARGUMENT the seq (ARGV[2]) must be a whole number >= 1, not ' .. ARGV[2])
  end
elseif KEYS[5] ~= KEYS[1] then
  local value = rcall('GET', KEYS[5])
  if value then
    local s, expires, owner = string.match(value, '^(%d+):(%d+):?(.*)$')
    if s and tonumber(expires) > now and (owner == inc or owner == '') then
      seq = tonumber(s)
    end
  end
end
if seq == nil or seq > last then
  return {0, seq or 0, last, '', ''}
end

local rec = logRead(KEYS[2], sideKey, seq, KEYS[6 + 4 * (#ARGV - 3)])
local published, notBefore = '', ''
if rec then
  published = recordPublished(rec) or ''
  local nb = recordNotBefore(rec)
  if nb and nb > now then
    notBefore = string.format('%.0f', nb)
  end
end

-- The newest dead-letter, drop or replay of this seq per group, read once.
local fates = nil
local function fateOf(group)
  if fates == nil then
    fates = {}
    local wanted = tostring(seq)
    for _, entry in ipairs(rcall('XREVRANGE', KEYS[4], '+', '-', 'COUNT', ARGV[3])) do
      local f = {}
      local kv = entry[2]
      for i = 1, #kv, 2 do
        f[kv[i]] = kv[i + 1]
      end
      if f.seq == wanted and f.group and fates[f.group] == nil then
        fates[f.group] = {f.event, f.reason or ''}
      end
    end
  end
  return fates[group]
end

--@layout stream
-- The call record that has seq out, in a stream log's group: its holder,
-- or nil (includes/call_state.lua has the record's form).
local groupCount = #ARGV - 3
local callKeysAt = nil
if sideKey and #KEYS == 7 + 6 * groupCount then
  callKeysAt = 7 + 4 * groupCount
end
local function callHolder(g)
  if not callKeysAt then
    return nil
  end
  local callsKey, callSeqKey = KEYS[callKeysAt + 2 * g], KEYS[callKeysAt + 2 * g + 1]
  local found = rcall('ZRANGE', callSeqKey, seq, '-inf', 'BYSCORE', 'REV', 'LIMIT', '0', '1')
  local raw = found[1] and rcall('HGET', callsKey, found[1])
  local first, bytes, holder = string.match(raw or '', '^(%d+) %d+ %d+ ([01]+) (%S+)$')
  local i = first and seq - first + 1
  if i and i >= 1 and string.sub(bytes, i, i) == '1' then
    return holder
  end
  return nil
end

--@end
local out = {1, seq, last, published, notBefore}
local k = 6
for i = 4, #ARGV do
  local group = ARGV[i]
  local dlvKey, ackedKey, delayKey, reopenKey = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  k = k + 4
  local state, consumer, count, reason = 'pending', '', 0, ''
  local floor = tonumber(rcall('HGET', KEYS[3], group) or '')
  -- A seq reopened by replay is pending again in this group though it may
  -- sit at or below the floor (stats.lua reads the same set): its state
  -- is its delivery's, until a settle takes it out of the reopen set.
  local reopened = false
  if floor ~= nil and rcall('ZSCORE', reopenKey, seq) then
    reopened = true
  end
  local settled = floor ~= nil and not reopened and seq <= floor
  if floor ~= nil and not settled and not reopened then
    local run = rcall('ZRANGEBYSCORE', ackedKey, seq, '+inf', 'LIMIT', '0', '1')
    settled = run[1] ~= nil and run[1] + 0 <= seq
  end
  local d = (floor ~= nil and not settled) and parseDelivery(seq, rcall('HGET', dlvKey, seq)) or nil
  --@layout stream
  if floor ~= nil and not settled and not d then
    local holder = callHolder(i - 4)
    if holder then
      d = {holder = holder, count = 1}
    end
  end
  --@end
  local due = (floor ~= nil and not settled) and tonumber(rcall('ZSCORE', delayKey, seq) or '') or nil
  if floor == nil then
    state = 'unknown-group'
  elseif settled then
    state = 'acked'
    local fate = fateOf(group)
    if fate and (fate[1] == 'dead-lettered' or fate[1] == 'dropped') then
      state, reason = fate[1], fate[2]
    end
  elseif d and d.holder ~= '' then
    state, consumer, count = 'in-flight', d.holder, d.count
  elseif due and due > now then
    state, count = 'delayed', d and d.count or 0
  elseif d then
    state, count = 'waiting', d.count
  elseif notBefore ~= '' then
    state = 'delayed'
  end
  out[#out + 1] = group
  out[#out + 1] = state
  out[#out + 1] = consumer
  out[#out + 1] = count
  out[#out + 1] = reason
end
return out
