--[[
  The two names every group-scoped script reads, ARGV[1] group and ARGV[2]
  consumer (the whole ARGV block is in includes/group_args.lua). A script
  that needs neither the clock nor the settings (ack) includes this alone:
  the rest of the block costs a TIME call and a strtod per number.
]]
local rcall = redis.call
local groupName = ARGV[1]
local consumerName = ARGV[2]
