--[[
  The log one record at a time (includes/log.lua describes the log and holds
  the helpers of many records). Apart so that fetch makes these only on its
  rare paths (--@lazy): each local function is made again on every call.
]]

-- Stores one record.
local function logWriteOne(key, seq, rec)
  redis.call('HSET', key, seq, rec)
end

-- Stores a record unless its seq has one; true when it was stored.
local function logWriteNew(key, seq, rec)
  return redis.call('HSETNX', key, seq, rec) == 1
end

-- The record of seq, or false.
local function logRead(key, seq)
  return redis.call('HGET', key, seq)
end

local function logHas(key, seq)
  return redis.call('HEXISTS', key, seq) == 1
end

local function logDeleteOne(key, seq)
  redis.call('HDEL', key, seq)
end
