--[[
  Appends an entry to the group's events stream (KEYS[17], capped near
  EVENTS_MAX entries): dead letters, drops, replays, purges and records
  found missing.
]]
--@include group_keys
--@include group_names
--@include group_args
local EVENTS_MAX = 10000 -- entries kept in the events stream (approximately)

local function recordEvent(kind, seq, reason, extra)
  rcall('XADD', eventsKey, 'MAXLEN', '~', EVENTS_MAX, '*', 'event', kind, 'group', groupName,
    'seq', seq, 'reason', reason or '', 'at', now, 'dlq_seq', extra or '')
end
