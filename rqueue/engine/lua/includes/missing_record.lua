--[[
  Whether a seq the log holds no record of went as settled, for a group
  that has not read it yet: true, and the group passes it; false, and it
  was lost (fetch dead-letters it, missing-record; repair.lua's check, the
  doctor's finding). since is the group's field "since", meta field seq
  when the group was made or reset.
  A hash log deletes each record once every group that existed settled it,
  so a seq at or below since may be gone. A stream log drops entries only
  by the trim, below every group's ack floor, so an entry missing above a
  group's cursor is damage whenever the group was made, unless meta field
  "gaps" says entries went one by one (a log migrated from the hash layout,
  a dead-letter queue replayed or purged, a repaired meta hash): then as a
  hash log. fetch.lua and includes/ordering_keys.lua write the same test
  out where they meet a missing record.
]]
--@include group_keys
--@include log

local function recordSettledAway(seq, since)
  return seq <= since and (string.byte(msgsKey, -1) ~= LOG_STREAM_BYTE or redis.call('HEXISTS', metaKey, 'gaps') == 1)
end
