--[[
  The log one record at a time (includes/log.lua describes the log, its
  two layouts and side, and holds the helpers of many records). Apart so
  that fetch makes these only on its rare paths (--@lazy): each local
  function is made again on every call.
]]
--@include log
--@include record_head

-- The error a helper raises when it meets the stub of seq in the stream
-- log key and the call was not sent the side hash: every script that can
-- meet a stub checks for it before any write (includes/layout.lua,
-- sideKeyError), so this stops a call that skipped the check; log.lua's
-- logReadMany raises the same for fetch's plain call (sent KEYS[1..17]) in
-- a queue whose meta lost field "prio".
local function logNoSideKey(key, seq)
  error('RQ_LAYOUT ' .. key .. ' holds the stub of seq ' .. seq .. ' (a message with a priority or a key), '
    .. 'and the call was not sent the side hash that holds its record (or meta field "prio" is missing: '
    .. 'see `rqueue doctor`)')
end

-- Stores one record (of a seq above the stream's newest id, in a stream).
local function logWriteOne(key, seq, rec)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    redis.call('HSET', key, seq, rec)
  else
    -- As an "r" entry whatever the form: a dead letter, the one record
    -- written alone, always has headers.
    redis.call('XADD', key, seq .. '-0', 'r', rec)
  end
end

-- The record of seq, or false; and true second when seq's entry is a stub
-- whose record is unread, as the call was not sent the side hash (sideKey
-- nil): what replay meets in a dead-letter queue that is published to
-- (no dead letter is a stub). A seq without an entry is looked for in the
-- side hash too: a stub deleted (damage) leaves its record there, and the
-- message is read, not lost (the doctor reports it, stub-missing).
local function logRead(key, sideKey, seq, pinned)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    return redis.call('HGET', key, seq)
  end
  local entry = redis.call('XRANGE', key, seq, seq)[1]
  if entry then
    if entry[2][1] == 'p' then
      -- The compact record again: its head from the id's time.
      return (compactHead(tonumber(string.match(entry[1], '%-(%d+)$')) or -1) or UNREADABLE_HEAD) .. entry[2][2]
    end
    if entry[2][1] ~= 's' then
      return entry[2][2]
    end
    -- A stub: the record is in the side hash (or beside the pins, replayed).
    if not sideKey then
      return false, true
    end
  end
  if sideKey then
    local rec = redis.call('HGET', sideKey, seq)
    if rec then
      return rec
    end
  end
  return pinned and redis.call('HGET', pinned, 'r' .. seq) or false
end

-- The record of a seq reopened by replay: rec (made again from the dead
-- letter) unless the seq has one; true when rec was stored. A hash log
-- keeps the record it holds, byte for byte. In a stream, the record is
-- kept in pinned whether or not the entry is still there (a trim may drop
-- it while the seq is reopened), unless pinned has it: there the record
-- that a read of seq finds (its entry's, or a stub's in sideKey) is the one
-- copied, rec only when there is none. Reads look in the stream first, so
-- the copy is what the group reads once the trim took the entry: rec would
-- differ from the entry (its headers encoded again from a Lua table, whose
-- order is the server's, and no not-before time), and the group would be
-- handed one record before the trim and another after it, where the hash
-- layout hands out the one published.
local function logWriteNew(key, seq, rec, pinned, sideKey)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    return redis.call('HSETNX', key, seq, rec) == 1
  end
  if redis.call('HEXISTS', pinned, 'r' .. seq) == 1 then
    return false
  end
  local stored = logRead(key, sideKey, seq)
  redis.call('HSET', pinned, 'r' .. seq, stored or rec)
  return not stored
end

-- Whether seq has its record: a stub's, or that of a seq without an entry
-- (a stub deleted), in the side hash sideKey, as logRead reads it.
local function logHas(key, sideKey, seq, pinned)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    return redis.call('HEXISTS', key, seq) == 1
  end
  local entry = redis.call('XRANGE', key, seq, seq)[1]
  if entry ~= nil and entry[2][1] ~= 's' then
    return true
  end
  if not sideKey then
    if entry ~= nil then
      logNoSideKey(key, seq)
    end
  elseif redis.call('HEXISTS', sideKey, seq) == 1 then
    return true
  end
  return pinned ~= nil and redis.call('HEXISTS', pinned, 'r' .. seq) == 1
end

-- Whether seq is taken in the log: it has a record, or in a stream an entry
-- of any kind (a stub whose record is lost included), which a write of seq
-- would meet. The dead-letter queue's seq checks ask this, as they are not
-- sent its side hash.
local function logTaken(key, seq)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    return redis.call('HEXISTS', key, seq) == 1
  end
  return redis.call('XRANGE', key, seq, seq)[1] ~= nil
end

local function logDeleteOne(key, sideKey, seq, pinned)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    redis.call('HDEL', key, seq)
    return
  end
  -- By the entry's own id: a compact record's holds its time.
  local entry = redis.call('XRANGE', key, seq, seq)[1]
  if entry then
    if entry[2][1] == 's' and not sideKey then
      logNoSideKey(key, seq)
    end
    redis.call('XDEL', key, entry[1])
    if entry[2][1] == 's' then
      redis.call('HDEL', sideKey, seq)
    end
  end
  if pinned then
    redis.call('HDEL', pinned, 'r' .. seq)
  end
end
