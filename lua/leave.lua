--[[
  Removes a consumer from its group and returns every delivery it holds
  (SPEC guarantee 7). A graceful leave puts them back at once, ready before
  new messages, with their delivery counts kept; removing a dead member
  counts each as a failed attempt (includes/return_held.lua).

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua)
    ARGV[1..14] the group arguments (includes/group_args.lua)
    ARGV[15] the consumer to remove
    ARGV[16] "graceful" or "dead"
  Output:
    { returned, dead_lettered }
]]
--@include read_now
--@include group_keys
--@include group_args
--@include delivery_state
--@include record
--@include bulk
--@include settle
--@include redelivery
--@include group_ops
--@include return_held

local returned, dead = returnHeld(ARGV[15], ARGV[16] == 'graceful')
return {returned, dead}
