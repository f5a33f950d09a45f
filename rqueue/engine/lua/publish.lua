--[[
  Appends messages to a queue, each getting the next seq, skipping any whose
  id was seen inside the de-duplication window. Each id is a key of its own
  that Redis expires at the end of the window, so ids cost no cleanup work.

  Input:
    KEYS[1] meta     hash  seq (last assigned)
    KEYS[2] msgs     hash  seq -> record
    KEYS[3] floors   hash  group -> ack floor (read: is there any group?)
    KEYS[4] sched    zset  seq -> not-before (ms) of delayed publishes
    KEYS[5] wakes    stream  the queue's wake-up (includes/wake.lua): an
        entry is added when a fetch found nothing since the last one
    KEYS[6..] id keys (string "<seq>:<expires_ms>:<incarnation>"; PX = the
        window), one per message that has an id, in message order. The
        expiry is in the scripts' clock, so a test clock decides what is a
        duplicate; Redis's own TTL removes the key. An id stored by another
        incarnation of the queue (it was deleted, or Redis lost it) is no
        duplicate; one without an incarnation (an older rqueue) counts.
    ARGV[1] now in ms, or "" for the server's TIME
    ARGV[2] de-duplication window, ms
    ARGV[3] mandatory: "1" refuses the batch when the queue has no group
    ARGV[4] channel to announce new messages on, or "" (none, and no
        entry in KEYS[5] either)
    ARGV[5] an incarnation id for the queue, drawn at random by the client:
        stored in meta field "inc" when the queue has none (its meta is
        new), if it is a lowercase letter, then lowercase letters and
        digits, 32 at most (else none is stored, and the reply's is "")
    ARGV[6], ARGV[7], ARGV[8] ... per message: index of its id key in KEYS
        (0 = no id); "<delay_ms>" (0 = none), or "<delay_ms>:<headers_len>"
        when the body starts with headers, or "<delay_ms>:<headers_len>:<p>"
        for a priority p of 1 to 9 (0, the default, is none of these), or
        "<delay_ms>:<headers_len>::<key>" for an ordering key (1 to 128 of
        A-Z a-z 0-9 _ . : @ / + = -; never with a priority); body
        "<headers_json><payload>".
        Stored as a record (includes/record.lua): compact when the message
        has no headers and no delay (and now < 2^48 ms), so most bodies are
        copied once
    ARGV[6] = "" instead: a bare call, ARGV[7], ARGV[8] ... one body per
        message, each a payload alone (no id, delay, headers, priority or
        key: most batches), which Redis and the script take as one argument
        a message rather than three
    KEYS[#KEYS] the priority log (zset "<base>:prio", seq -> "<seq>:<p>",
        or "<seq>:k:<key>" for an ordering key), last, after the id keys,
        when a message has a priority or a key; meta field "prio" is set
        with it (fetch.lua reads it). For a stream log KEYS[#KEYS - 1],
        and KEYS[#KEYS] the side hash (hash "<base>:side", seq -> record):
        such a message's record goes there, and the stub entry
        "<seq>-0" "s" "" into the stream (includes/log.lua)
  Output:
    { incarnation, seq1, duplicate1, seq2, duplicate2, ... }, duplicate 1
    when the id was seen: seq is then the seq of the first publish. A bare
    call replies { incarnation, "range", first, last }: its messages took
    the seqs first to last, in order (none when last < first). The
    incarnation is the queue's (meta field "inc"): a client that sees it
    change, or a new seq at or below one it saw, knows Redis lost state
  Errors (nothing is stored):
    RQ_BAD_ARGUMENT  an id key's index is not above 5 (the fixed keys)
    RQ_PARTITIONED <layout>  the queue was made a partitioned queue (meta
                   field "partitioned", set by partition.lua): its
                   messages go to its partitions
    RQ_BAD_ARGUMENT  a message has a priority or key and the last key is
                   not the queue's priority log (for a stream log: the last
                   two are not its priority log and side hash); a key is not of the form
                   above (named), or a message has both a key and a priority
    RQ_UNROUTABLE  mandatory publish to a queue without a group
    RQ_LAYOUT      KEYS[2] is the log key of the other layout than the
                   queue's (includes/layout.lua): nothing is stored; a
                   queue's first publish sent a stream key makes it a
                   stream queue
    RQ_PAUSED      the queue is paused with mode "refuse" (meta field
                   "paused", pause.lua); with "hold:<seq>" the messages are
                   stored and fetch holds them
    RQ_CORRUPT     the last seq (meta field seq) is garbage, or missing
                   while the queue has records or a group that settled some
                   (a deleted meta hash): seqs would be reused; or a stream
                   log holds an entry at or above the next seq: nothing is
                   stored
]]
--@include log
--@include layout
--@include read_now
--@include bulk
--@include record_head
--@include publish_refusals
-- Helpers of the rarer paths, made where a call takes one (loader.py,
-- make_lazy): a publish of one message pays for no closure it does not call.
--@lazy seqRefusals seq_guard
--@lazy seqUndo undo_seq
--@lazy wakeUp wake
--@lazy digitTable two_digits

local rcall = redis.call
local TEST_CLOCK_TTL_SLACK = 86400000 -- ms, see the ttl below
local SCHED_CLEAN_EVERY = 64 -- seqs between clean-ups of due entries of the schedule
local metaKey = KEYS[1]
local msgsKey = KEYS[2]
local floorsKey = KEYS[3]
local schedKey = KEYS[4]
local wakesKey = KEYS[5]

local now = readNow(ARGV[1])
local channel = ARGV[4]

-- The meta field "partitioned" (partition.lua) is read with the fields
-- every publish reads anyway, below; a mandatory publish that finds no
-- group reads it here, so that it goes to the partitions
-- (includes/publish_refusals.lua).
if ARGV[3] == '1' and rcall('HLEN', floorsKey) == 0 then
  local layout = rcall('HGET', metaKey, 'partitioned')
  if layout then
    return redis.error_reply(PARTITIONED .. layout)
  end
  return redis.error_reply('RQ_UNROUTABLE the queue has no group to deliver to')
end

local window, ttl = nil, nil -- read only by a batch with ids (tonumber is a strtod)

-- Seqs are assigned here and written with one variadic command per key,
-- not two commands per message. claims holds what the id keys say once the
-- earlier messages of this batch are stored, so that an id repeated inside
-- the batch is judged exactly as if each message had been published alone.
local out = {''} -- the incarnation, read below
-- Without ids every message is stored: the seqs are taken in one HINCRBY
-- (one call less than reading and writing the last seq).
local anyId, anyPriority, anyTimed = false, false, false
-- A bare call's messages are plain bodies: nothing to scan.
local bare = ARGV[6] == ''
for i = 6, bare and 0 or #ARGV, 3 do
  if ARGV[i] ~= '0' then
    anyId = true
    if (tonumber(ARGV[i]) or 0) <= 5 then
      return redis.error_reply('RQ_BAD_ARGUMENT an id key index must be above 5 (KEYS[1..5] are the queue\'s), not '
        .. string.format('%q', ARGV[i]))
    end
  end
  if ARGV[i + 1] ~= '0' then
    anyTimed = true -- a delay, headers, a priority or a key
    if string.find(ARGV[i + 1], ':%d*:') then
      anyPriority = true
      -- An ordering key, checked here, before any write.
      local p, key = string.match(ARGV[i + 1], '^%d+:%d+:([1-9]?):(.*)$')
      if key and (#key > 128 or not string.find(key, '^[%w_%.:@/%+=%-]+$')) then
        return redis.error_reply('RQ_BAD_ARGUMENT the ordering key ' .. string.format('%q', string.sub(key, 1, 200))
          .. ' must be 1 to 128 of A-Z a-z 0-9 _ . : @ / + = -')
      elseif key and p ~= '' then
        return redis.error_reply('RQ_BAD_ARGUMENT a message has both a priority (' .. p .. ') and the ordering key '
          .. key .. ': keys are handed out in seq order, not by priority')
      end
    end
  end
end
-- The priority log is the last key (the side hash after it, for a stream
-- log), named as keys.py names them: checked before any write, so that a
-- call built wrongly stores nothing.
local prioKey, sideKey = KEYS[#KEYS], nil
--@layout stream
if anyPriority and logIsStream(msgsKey) then
  prioKey, sideKey = KEYS[#KEYS - 1], KEYS[#KEYS]
  if sideKey ~= string.sub(metaKey, 1, -5) .. 'side' then
    return redis.error_reply('RQ_BAD_ARGUMENT a message has a priority, and the last key is not the side hash '
      .. 'of the stream log: ' .. tostring(sideKey))
  end
end
--@end
if anyPriority and prioKey ~= string.sub(metaKey, 1, -5) .. 'prio' then
  return redis.error_reply('RQ_BAD_ARGUMENT a message has a priority, and the last key is not the priority log: '
    .. tostring(prioKey))
end
local first, inc
local paused -- meta field "paused" (pause.lua): "refuse" refuses the call
local seqMissing -- the last seq was missing: a queue's first publish, or a deleted meta hash
local waiting -- meta field "wake": a fetch found nothing since the last wake-up
local layout -- meta field "layout" (includes/layout.lua)
if anyId then
  local fields = rcall('HMGET', metaKey, 'seq', 'inc', 'paused', 'partitioned', 'wake', 'layout')
  local raw = fields[1]
  first, inc, paused, waiting, layout = tonumber(raw or '0'), fields[2], fields[3], fields[5], fields[6]
  if fields[4] then
    return redis.error_reply(PARTITIONED .. fields[4])
  end
  local wrongLayout = layoutError(metaKey, msgsKey, layout, raw)
  if wrongLayout then
    return wrongLayout
  end
  if paused == 'refuse' then
    return redis.error_reply(PAUSED_ERROR)
  end
  if not (first and first >= 0 and first % 1 == 0) then
    --@make seqRefusals
    return badSeqError(metaKey, raw)
  end
  seqMissing = not raw
  window = tonumber(ARGV[2])
  -- The stored expiry decides what is a duplicate; the key's TTL only
  -- cleans up. With a time passed by a test clock, real time says nothing
  -- about it, so the key lives a day longer than the window.
  ttl = math.max(1, window)
  if ARGV[1] ~= '' then
    ttl = window + TEST_CLOCK_TTL_SLACK
  end
else
  local count = bare and #ARGV - 6 or (#ARGV - 5) / 3
  -- A number handed to redis.call is formatted with sprintf: the common
  -- single publish passes text.
  local newLast = redis.pcall('HINCRBY', metaKey, 'seq', count == 1 and '1' or count)
  if type(newLast) == 'table' then
    -- A refusal (over maxmemory, ...) as it came; garbage in the last seq named.
    local raw = rcall('HGET', metaKey, 'seq')
    if raw and not string.find(raw, '^%d+$') then
      --@make seqRefusals
      return badSeqError(metaKey, raw)
    end
    return newLast
  end
  first = newLast - count
  seqMissing = first == 0
  local fields = rcall('HMGET', metaKey, 'inc', 'paused', 'partitioned', 'wake', 'layout')
  inc, paused, waiting, layout = fields[1], fields[2], fields[4], fields[5]
  local wrongLayout = layoutError(metaKey, msgsKey, layout, not seqMissing)
  if paused == 'refuse' or fields[3] or wrongLayout then
    -- The HINCRBY above, undone: the script is atomic, so no call saw it.
    --@make seqUndo
    undoSeq(metaKey, first, seqMissing)
    return fields[3] and redis.error_reply(PARTITIONED .. fields[3]) or wrongLayout or redis.error_reply(PAUSED_ERROR)
  end
end
if seqMissing then
  --@make seqRefusals
  local refused = reusedSeqsError(metaKey, msgsKey, floorsKey)
  if refused then
    if not anyId then
      rcall('HDEL', metaKey, 'seq') -- the HINCRBY above, undone
    end
    return refused
  end
end
if not inc then
  -- A new meta (or one an older rqueue wrote): the queue's incarnation
  -- starts here, checked here rather than by every call.
  inc = ''
  if string.find(ARGV[5] or '', '^%l[%l%d]*$') and #ARGV[5] <= 32 then
    inc = ARGV[5]
    rcall('HSET', metaKey, 'inc', inc)
  end
end
local seq = first
-- delayed, ids and claims are made when a message needs them (most batches
-- have neither delays nor ids).
local records, delayed, ids, claims = {}, nil, nil, nil
local prioritized = nil -- score, member pairs for the priority log
local side = nil -- seq, record pairs of a stream log's side hash
local compact = compactHead(now)
-- A stream log gets entries (id, field, value), not records: a compact one
-- as "<seq>-<now>" "p" <payload> (includes/log.lua).
--@layout stream
local streamTime = logIsStream(msgsKey) and ('-' .. string.format('%.0f', now)) or nil
--@end
-- The text records' ":<now>:", made on first use (turning a number into a
-- string is a sprintf). %.0f: a number concatenated as it is reads 1e+14
-- style past 14 digits. The layout is makeRecord's (includes/record.lua),
-- built here so that a batch makes the prefix once.
local prefix = nil
-- Appends count with nrec and nout: # on a growing table searches its
-- bounds at every append.
local nrec, nout = 0, 1
--@layout stream
-- A batch's stream entry ids: seqs of 100 or more as their hundreds and two
-- digits (includes/two_digits.lua), which a call of a few messages would
-- pay more for than their sprintfs.
local digits = nil
if streamTime and #ARGV >= (bare and 6 + 16 or 5 + 3 * 16) then
  --@make digitTable
  digits = twoDigits()
end
-- The hundred whose digits hundreds holds: a message written another way
-- (headers, a delay) may take the seq where a new hundred starts.
local hundreds, hundredsOf = nil, nil
-- The stream entry id of seq, a compact record's: the seq, then the publish
-- time (includes/log.lua's logAppendBodies makes a bare call's ids alike).
-- Made below for a call whose entries the general loop writes.
local entryId = nil
--@end
-- A bare call to a stream log stores its bodies as compact entries in one
-- loop of includes/log.lua (no table of entries between, no function call
-- a message); the general loop below then runs no message.
local plain = false
--@layout stream
plain = bare and streamTime ~= nil and compact ~= nil
if plain and #ARGV > 6 then
  local refused
  refused, seq = logAppendBodies(msgsKey, seq, 7, streamTime, digits)
  if refused then
    --@make seqUndo
    undoSeq(metaKey, first, seqMissing)
    return refused
  end
elseif streamTime then
  entryId = function(seq)
    if digits == nil or seq < 100 then
      return string.format('%d', seq) .. streamTime
    end
    local low = seq % 100
    local hundred = (seq - low) / 100
    if hundred ~= hundredsOf then
      hundreds, hundredsOf = string.format('%d', hundred), hundred
    end
    return hundreds .. digits[low + 1] .. streamTime
  end
end
--@end
for i = bare and 7 or 6, plain and 0 or #ARGV, bare and 1 or 3 do
  -- "0" is compared as a string: tonumber parses with strtod.
  local idKey, timing, body = '0', '0', ARGV[i] -- a bare call's message
  if not bare then
    idKey, timing, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  end
  local delay, hlen = 0, '0'
  local priority = nil -- '1'..'9', or 'k:<key>' for an ordering key; nil: none
  if timing ~= '0' then
    delay = tonumber(timing)
    if delay == nil then
      local d, h, p, key = string.match(timing, '^(%d+):(%d+):?([1-9]?):?(.*)$')
      delay, hlen = tonumber(d), h
      if key ~= '' and key ~= nil then
        priority = 'k:' .. key
      elseif p ~= '' and p ~= nil then
        priority = p
      end
    end
  end
  local seen, name = nil, nil
  if idKey ~= '0' then
    name = KEYS[tonumber(idKey) or 0] -- KEYS[0]: nil, no id
  end
  if name ~= nil then
    claims = claims or {}
    local value = claims[name]
    if value == nil then
      value = rcall('GET', name)
    end
    if value then
      local old, expires, owner = string.match(value, '^(%d+):(%d+):?(.*)$')
      if old and tonumber(expires) > now and (owner == inc or owner == '') then
        seen = old
      end
    end
  end
  if seen then
    out[nout + 1], out[nout + 2] = tonumber(seen), 1
    nout = nout + 2
  else
    seq = seq + 1
    if delay == 0 and hlen == '0' and compact then
      --@layout stream
      if streamTime then
        records[nrec + 1], records[nrec + 2], records[nrec + 3] = entryId(seq), 'p', body
        nrec = nrec + 3
      else
        --@end
        records[nrec + 1], records[nrec + 2] = seq, compact .. body
        nrec = nrec + 2
        --@layout stream
      end
      --@end
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
      --@layout stream
      if streamTime then
        records[nrec + 1], records[nrec + 2] = seq .. '-0', 'r'
        nrec = nrec + 2
      else
        --@end
        nrec = nrec + 1
        records[nrec] = seq
        --@layout stream
      end
      --@end
      nrec = nrec + 1
      records[nrec] = notBefore .. prefix .. hlen .. ':' .. body
    end
    --@layout stream
    if streamTime and priority then
      -- The record goes to the side hash, where fetch's priority and key
      -- reads take many by one HMGET, and the stub "<seq>-0" "s" "" to the
      -- stream, which keeps an entry per seq (includes/log.lua).
      local n = nrec
      side = side or {}
      side[#side + 1] = string.format('%d', seq)
      side[#side + 1] = records[n - 1] == 'p' and (compact .. records[n]) or records[n]
      records[n - 2], records[n - 1], records[n] = seq .. '-0', 's', ''
    end
    --@end
    if name ~= nil then
      claims[name] = seq .. ':' .. (now + window) .. ':' .. inc
      ids = ids or {}
      ids[#ids + 1] = name
    end
    if priority then
      -- The priority log: score the seq, member "<seq>:<priority>" (or
      -- "<seq>:k:<key>"); each group's fetch moves what is new in it to its
      -- own priority set (or its ordering keys' sets).
      prioritized = prioritized or {}
      prioritized[#prioritized + 1] = seq
      prioritized[#prioritized + 1] = string.format('%d', seq) .. ':' .. priority
    end
    if not bare then -- a bare call replies its range
      out[nout + 1], out[nout + 2] = seq, 0
      nout = nout + 2
    end
  end
end
local last = nil
if seq > first then
  -- The last seq as text once, for its record's field and the wake-up.
  last = string.format('%d', seq)
  --@layout stream
  if not streamTime then
    --@end
    records[#records - 1] = last
    --@layout stream
  end
  --@end
  -- The first write may grow memory (this HSET, or the HINCRBY above for a
  -- batch without ids), so Redis refuses the whole call over maxmemory; a
  -- first write that cannot, such as ZREMRANGEBYSCORE, would let every later
  -- write of the call through.
  if anyId then
    rcall('HSET', metaKey, 'seq', seq)
  end
  local refused = nil
  --@layout stream
  if plain then
    -- written by the plain batch's loop, above
  elseif streamTime then
    refused = logWriteEntries(msgsKey, records)
  else
    --@end
    refused = logWrite(msgsKey, records)
    --@layout stream
  end
  --@end
  if refused then
    --@make seqUndo
    undoSeq(metaKey, first, seqMissing)
    return refused
  end
  --@layout stream
  markLayout(metaKey, msgsKey, layout)
  if side then
    bulk('HSET', sideKey, side)
  end
  --@end
  if delayed then
    bulk('ZADD', schedKey, delayed)
  end
  for _, name in ipairs(ids or {}) do
    rcall('SET', name, claims[name], 'PX', ttl)
  end
  if prioritized then
    bulk('ZADD', prioKey, prioritized)
    -- Read by every fetch with the incarnation: a queue without it pays
    -- nothing more for priorities.
    rcall('HSET', metaKey, 'prio', '1')
  end
end
-- Delayed publishes now due leave the schedule (only new ones are later than
-- now). Stats count only entries later than now, so this only bounds the
-- set's size: done by delayed publishes and by every call that passes a
-- multiple of SCHED_CLEAN_EVERY seqs, not by each small publish.
if delayed or seq - seq % SCHED_CLEAN_EVERY > first then
  rcall('ZREMRANGEBYSCORE', schedKey, '-inf', now)
end
out[1] = inc
if bare then
  out = {inc, 'range', first + 1, seq}
end
if last ~= nil and channel ~= '' then
  -- Only a wake-up hint: a refusal must not fail a publish already stored.
  redis.pcall('PUBLISH', channel, last)
  if waiting then
    --@make wakeUp
    wakeWaiters(metaKey, wakesKey, last)
  end
end
return out
