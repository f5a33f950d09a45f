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
  "gaps" says entries went one by one: then as a hash log, up to meta field
  "gaps_to" where it holds a seq (a log migrated from the hash layout: its
  last seq at the move; a repaired meta hash: the seq it was given), at any
  seq where it does not (a dead-letter queue replayed or purged, whose
  letters go at any time; a queue moved by an rqueue before "gaps_to").
  fetch.lua and includes/ordering_keys.lua write the same test out where
  they meet a missing record.
]]
--@include group_keys
--@include log

local function recordSettledAway(seq, since)
  return seq <= since and (string.byte(msgsKey, -1) ~= LOG_STREAM_BYTE
    or redis.call('HEXISTS', metaKey, 'gaps') == 1
    and seq <= (tonumber(redis.call('HGET', metaKey, 'gaps_to') or '') or math.huge))
end
