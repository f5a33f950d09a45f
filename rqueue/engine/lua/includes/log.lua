--[[
  The log: a queue's message records by seq (includes/record.lua holds
  their format). Scripts read and write records only through these
  helpers, so the log's storage is known here alone: the hash msgs
  (seq -> record). key is the log's key, seqs are seqs as numbers or
  decimal strings.
]]
--@include bulk
--@include bulk_get

-- Stores records: pairs is seq, record, seq, record, ...
local function logWrite(key, pairs)
  bulk('HSET', key, pairs)
end

-- Stores a record unless its seq has one; true when it was stored.
local function logWriteNew(key, seq, rec)
  return redis.call('HSETNX', key, seq, rec) == 1
end

-- The record of seq, or false.
local function logRead(key, seq)
  return redis.call('HGET', key, seq)
end

-- One record (or false) per seq, in the order of seqs.
local function logReadMany(key, seqs)
  return bulkGet(key, seqs)
end

local function logHas(key, seq)
  return redis.call('HEXISTS', key, seq) == 1
end

-- True when the log holds any record.
local function logAny(key)
  return redis.call('EXISTS', key) == 1
end

local function logDelete(key, seqs)
  bulk('HDEL', key, seqs)
end

local function logDeleteOne(key, seq)
  redis.call('HDEL', key, seq)
end
