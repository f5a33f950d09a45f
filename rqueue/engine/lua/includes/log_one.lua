--[[
  The log one record at a time (includes/log.lua describes the log, its
  two layouts and side, and holds the helpers of many records). Apart so
  that fetch makes these only on its rare paths (--@lazy): each local
  function is made again on every call.
]]
--@include log
--@include record_head

-- A stream log's side hash: "<base>:side" beside "<base>:log", as
-- rqueue/engine/keys.py names it.
local function logSideKey(key)
  return string.sub(key, 1, -4) .. 'side'
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

-- The record of seq, or false.
local function logRead(key, seq, side)
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
    local rec = redis.call('HGET', logSideKey(key), seq)
    if rec then
      return rec
    end
  end
  return side and redis.call('HGET', side, 'r' .. seq) or false
end

-- The record of a seq reopened by replay: stored unless the seq has one;
-- true when it was stored. In a stream, in side whether or not the entry
-- is still there (a trim may drop it while the seq is reopened), unless
-- side has it.
local function logWriteNew(key, seq, rec, side)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    return redis.call('HSETNX', key, seq, rec) == 1
  end
  return redis.call('HSETNX', side, 'r' .. seq, rec) == 1
end

local function logHas(key, seq, side)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    return redis.call('HEXISTS', key, seq) == 1
  end
  local entry = redis.call('XRANGE', key, seq, seq)[1]
  return entry ~= nil and (entry[2][1] ~= 's' or redis.call('HEXISTS', logSideKey(key), seq) == 1)
    or side ~= nil and redis.call('HEXISTS', side, 'r' .. seq) == 1
end

local function logDeleteOne(key, seq, side)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    redis.call('HDEL', key, seq)
    return
  end
  -- By the entry's own id: a compact record's holds its time.
  local entry = redis.call('XRANGE', key, seq, seq)[1]
  if entry then
    redis.call('XDEL', key, entry[1])
    if entry[2][1] == 's' then
      redis.call('HDEL', logSideKey(key), seq)
    end
  end
  if side then
    redis.call('HDEL', side, 'r' .. seq)
  end
end
