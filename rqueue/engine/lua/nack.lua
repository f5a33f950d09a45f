--[[
  Negative acknowledgement of one delivery held by this consumer: the message
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
  Output:
    { "requeued", due_ms } or { "dead", dead_letter_seq } (0 when dropped)
  Errors (nothing is changed):
    RQ_ACKED, RQ_UNKNOWN_TAG, RQ_NOT_HELD, RQ_STALE  <seq>.<count>.<token>
    RQ_CORRUPT <seq>.<count>.<token>  the message is leased but its delivery
                   state is missing, or the state does not parse
    RQ_BAD_ARGUMENT  the failure policy (ARGV[7]) does not parse, or
                     ARGV[13] is no event kind nack records
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include delivery_state
--@include check_tag
--@include retry_or_dead_letter
--@include record_event

local seq, count = tonumber(ARGV[8]), tonumber(ARGV[9])
local event = ARGV[13] or ''
if event ~= '' and event ~= 'failed' and event ~= 'timeout' then
  return redis.error_reply('RQ_BAD_ARGUMENT nack records no event ' .. event .. ' (ARGV[13]: failed, timeout or "")')
end
local delayMs = nil
if ARGV[11] ~= '' then
  delayMs = tonumber(ARGV[11])
end

local d = seq and readDelivery(dlvKey, seq)
local code = checkTag(seq, count, ARGV[10], d, false)
if code ~= 'ok' then
  local why = code == 'RQ_CORRUPT' and (': its delivery state in ' .. dlvKey .. ' is missing') or ''
  return redis.error_reply(code .. ' ' .. tostring(ARGV[8]) .. '.' .. tostring(ARGV[9]) .. '.' .. tostring(ARGV[10]) .. why)
end
-- Settled: a later ack, nack or reject of this same delivery is stale.
local due, dseq = retryOrDeadLetter(seq, d, delayMs, ARGV[12], true)
if event ~= '' then
  -- its reason the error text; its dlq_seq the dead letter's, when this was the last delivery
  recordEvent(event, ARGV[8], string.sub(ARGV[12], 1, 1024), due == 'dead' and dseq or '')
end
if due == 'dead' then
  return {'dead', dseq}
end
rcall('HINCRBY', groupKey, 'nacked', 1)
return {'requeued', due}
