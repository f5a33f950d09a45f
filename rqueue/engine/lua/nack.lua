--[[
  Negative acknowledgement of deliveries held by this consumer: each message
  is offered again, ahead of every later message (guarantee 8 in
  docs/guarantees.md), now, after the given delay, or after the redelivery
  policy's delay. A message that has had max_deliveries deliveries is
  dead-lettered instead.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] seq
    ARGV[9] delivery count of the tag
    ARGV[10] token of the tag
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
    (with more tags these are the tags' statuses instead: the others are
    nacked)
    RQ_BAD_ARGUMENT  the failure policy (ARGV[7]) does not parse, ARGV[13]
                     is no event kind nack records, or the tags after
                     ARGV[13] are not in threes
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include delivery_state
--@include check_tag
--@include retry_or_dead_letter
--@include record_event

local event = ARGV[13] or ''
if event ~= '' and event ~= 'failed' and event ~= 'timeout' then
  return redis.error_reply('RQ_BAD_ARGUMENT nack records no event ' .. event .. ' (ARGV[13]: failed, timeout or "")')
end
if #ARGV > 13 and (#ARGV - 13) % 3 ~= 0 then
  return redis.error_reply('RQ_BAD_ARGUMENT nack takes more tags in threes (ARGV[14..])')
end
local delayMs = nil
if ARGV[11] ~= '' then
  delayMs = tonumber(ARGV[11])
end

-- Nacks the tag at ARGV[first..first + 2]: returns its status and where
-- ("requeued" and the due time, "dead" and the dead letter's seq), or nil
-- and the error (its code, the tag, and what is wrong), having changed nothing.
local function nackTag(first)
  local seq, count = tonumber(ARGV[first]), tonumber(ARGV[first + 1])
  local d = seq and readDelivery(dlvKey, seq)
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
    recordEvent(event, ARGV[first], string.sub(ARGV[12], 1, 1024), due == 'dead' and dseq or '')
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
local out = {}
local firsts = {8}
for first = 14, #ARGV, 3 do
  firsts[#firsts + 1] = first
end
for _, first in ipairs(firsts) do
  local status, where, code = nackTag(first)
  out[#out + 1] = status or code
  out[#out + 1] = status and where or ''
end
return out
