--[[
  The refusals a publish makes before it stores anything, for every script
  that stores messages for a publisher (publish.lua, publish_tracked.lua):
  a queue made a partitioned queue (meta field "partitioned", set by
  partition.lua: its messages go to its partitions; the error names the
  layout after this prefix), and a queue paused with mode "refuse" (meta
  field "paused", pause.lua). Strings, not functions: a function is a
  closure made anew by every call.
]]
local PARTITIONED = 'RQ_PARTITIONED '
local PAUSED_ERROR = 'RQ_PAUSED the queue is paused: publishes are refused until it is resumed'
