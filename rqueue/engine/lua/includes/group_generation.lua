--[[
  A group's generation (group hash field "gen"): a number that grows each
  time the group is made or reset, counted by the queue's meta field
  "gens". fetch.lua returns it with the group's ack floor. A floor that goes
  back within one generation is acks Redis lost (a failover to a replica
  that missed them: rqueue/statewatch.py); one that goes back with a new
  generation is a reset an operator asked for; a generation that goes back
  is Redis that lost a reset, or the group's making.

  A new group's hash gets it as its first field: fetch reads it at every
  call, and Redis searches a small hash (a listpack) from its start.
]]
--@include group_keys

-- Gives the group a new generation and returns it. A count that is not a
-- number (damaged), or not above the group's own (a meta hash made anew),
-- starts from the group's.
local function newGeneration()
  local old = tonumber(rcall('HGET', groupKey, 'gen') or '0') or 0
  local gen = (tonumber(rcall('HGET', metaKey, 'gens') or '0') or 0) + 1
  if gen % 1 ~= 0 or gen <= old then
    gen = math.floor(old) + 1
  end
  local genText = string.format('%d', gen)
  rcall('HSET', metaKey, 'gens', genText)
  rcall('HSET', groupKey, 'gen', genText)
  return gen
end
