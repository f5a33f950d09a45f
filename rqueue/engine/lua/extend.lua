--[[
  Extends the leases of deliveries held by this consumer to now + ack_wait
  (in_progress, JetStream's +WPI) and records a heartbeat.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua), and KEYS[18] the
      side hash for a stream log (sent with them, not read here)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8], ARGV[9], ... seq1, count1, token1, seq2, count2, token2, ...
  Output:
    { new_deadline_ms, status1, status2, ... } with "ok" or an error code
    (RQ_ACKED, RQ_UNKNOWN_TAG, RQ_NOT_HELD, RQ_STALE, RQ_CORRUPT: the
    delivery state is missing though leased, or does not parse) per tag; a
    tag that is not "ok" is left as it was.
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include group_args
--@include beat
--@layout stream
--@include bulk
-- Call records (a stream log's first deliveries): made on their paths.
--@lazy callPaths call_state
--@end
--@include extend_tags

-- A consumer removed as dead is no member: it must not look alive again.
if rcall('HEXISTS', consumersKey, consumerName) == 1 then
  beat()
end
local deadline = now + ackWait
local out = {deadline}
for _, status in ipairs(extendTags(8, deadline)) do
  out[#out + 1] = status
end
return out
