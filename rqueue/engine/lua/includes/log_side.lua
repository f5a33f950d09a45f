--[[
  A stream log's side (includes/log.lua): the records of reopened seqs,
  kept in the queue's pinned hash. Apart so that the scripts that settle
  make this only where a reopened seq is settled (--@lazy).
]]

-- Forgets the record of a seq that no group has reopened any more (the
-- entry, if the trim has not passed it, stays until it does).
local function logForgetReplayed(seq, side)
  redis.call('HDEL', side, 'r' .. seq)
end
