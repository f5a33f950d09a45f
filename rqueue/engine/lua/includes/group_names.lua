--[[
  The two names every group-scoped script reads, ARGV[1] group and ARGV[2]
  consumer (the whole ARGV block is in includes/group_args.lua). A script
  that needs neither the clock nor the settings (ack) includes this alone
  and is sent these two alone: the rest of the block costs a TIME call, a
  strtod per number and the arguments themselves.
]]
local rcall = redis.call
local groupName = ARGV[1]
local consumerName = ARGV[2]
