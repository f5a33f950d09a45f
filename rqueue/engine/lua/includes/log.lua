--[[
  The log: a queue's message records by seq (includes/record.lua holds
  their format). Scripts read and write records only through these
  helpers and those of log_one.lua (one record at a time), so the log's
  storage is known in these two files alone: the hash msgs (seq -> record).
  key is the log's key, seqs are seqs as numbers or decimal strings.
]]
--@include bulk
--@include bulk_get

-- Stores records: pairs is seq, record, seq, record, ...
local function logWrite(key, pairs)
  bulk('HSET', key, pairs)
end

-- One record (or false) per seq, in the order of seqs.
local function logReadMany(key, seqs)
  return bulkGet(key, seqs)
end

-- True when the log holds any record.
local function logAny(key)
  return redis.call('EXISTS', key) == 1
end

local function logDelete(key, seqs)
  bulk('HDEL', key, seqs)
end
