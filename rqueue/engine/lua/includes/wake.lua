--[[
  The wake-up of a queue's idle consumers through its wake stream
  ("<base>:wakes", one entry). An idle consumer sends XREAD BLOCK on that
  stream and its next fetch in one pipeline, so Redis runs the fetch as soon
  as an entry is added, without a round trip or a thread in between
  (docs/design.md, "Wake-ups"; the setting wait_in_redis). fetch.lua sets
  the meta field "wake" when such a consumer's call finds nothing; a
  publish adds an entry only while it is set, and clears it: a busy queue
  pays one more field of a read it makes anyway. Only a hint (pcall): a
  refusal fails nothing, and the waiters fetch when their wait runs out.
]]
local function wakeWaiters(metaKey, wakesKey, seqText)
  redis.pcall('XADD', wakesKey, 'MAXLEN', '1', '*', 'seq', seqText)
  redis.pcall('HDEL', metaKey, 'wake')
end
