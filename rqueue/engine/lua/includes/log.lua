--[[
  The log: a queue's message records by seq (includes/record.lua holds
  their format). Scripts read and write records only through these
  helpers and those of log_one.lua (one record at a time), so the log's
  storage is known in these two files alone. It has one of two layouts
  (rqueue/engine/keys.py, LogLayout), told by the last letter of its key:
    hash    <base>:msgs   seq -> record
    stream  <base>:log    one entry per record. A compact record (no
                          headers, no delay: most of them) is id
                          "<seq>-<published_ms>", field "p" its payload,
                          without the record's head (the id holds the
                          time); any other, id "<seq>-0", field "r" the
                          record. A message published with a priority
                          or an ordering key has the stub "<seq>-0",
                          field "s" (empty), and its record in the side
                          hash <base>:side (seq -> record), where fetch's
                          priority and key reads take many by one HMGET
                          (logReadFlow); fetch deletes them with their
                          priority log entries once the trim point passes
                          them. Every script that can meet a stub is
                          sent the side hash last of its KEYS (stream
                          layout only; group_keys.lua's sideKey), and
                          the helpers take it as sideKey: a helper that
                          meets a stub without it raises RQ_LAYOUT. A
                          stub without its side record is a missing
                          record. Entries are not deleted one by one:
                          logTrim drops those at or below the lowest ack
                          floor (includes/settle.lua), so a record settled
                          above it stays until the floor passes it. A
                          stream takes no id at or below its newest, so a
                          record replayed (replay.lua) is kept in pinned,
                          the queue's pinned hash, as field "r<seq>", while a
                          group has it reopened.
  The reads give a "p" entry's record made again, its head from the id's
  time (one head per distinct time in a call): measured by
  benchmarks/prototypes/stream_log/xrange_vs_hmget.py, the entry itself in
  fetch's reply (nested arrays) costs Redis more than the record rebuilt.
  key is the log's key, sideKey its side hash (nil for a hash log), seqs
  are seqs as numbers or decimal strings, pinned is the pinned hash (nil
  where no replayed record can be: then a stream's read misses such a
  record and a delete leaves it).
  The layout of a queue is its meta field "layout" (includes/layout.lua
  refuses a call sent the other layout's key).
]]
--@include bulk
--@include bulk_get
--@include record_head

local LOG_STREAM_BYTE = 103 -- string.byte('g'): a stream log's key ends in ":log"
local UNREADABLE_HEAD = '\0' -- heads a record that parses as none (includes/record.lua)

-- The side hash of the stream log logKey when the call was sent it, last of
-- its KEYS; else nil (a hash log, or a call sent none). The name is compared
-- because the last key of a call sent none is another key (the ack's 13,
-- fetch's plain 17, status's pinned hash): the hash read is the key sent.
local function sentSideKey(logKey)
  --@layout stream
  local last = KEYS[#KEYS]
  if string.byte(logKey, -1) == LOG_STREAM_BYTE and last == string.sub(logKey, 1, -4) .. 'side' then
    return last
  end
  --@end
  return nil
end

-- The id, field and value of the stream entry of seq's record rec.
local function logEntry(seq, rec)
  if string.byte(rec, 1) == COMPACT_BYTE and #rec >= COMPACT_HEAD then
    local ms = 0
    for i = 2, COMPACT_HEAD do
      ms = ms * 256 + string.byte(rec, i)
    end
    return seq .. '-' .. string.format('%.0f', ms), 'p', string.sub(rec, COMPACT_HEAD + 1)
  end
  return seq .. '-0', 'r', rec
end

-- Whether key is a stream log's. settle.lua and settle_shared.lua compare
-- the byte themselves: fetch, which settles, would make this at every call.
local function logIsStream(key)
  return string.byte(key, -1) == LOG_STREAM_BYTE
end

-- A stream log only: drops the entries of every seq up to upTo (a number).
-- Exact, and cheap for a long stretch: a stream frees whole nodes.
local function logTrim(key, upTo)
  redis.call('XTRIM', key, 'MINID', string.format('%d', upTo + 1))
end

-- A stream log only: the seq of its oldest entry, or nil when it has none.
local function logOldest(key)
  local oldest = redis.call('XRANGE', key, '-', '+', 'COUNT', '1')[1]
  return oldest and tonumber(string.match(oldest[1], '^%d+'))
end

-- Stores records: pairs is seq, record, seq, record, ... with seqs rising.
-- Replies nil, or the error reply of a stream's refusal of the first entry
-- (over maxmemory, as it came; an id at or below the newest, RQ_CORRUPT):
-- nothing is written then, and the caller undoes what it wrote before.
local function logWrite(key, pairs)
  --@layout stream
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    --@end
    bulk('HSET', key, pairs)
    return nil
    --@layout stream
  end
  local added = redis.pcall('XADD', key, logEntry(pairs[1], pairs[2]))
  if type(added) == 'table' and added.err then
    -- tostring: under memory:// the text is a Python object
    if string.find(tostring(added.err), 'equal or smaller', 1, true) then
      return redis.error_reply('RQ_CORRUPT ' .. key .. ' has held an entry at or above seq ' .. pairs[1]
        .. ', the next seq of its meta hash: a publish would reuse seqs (see `rqueue doctor`)')
    end
    return added
  end
  for i = 3, #pairs, 2 do
    redis.call('XADD', key, logEntry(pairs[i], pairs[i + 1]))
  end
  return nil
  --@end
end

-- Stores a stream log's entries: items is id, field, value, id, ... as
-- logEntry makes them, with ids rising. What publish writes, so that it
-- makes no compact record first. Replies as logWrite.
local function logWriteEntries(key, items)
  local added = redis.pcall('XADD', key, items[1], items[2], items[3])
  if type(added) == 'table' and added.err then
    if string.find(tostring(added.err), 'equal or smaller', 1, true) then
      return redis.error_reply('RQ_CORRUPT ' .. key .. ' has held an entry at or above seq '
        .. string.match(items[1], '^%d+') .. ', the next seq of its meta hash: a publish would reuse seqs '
        .. '(see `rqueue doctor`)')
    end
    return added
  end
  for i = 4, #items, 3 do
    redis.call('XADD', key, items[i], items[i + 1], items[i + 2])
  end
  return nil
end

-- Stores the payloads ARGV[from], ARGV[from + 1], ... as the compact
-- entries of the seqs after seq, published at stamp (the ids' "-<ms>"):
-- publish's bare call. An id is the seq's text, or with digits
-- (includes/two_digits.lua) a seq of 100 or more its hundreds, made once a
-- hundred, and two digits. The first entry goes in pcall, and a refusal is
-- replied as logWriteEntries does, with nothing written; the rest in one
-- loop with no function call of its own, as the call of a Lua function costs
-- Redis about 300 instructions a message. Replies nil and the last seq, or
-- the refusal.
local function logAppendBodies(key, seq, from, stamp, digits)
  local refused = logWriteEntries(key, {string.format('%d', seq + 1) .. stamp, 'p', ARGV[from]})
  if refused then
    return refused, seq
  end
  seq = seq + 1
  local rcall, argv, hundreds = redis.call, ARGV, nil
  for i = from + 1, #argv do
    seq = seq + 1
    local id
    if digits == nil or seq < 100 then
      id = string.format('%d', seq) .. stamp
    else
      local low = seq % 100
      if hundreds == nil or low == 0 then
        hundreds = string.format('%d', (seq - low) / 100)
      end
      id = hundreds .. digits[low + 1] .. stamp
    end
    rcall('XADD', key, id, 'p', argv[i])
  end
  return nil, seq
end

-- One record (or false) per seq, in the order of seqs. In a stream, one
-- XRANGE per run of consecutive seqs (in the order given); a stub's record
-- is read from the side hash sideKey, unless skip (a set of seqs as given,
-- or nil) holds its seq: it is then false, unread; a seq without an entry
-- is read from sideKey too (a stub deleted leaves its record there: read,
-- not lost), and one still without a record from pinned. One function, not
-- two: fetch makes it per call.
local function logReadMany(key, sideKey, seqs, pinned, skip)
  --@layout stream
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    --@end
    return bulkGet(key, seqs)
    --@layout stream
  end
  local out, gaps, heads, stubs = {}, false, {}, nil
  local i, count = 1, #seqs
  while i <= count do
    local from = tonumber(seqs[i])
    local j = i
    while j < count and tonumber(seqs[j + 1]) == from + (j - i) + 1 do
      j = j + 1
    end
    local entries = redis.call('XRANGE', key, from, from + (j - i))
    -- Every seq of the run has its entry, in order (the common case), or
    -- the seqs come from the ids.
    local whole = #entries == j - i + 1
    if not whole then
      gaps = true
      for k = i, j do
        out[k] = false
      end
      if sideKey and #entries < j - i + 1 then
        -- Seqs without an entry: looked for among the stubs' records.
        local seen = {}
        for _, entry in ipairs(entries) do
          seen[i + tonumber(string.match(entry[1], '^%d+')) - from] = true
        end
        for k = i, j do
          if not seen[k] and not (skip and skip[seqs[k]]) then
            stubs = stubs or {}
            stubs[#stubs + 1] = k
          end
        end
      end
    end
    for k, entry in ipairs(entries) do
      local id, fields = entry[1], entry[2]
      local at = whole and i + k - 1 or i + tonumber(string.match(id, '^%d+')) - from
      if fields[1] == 'p' then
        local ms = string.sub(id, string.find(id, '-', 1, true) + 1)
        local head = heads[ms]
        if not head then
          -- A time past 6 bytes is no entry rqueue wrote: the record made of
          -- it parses as none, and is dead-lettered as corrupted-record.
          head = compactHead(tonumber(ms) or -1) or UNREADABLE_HEAD
          heads[ms] = head
        end
        out[at] = head .. fields[2]
      elseif fields[1] == 's' then
        out[at] = false
        if not (skip and skip[seqs[at]]) then
          stubs = stubs or {}
          stubs[#stubs + 1] = at
        end
      else
        out[at] = fields[2]
      end
    end
    i = j + 1
  end
  if stubs then
    local fields = {}
    for n, at in ipairs(stubs) do
      fields[n] = seqs[at]
    end
    if not sideKey then
      -- As log_one.lua's logNoSideKey, here without the function, which
      -- fetch would make at every call.
      error('RQ_LAYOUT ' .. key .. ' holds the stub of seq ' .. fields[1] .. ' (a message with a priority or a '
        .. 'key), and the call was not sent the side hash that holds its record (or meta field "prio" is '
        .. 'missing: see `rqueue doctor`)')
    end
    for n, rec in ipairs(bulkGet(sideKey, fields)) do
      out[stubs[n]] = rec
      gaps = gaps or not rec
    end
  end
  if gaps and pinned and redis.call('EXISTS', pinned) == 1 then
    local fields, at = {}, {}
    for k = 1, count do
      if not out[k] then
        fields[#fields + 1] = 'r' .. seqs[k]
        at[#at + 1] = k
      end
    end
    for n, rec in ipairs(bulkGet(pinned, fields)) do
      out[at[n]] = rec
    end
  end
  return out
  --@end
end

-- The records of seqs published with a priority or a key (fetch's picks),
-- as logReadMany gives them: from a stream log's side hash sideKey by one
-- HMGET, and a seq it lacks by logReadMany (a replayed record).
local function logReadFlow(key, sideKey, seqs, pinned)
  local out = bulkGet(sideKey, seqs)
  local missed, at = nil, nil
  for i = 1, #seqs do
    if not out[i] then
      missed, at = missed or {}, at or {}
      missed[#missed + 1] = seqs[i]
      at[#at + 1] = i
    end
  end
  if missed then
    for n, rec in ipairs(logReadMany(key, sideKey, missed, pinned)) do
      out[at[n]] = rec
    end
  end
  return out
end

-- True when the log holds any record.
local function logAny(key)
  --@layout stream
  if string.byte(key, -1) ~= LOG_STREAM_BYTE then
    --@end
    return redis.call('EXISTS', key) == 1
    --@layout stream
  end
  return redis.call('XLEN', key) > 0 -- a stream stays when its last entry goes
  --@end
end

-- A hash log only: a stream log's entries go by logTrim, and a replayed
-- record by logForgetReplayed (log_side.lua); HDEL on a stream is refused.
local function logDelete(key, seqs)
  bulk('HDEL', key, seqs)
end
