--[[
  Whether a seq the log holds no record of went as settled, for a group's
  scan of messages it has not read (fetch.lua, includes/ordering_keys.lua):
  true, and the scan passes it; false, and it was lost (a dead letter,
  missing-record). since is the group's field "since", meta field seq when
  the group was made or reset.
  A hash log deletes each record once every group that existed settled it,
  so a seq at or below since may be gone. A stream log drops entries only
  by the trim, up to meta field "trimmed", unless field "gaps" says entries
  went one by one (a log migrated from the hash layout, or repaired): an
  entry missing above the trim is damage, whenever the group was made.
]]
--@include group_keys
--@include log

local function recordSettledAway(seq, since)
  if string.byte(msgsKey, -1) ~= LOG_STREAM_BYTE then
    return seq <= since
  end
  local fields = redis.call('HMGET', metaKey, 'trimmed', 'gaps')
  return seq <= (tonumber(fields[1] or '') or 0) or (fields[2] ~= false and seq <= since)
end
