--[[
  Negative acknowledgement of deliveries held by this consumer: each message
  is offered again, ahead of every later message (guarantee 8 in
  docs/guarantees.md), now, after the given delay, or after the redelivery
  policy's delay. A message that has had max_deliveries deliveries is
  dead-lettered instead.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua), and KEYS[18] the
      side hash for a stream log (read where a record is a stub)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] seq
    ARGV[9] delivery count of the tag
    ARGV[10] token of the tag
             (ARGV[8..10] all "" with more tags: every tag is in ARGV[14..],
             as a lenient call of one tag sends it)
    ARGV[11] delay in ms, or "" for the redelivery policy
    ARGV[12] error text for the record, may be ""
    ARGV[13] the lifecycle event to record, "failed" or "timeout" (its
             reason the error text), or "" (or absent) for none: the
             client sends one only when the queue's events setting names it
    ARGV[14], ARGV[15], ARGV[16], ... seq, delivery count, token of more
             tags (a worker's failed batch), nacked with the same delay,
             error text and event, each on its own (lenient)
  Output:
    one tag: { "requeued", due_ms } or { "dead", dead_letter_seq } (0 when
    dropped); more: { status1, where1, status2, where2, ... }, per tag in
    order "requeued" and due_ms, "dead" and the dead letter's seq, or the
    tag's error code (as below) and ""
  Errors (nothing is changed):
    RQ_ACKED, RQ_UNKNOWN_TAG, RQ_NOT_HELD, RQ_STALE  <seq>.<count>.<token>
    RQ_CORRUPT <seq>.<count>.<token>  the message is leased but its delivery
                   state is missing, or the state does not parse
    (with more tags these are the tags' statuses instead, RQ_CORRUPT also
    for a delivery state that does not parse: the others are nacked)
    RQ_BAD_ARGUMENT  the failure policy (ARGV[7]) does not parse, ARGV[13]
                     is no event kind nack records, or the tags after
                     ARGV[13] are not in threes
    RQ_CORRUPT <key>  (with more tags) the group's ack floor is not a seq,
                     or the dead-letter queue's next seqs are taken or its
                     last seq is not a seq: checked before any tag is nacked
]]
--@flags allow-oom
--@include log_one
--@include group_keys
--@include group_names
--@include delivery_state
--@include check_tag
--@include retry_or_dead_letter
--@include record_event
--@include layout
--@include text_prefix
--@layout stream
--@include bulk
-- Call records (a stream log's first deliveries): split out when named.
--@lazy callPaths call_state
--@end

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end

local event = ARGV[13] or ''
if event ~= '' and event ~= 'failed' and event ~= 'timeout' then
  return redis.error_reply('RQ_BAD_ARGUMENT nack records no event ' .. event .. ' (ARGV[13]: failed, timeout or "")')
end
if #ARGV > 13 and (#ARGV - 13) % 3 ~= 0 then
  return redis.error_reply('RQ_BAD_ARGUMENT nack takes more tags in threes (ARGV[14..])')
end
--@layout stream
-- The state of seq for tag ARGV[first..first + 2]: a call delivery is
-- split out first when the tag is its own (includes/call_state.lua), and
-- any other tag of one judged by the state a split would give it.
local function stateOf(seq, first)
  local raw = rcall('HGET', dlvKey, seq)
  if not raw and callsKey then
    --@make callPaths
    local split, state = splitTag(seq, ARGV[first + 1], ARGV[first + 2])
    raw = split and rcall('HGET', dlvKey, seq) or state or false
  end
  return raw
end
--@end
local delayMs = nil
if ARGV[11] ~= '' then
  delayMs = tonumber(ARGV[11])
end

-- Nacks the tag at ARGV[first..first + 2]: returns its status and where
-- ("requeued" and the due time, "dead" and the dead letter's seq), or nil
-- and the error (its code, the tag, and what is wrong), having changed nothing.
local function nackTag(first)
  local seq, count = tonumber(ARGV[first]), tonumber(ARGV[first + 1])
  --@layout hash
  local d = seq and readDelivery(dlvKey, seq)
  --@end
  --@layout stream
  local d = nil
  if seq then
    local raw = stateOf(seq, first)
    local corrupt
    d, corrupt = parseDelivery(seq, raw)
    if corrupt then
      error('RQ_CORRUPT delivery state of seq ' .. seq .. ' does not parse: ' .. raw) -- as readDelivery
    end
  end
  --@end
  local code = checkTag(seq, count, ARGV[first + 2], d, false)
  if code ~= 'ok' then
    local why = code == 'RQ_CORRUPT' and (': its delivery state in ' .. dlvKey .. ' is missing') or ''
    return nil, code .. ' ' .. tostring(ARGV[first]) .. '.' .. tostring(ARGV[first + 1]) .. '.'
      .. tostring(ARGV[first + 2]) .. why, code
  end
  -- Settled: a later ack, nack or reject of this same delivery is stale.
  local due, dseq = retryOrDeadLetter(seq, d, delayMs, ARGV[12], true)
  if event ~= '' then
    -- its reason the error text; its dlq_seq the dead letter's, when this was the last delivery
    recordEvent(event, ARGV[first], textPrefix(ARGV[12], 1024), due == 'dead' and dseq or '')
  end
  if due == 'dead' then
    return 'dead', dseq
  end
  rcall('HINCRBY', groupKey, 'nacked', 1)
  return 'requeued', due
end

if #ARGV <= 13 then
  local status, where = nackTag(8)
  if status == nil then
    return redis.error_reply(where)
  end
  return {status, where}
end
-- The first tag, then the rest (the delay, error and event sit between them).
local firsts = {}
if ARGV[8] ~= '' or ARGV[9] ~= '' or ARGV[10] ~= '' then
  firsts[1] = 8
end
for first = 14, #ARGV, 3 do
  firsts[#firsts + 1] = first
end
-- Every tag is checked before anything is written, so that an error of the
-- call (a floor that is not a seq, a failure policy that does not parse, a
-- dead letter where the next one goes) changes nothing, as with one tag. A
-- delivery state that does not parse is its own tag's RQ_CORRUPT (as in
-- ack.lua): the others are nacked.
local codes, dying, seen = {}, 0, {}
for i, first in ipairs(firsts) do
  local seq, count = tonumber(ARGV[first]), tonumber(ARGV[first + 1])
  local d, corrupt = nil, false
  if seq then
    --@layout hash
    d, corrupt = parseDelivery(seq, rcall('HGET', dlvKey, seq))
    --@end
    --@layout stream
    d, corrupt = parseDelivery(seq, stateOf(seq, first))
    --@end
  end
  local code = corrupt and 'RQ_CORRUPT' or checkTag(seq, count, ARGV[first + 2], d, false)
  codes[i] = code
  if code == 'ok' and not seen[seq] then
    seen[seq] = true -- a tag named twice is stale the second time
    if failedForGood(seq, d, failurePolicy()) then
      dying = dying + 1
    end
  end
end
if dying > 0 and failurePolicy().deadLetterMode ~= 'drop' then
  local last = rcall('HGET', dlqMetaKey, 'seq')
  if last and not string.find(last, '^%d+$') then
    error('RQ_CORRUPT ' .. dlqMetaKey .. ' field seq (the last dead letter) holds ' .. string.sub(last, 1, 40)
      .. ', not a seq')
  end
  local base = tonumber(last or '0')
  for k = 1, dying do
    if logTaken(dlqMsgsKey, base + k) then
      error('RQ_CORRUPT ' .. dlqMetaKey .. ' field seq (the last dead letter) is ' .. (last or 'missing')
        .. ', but dead letter ' .. (base + k) .. ' exists in ' .. dlqMsgsKey)
    end
  end
end

local out = {}
for i, first in ipairs(firsts) do
  local status, where, code = nil, nil, codes[i]
  if code == 'ok' then
    status, where, code = nackTag(first) -- again: an earlier tag of the call may have settled it
  end
  out[#out + 1] = status or code
  out[#out + 1] = status and where or ''
end
return out
