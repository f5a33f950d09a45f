--[[
  Removes a consumer from its group and returns every delivery it holds
  (guarantee 7 in docs/guarantees.md). A graceful leave puts them back at
  once, ready before new messages, with their delivery counts kept; removing
  a dead member counts each as a failed attempt (includes/return_held.lua).

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua), and KEYS[18] the
      side hash for a stream log (read where a record is a stub)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the consumer to remove
    ARGV[9] "graceful" or "dead"
  Output:
    { returned, dead_lettered }
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  the failure policy (ARGV[7]) does not parse
]]
--@flags allow-oom
--@include group_args
--@layout stream
--@include group_keys
--@include bulk
-- Call records (a stream log's first deliveries): made on their paths.
--@lazy callPaths call_state
--@end
--@include return_held
--@include layout

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end

-- Parsed before any write. Each failure path parses it before it changes
-- a delivery, but a graceful leave returns deliveries without it and may
-- meet a corrupt state, which needs it, after it changed others.
failurePolicy()
local returned, dead = returnHeld(ARGV[8], ARGV[9] == 'graceful')
return {returned, dead}
