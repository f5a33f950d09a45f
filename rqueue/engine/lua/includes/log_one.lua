--[[
  The log one record at a time (includes/log.lua describes the log, its
  two layouts and side, and holds the helpers of many records). Apart so
  that fetch makes these only on its rare paths (--@lazy): each local
  function is made again on every call.
]]
--@include log

-- Stores one record (of a seq above the stream's newest id, in a stream).
local function logWriteOne(key, seq, rec)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    redis.call('HSET', key, seq, rec)
  else
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
    return entry[2][2]
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
  return logRead(key, seq, side) ~= false
end

local function logDeleteOne(key, seq, side)
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    redis.call('HDEL', key, seq)
    return
  end
  redis.call('XDEL', key, seq .. '-0')
  if side then
    redis.call('HDEL', side, 'r' .. seq)
  end
end
