--[[
  Records that consumerName is alive until now + its own liveness timeout,
  set when it joined (a worker's heartbeat timeout; a plain consumer's
  ack_wait). Members are judged by their own timeout, never by the timeout
  of the member that reaps them.
]]
--@include group_keys
--@include group_names
--@include group_args
-- With the group hash's "live:<consumer>" field already read (false when it
-- is not set), for a script that reads other fields with it.
local function beatWith(live)
  -- Formatted here: redis.call formats a number with a dearer sprintf.
  -- tonumber(): a live field that does not parse falls back to ack_wait.
  rcall('ZADD', beatsKey, string.format('%d', now + (tonumber(live) or ackWait)), consumerName)
end

local function beat()
  beatWith(rcall('HGET', groupKey, 'live:' .. consumerName))
end
