--[[
  Appends messages to a queue as publish.lua does, for a writer that can be
  run again on the same rows (a retried Spark task, a replayed micro-batch):
  what one run of a writer stored is kept in one tracker hash per writer
  (per batch and partition), not in one key per message, and a run again
  skips it. Two modes:

  - position: the writer sees the same rows in the same order each time.
    The tracker holds one field, the rows stored so far; a message whose row
    number is below it is a duplicate.
  - content: the rows may come in another order. The tracker holds one
    field per stored message, its content key (a digest of the row, with
    the count of identical rows before it) -> its seq.

  Input:
    KEYS[1] meta     hash  seq (last assigned)
    KEYS[2] msgs     hash  seq -> record
    KEYS[3] floors   hash  group -> ack floor (read: is there any group?)
    KEYS[4] sched    zset  seq -> not-before (ms) of delayed publishes
    KEYS[5] wakes    stream  the queue's wake-up, as publish.lua's
    KEYS[6] tracker  hash  what this writer stored (above); expires after
        ARGV[2] ms, counted from its latest write
    ARGV[1] now in ms, or "" for the server's TIME
    ARGV[2] how long the tracker lives, ms (the de-duplication window)
    ARGV[3] mandatory: "1" refuses the batch when the queue has no group
    ARGV[4] channel to announce new messages on, or ""
    ARGV[5] mode: "position" or "content"
    ARGV[6] position: the row number of the first message (0 = the
        writer's first row); content: ignored
    ARGV[7], ARGV[8], ARGV[9] ... per message: its content key (content
        mode; "" in position mode); timing and body as in publish.lua
  Output:
    { seq1, duplicate1, seq2, duplicate2, ... }; for a duplicate, seq is
    the seq it was stored under (content), or 0 (position: the tracker
    keeps no seqs)
  Errors (nothing is stored):
    RQ_PARTITIONED <layout>  the queue was made a partitioned queue (meta
                     field "partitioned", as publish.lua)
    RQ_LAYOUT        KEYS[2] is the log key of the other layout (as
                     publish.lua)
    RQ_PAUSED        the queue is paused with mode "refuse" (as publish.lua;
                     with "hold:<seq>" the messages are stored and held)
    RQ_UNROUTABLE    mandatory publish to a queue without a group
    RQ_BAD_ARGUMENT  an unknown mode, a row number that is not a whole
                     number >= 0, arguments not in threes, or a content key
                     that is empty
    RQ_CORRUPT       the meta hash is missing (no field seq) while the
                     queue has records or a group that settled some: seqs
                     would be reused (as publish.lua)
]]
--@include log
--@include layout
--@include read_now
--@include seq_guard
--@include bulk
--@include record_head
--@include wake
--@include publish_refusals

local rcall = redis.call
local TEST_CLOCK_TTL_SLACK = 86400000 -- ms: as publish.lua, a test clock says nothing of real time
local metaKey = KEYS[1]
local msgsKey = KEYS[2]
local floorsKey = KEYS[3]
local schedKey = KEYS[4]
local wakesKey = KEYS[5]
local trackerKey = KEYS[6]
local FIRST = 7 -- ARGV index of the first message

-- The refusals publish.lua makes before it stores anything: a queue made
-- a partitioned queue (its messages go to its partitions), the other
-- layout's log key, a pause that refuses publishes.
local layout = rcall('HMGET', metaKey, 'layout', 'seq', 'paused', 'partitioned')
if layout[4] then
  return redis.error_reply(PARTITIONED .. layout[4])
end
local wrongLayout = layoutError(metaKey, msgsKey, layout[1], layout[2])
if wrongLayout then
  return wrongLayout
end
if layout[3] == 'refuse' then
  return redis.error_reply(PAUSED_ERROR)
end

local now = readNow(ARGV[1])
local mode = ARGV[5]
local content = mode == 'content'
if not content and mode ~= 'position' then
  return redis.error_reply('RQ_BAD_ARGUMENT publish_tracked mode must be position or content, not ' .. mode)
end
local offset = tonumber(ARGV[6])
if not content and (offset == nil or offset < 0 or offset ~= math.floor(offset)) then
  return redis.error_reply('RQ_BAD_ARGUMENT publish_tracked takes a row number >= 0, not ' .. ARGV[6])
end
if (#ARGV - FIRST + 1) % 3 ~= 0 then
  return redis.error_reply('RQ_BAD_ARGUMENT publish_tracked takes three arguments per message')
end
if ARGV[3] == '1' and rcall('HLEN', floorsKey) == 0 then
  return redis.error_reply('RQ_UNROUTABLE the queue has no group to deliver to')
end

local count = (#ARGV - FIRST + 1) / 3
-- seen[k]: the seq message k was stored under before (0 when unknown), or
-- nil; sameAs[k]: the earlier message of this call with the same key.
local seen, sameAs = {}, {}
local dupes = 0
if content then
  local names = {}
  for i = FIRST, #ARGV, 3 do
    if ARGV[i] == '' then
      return redis.error_reply('RQ_BAD_ARGUMENT publish_tracked in content mode needs a content key per message')
    end
    names[#names + 1] = ARGV[i]
  end
  if count > 0 then
    local found = rcall('HMGET', trackerKey, unpack(names))
    -- A key repeated inside the call is a duplicate of its first message.
    local mine = {}
    for k = 1, count do
      if found[k] then
        seen[k] = found[k] + 0
        dupes = dupes + 1
      elseif mine[names[k]] then
        sameAs[k] = mine[names[k]]
        dupes = dupes + 1
      else
        mine[names[k]] = k
      end
    end
  end
else
  local done = tonumber(rcall('HGET', trackerKey, 'rows') or '0')
  for k = 1, math.min(count, done - offset) do
    seen[k] = 0
    dupes = dupes + 1
  end
end

local stored = count - dupes
local first = 0
if stored > 0 then
  first = rcall('HINCRBY', metaKey, 'seq', stored) - stored
  if first == 0 then
    -- The queue's first publish, or a deleted meta hash.
    local refused = reusedSeqsError(metaKey, msgsKey, floorsKey)
    if refused then
      rcall('HDEL', metaKey, 'seq') -- the HINCRBY above, undone
      return refused
    end
  end
end
local seq = first
local records, delayed, marks = {}, nil, {}
local seqOf = {}
local compact = compactHead(now)
local prefix = nil
local out = {}
for k = 1, count do
  local i = FIRST + (k - 1) * 3
  local old = seen[k]
  if sameAs[k] then
    old = seqOf[sameAs[k]]
  end
  if old ~= nil then
    out[#out + 1] = old
    out[#out + 1] = 1
  else
    local timing, body = ARGV[i + 1], ARGV[i + 2]
    local delay, hlen = 0, '0'
    if timing ~= '0' then
      delay = tonumber(timing)
      if delay == nil then
        local d, h = string.match(timing, '^(%d+):(%d+)$')
        delay, hlen = tonumber(d), h
      end
    end
    seq = seq + 1
    seqOf[k] = seq
    records[#records + 1] = seq
    if delay == 0 and hlen == '0' and compact then
      records[#records + 1] = compact .. body
    else
      prefix = prefix or (':' .. string.format('%.0f', now) .. ':')
      local notBefore = ''
      if delay > 0 then
        notBefore = now + delay
        delayed = delayed or {}
        delayed[#delayed + 1] = notBefore
        delayed[#delayed + 1] = seq
        notBefore = string.format('%.0f', notBefore)
      end
      records[#records + 1] = notBefore .. prefix .. hlen .. ':' .. body
    end
    if content then
      marks[#marks + 1] = ARGV[i]
      marks[#marks + 1] = seq
    end
    out[#out + 1] = seq
    out[#out + 1] = 0
  end
end

local window = tonumber(ARGV[2]) or 0
local ttl = math.max(1, window)
if ARGV[1] ~= '' then
  ttl = window + TEST_CLOCK_TTL_SLACK
end
local last = nil
if stored > 0 then
  last = string.format('%d', seq)
  local refused = logWrite(msgsKey, records)
  if refused then
    -- The HINCRBY above, undone: nothing else was written.
    if first == 0 then
      rcall('HDEL', metaKey, 'seq')
    else
      rcall('HSET', metaKey, 'seq', string.format('%d', first))
    end
    return refused
  end
  markLayout(metaKey, msgsKey, layout[1])
  if delayed then
    bulk('ZADD', schedKey, delayed)
  end
  if content then
    bulk('HSET', trackerKey, marks)
  end
end
if not content and offset + count > tonumber(rcall('HGET', trackerKey, 'rows') or '0') then
  rcall('HSET', trackerKey, 'rows', string.format('%d', offset + count))
end
if stored > 0 or not content then
  rcall('PEXPIRE', trackerKey, ttl)
end
if delayed then
  rcall('ZREMRANGEBYSCORE', schedKey, '-inf', now)
end
if last ~= nil and ARGV[4] ~= '' then
  redis.pcall('PUBLISH', ARGV[4], last)
  if rcall('HEXISTS', metaKey, 'wake') == 1 then
    wakeWaiters(metaKey, wakesKey, last)
  end
end
return out
