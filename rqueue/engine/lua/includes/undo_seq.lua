--[[
  The undo of a seq assignment, for a script that refuses its call after
  taking seqs (publish): sets meta field seq back to first, or deletes it
  when it was missing before the call. The script is atomic, so no call saw
  what the refused call wrote.
]]
local function undoSeq(metaKey, first, missing)
  if missing then
    redis.call('HDEL', metaKey, 'seq')
  else
    redis.call('HSET', metaKey, 'seq', string.format('%d', first))
  end
end
