--[[
  Dead-letters one delivery held by this consumer at once (reject without
  requeue, or term with a reason). With dead_letter "drop" the message is
  dropped and counted instead.

  Input:
    KEYS[1..20] the group layout (includes/group_keys.lua)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] seq
    ARGV[9] delivery count of the tag
    ARGV[10] token of the tag
    ARGV[11] reason, e.g. "rejected" or "terminated"
    ARGV[12] error text for the record, may be ""
  Output:
    the seq of the message in the dead-letter queue, or 0 when dropped
  Errors (nothing is changed):
    RQ_ACKED, RQ_UNKNOWN_TAG, RQ_NOT_HELD, RQ_STALE  <seq>.<count>.<token>
    RQ_CORRUPT <seq>.<count>.<token>  the message is leased but its delivery
                   state is missing, or the state does not parse
    RQ_BAD_ARGUMENT  the failure policy (ARGV[7]) does not parse
]]
--@flags allow-oom
--@include group_keys
--@include delivery_state
--@include check_tag
--@include dead_letter

local seq, count = tonumber(ARGV[8]), tonumber(ARGV[9])
local d = seq and readDelivery(dlvKey, seq)
local code = checkTag(seq, count, ARGV[10], d, false)
if code ~= 'ok' then
  local why = code == 'RQ_CORRUPT' and (': its delivery state in ' .. dlvKey .. ' is missing') or ''
  return redis.error_reply(code .. ' ' .. tostring(ARGV[8]) .. '.' .. tostring(ARGV[9]) .. '.' .. tostring(ARGV[10]) .. why)
end
return deadLetter(seq, d, ARGV[11], ARGV[12])
