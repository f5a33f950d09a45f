--[[
  Dead-letters one delivery held by this consumer at once (reject without
  requeue, or term with a reason). With dead_letter "drop" the message is
  dropped and counted instead.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua), and KEYS[18] the
      side hash for a stream log (read where a record is a stub)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] seq
    ARGV[9] delivery count of the tag
    ARGV[10] token of the tag
    ARGV[11] reason, e.g. "rejected", "terminated" or "expired" (a message
             past its time to live, set aside by the client's fetch)
    ARGV[12] error text for the record, may be ""
    ARGV[13] "failed" or "expired" to record that event (its reason the error text,
             its dlq_seq the dead letter's), or "" (or absent) for none:
             the client sends it only when the queue's events setting
             names it
  Output:
    the seq of the message in the dead-letter queue, or 0 when dropped
  Errors (nothing is changed):
    RQ_ACKED, RQ_UNKNOWN_TAG, RQ_NOT_HELD, RQ_STALE  <seq>.<count>.<token>
    RQ_CORRUPT <seq>.<count>.<token>  the message is leased but its delivery
                   state is missing, or the state does not parse
    RQ_BAD_ARGUMENT  the failure policy (ARGV[7]) does not parse, or
                     ARGV[13] is neither "failed", "expired" nor ""
]]
--@flags allow-oom
--@include layout
--@layout stream
--@include group_keys
--@include group_names
--@include bulk
-- Call records (a stream log's first deliveries): split out when named.
--@lazy callPaths call_state
--@end
--@include reject_one

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end

local event = ARGV[13] or ''
if event ~= '' and event ~= 'failed' and event ~= 'expired' then
  return redis.error_reply('RQ_BAD_ARGUMENT reject records no event ' .. event .. ' (ARGV[13]: failed, expired or "")')
end
local dseq, err = rejectOne(ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], event)
if dseq == nil then
  return redis.error_reply(err)
end
return dseq
