--[[
  Moves one level of a queue (the queue, a partition, a dead-letter queue)
  from the hash layout's log to the stream layout's (includes/log.lua), in
  three steps that rqueue.engine.migration sends (`rqueue migrate`):
    begin   meta field "layout" becomes "migrating", which includes/
            layout.lua refuses for the keys of either layout: no client
            writes a record to the hash while it is copied, nor reads the
            stream before it is whole.
    copy    moves the records of the seqs given, rising and above every
            seq copied before (meta field "migrated"), from the hash to the
            stream, as a publish of the stream layout would have stored
            them: a message with a priority or an ordering key (its seq in
            the priority log) as a stub and its record in the side hash. A
            seq reopened by replay (a count in the pinned hash) keeps its
            record beside the pins too (field "r<seq>", includes/
            log_one.lua's logWriteNew). A record at or below the trim point
            (meta field "trimmed": every group settled it, and the hash
            layout's deletion of it lagged) that is not pinned is deleted,
            as the stream's trim would have dropped it.
    finish  once the hash holds no record: drops the hash layout's settled
            counts and the copy's cursor; meta field "layout" becomes
            "stream", and fields "gaps" and "gaps_to" say that a seq up to
            "gaps_to" (the last seq now) may have no entry above the trim
            point (the hash layout deleted a record every group settled
            one by one), which a group made later passes over
            (includes/missing_record.lua); above it, entries go only by
            the trim.
  Group keys need no change: a delivery in flight is the stream layout's
  per-message path already, and its call records start empty.

  Input:
    KEYS[1] the meta hash, KEYS[2] the hash log "<base>:msgs", KEYS[3] the
      stream log "<base>:log", KEYS[4] its side hash "<base>:side", KEYS[5]
      the priority log "<base>:prio", KEYS[6] the pinned hash
      "<base>:pinned", KEYS[7] the settled counts "<base>:settled"
    ARGV[1] the step: "begin", "copy" or "finish"
    ARGV[2..] copy only: the seqs to move, rising, 1 to 5000 of them (a seq
      without a record, settled since it was listed, is passed over)
  Output:
    begin   { state }: "begun" (marked by this call), "migrating" (marked by
            an earlier begin: a migration cut off, resumed), "stream"
            (migrated before: nothing changed)
    copy    { logged, pinned, dropped, absent }: records now in the stream,
            records kept beside the pins, records deleted at or below the
            trim point, seqs without a record
    finish  { done, left }: { 1, 0 }, or { 0, left } where the hash still
            holds left records (nothing changed: copy them first)
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  an unknown step; copy: no seq or more than 5000, a seq
                     that is not a whole number above 0, seqs not rising,
                     or a seq not above meta field "migrated"
    RQ_LAYOUT        copy or finish of a level that begin did not mark;
                     begin of a level whose field "layout" names no layout
    RQ_CORRUPT       begin: a hash-layout level whose stream log or side
                     hash holds entries (they would join its messages);
                     copy: the stream holds an entry at or above a seq to
                     copy, or field "trimmed" or "migrated" is not a seq
  Work: copy reads at most 5000 records (one HMGET each of the log and the
  pins, one ZRANGEBYSCORE) and writes an XADD per record kept.
]]
--@include log
--@include bulk
--@include bulk_get
--@include stored_seq

local rcall = redis.call
local metaKey, hashKey, streamKey, sideKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prioKey, pinnedKey, settledKey = KEYS[5], KEYS[6], KEYS[7]
local MIGRATING = 'migrating'
local MAX_SEQS = 5000
local step = ARGV[1]

local function notBegun(layout)
  return redis.error_reply('RQ_LAYOUT ' .. metaKey .. ' says the log has the ' .. tostring(layout or 'hash')
    .. ' layout: a migration step "' .. step .. '" needs it marked "migrating" by the step "begin"')
end

local layout = rcall('HGET', metaKey, 'layout')

if step == 'begin' then
  if layout == 'stream' or layout == MIGRATING then
    return { layout }
  end
  if layout then
    return redis.error_reply('RQ_LAYOUT ' .. metaKey .. ' field layout holds ' .. string.sub(layout, 1, 40)
      .. ', which names no layout (hash, stream)')
  end
  if rcall('EXISTS', streamKey, sideKey) > 0 then
    return redis.error_reply('RQ_CORRUPT ' .. metaKey .. ' says the hash layout, and ' .. streamKey .. ' or '
      .. sideKey .. ' holds entries: copied into them, they would join its messages (see `rqueue doctor`)')
  end
  rcall('HSET', metaKey, 'layout', MIGRATING)
  return { 'begun' }
end

if step == 'finish' then
  if layout ~= MIGRATING then
    return notBegun(layout)
  end
  local left = rcall('HLEN', hashKey)
  if left > 0 then
    return { 0, left }
  end
  rcall('DEL', settledKey)
  rcall('HDEL', metaKey, 'migrated', 'swept')
  rcall('HSET', metaKey, 'layout', 'stream', 'gaps', '1', 'gaps_to', rcall('HGET', metaKey, 'seq') or '0')
  return { 1, 0 }
end

if step ~= 'copy' then
  return redis.error_reply('RQ_BAD_ARGUMENT the migration step is "begin", "copy" or "finish", not "'
    .. string.sub(tostring(step), 1, 40) .. '"')
end
if layout ~= MIGRATING then
  return notBegun(layout)
end
local count = #ARGV - 1
if count < 1 or count > MAX_SEQS then
  return redis.error_reply('RQ_BAD_ARGUMENT a copy takes 1 to ' .. MAX_SEQS .. ' seqs, not ' .. count)
end
local migrated = seqAt(metaKey, 'migrated')
local seqs, last = {}, migrated
for i = 2, #ARGV do
  local seq = tonumber(ARGV[i])
  if not (seq and seq > 0 and seq % 1 == 0) then
    return redis.error_reply('RQ_BAD_ARGUMENT a seq to copy is a whole number above 0, not '
      .. string.sub(ARGV[i], 1, 40))
  end
  if seq <= last then
    return redis.error_reply('RQ_BAD_ARGUMENT the seqs to copy rise, each above the last copied ('
      .. migrated .. ', meta field migrated): ' .. ARGV[i] .. ' follows ' .. last)
  end
  last = seq
  seqs[#seqs + 1] = ARGV[i]
end
local trimmed = seqAt(metaKey, 'trimmed')

local records = bulkGet(hashKey, seqs)
local pins = bulkGet(pinnedKey, seqs)
-- The seqs of the priority log in the range (members "<seq>:<priority>" or
-- "<seq>:k:<key>", scored by seq).
local flow = {}
for _, member in ipairs(rcall('ZRANGEBYSCORE', prioKey, seqs[1], seqs[count])) do
  flow[string.match(member, '^%d+')] = true
end

local entries, side, kept, present = {}, {}, {}, {}
local logged, pinned, dropped, absent = 0, 0, 0, 0
for i, seq in ipairs(seqs) do
  local rec = records[i]
  if not rec then
    absent = absent + 1
  else
    present[#present + 1] = seq
    local isPinned = (tonumber(pins[i] or '0') or 0) > 0
    if tonumber(seq) > trimmed then
      logged = logged + 1
      if flow[seq] then
        entries[#entries + 1] = seq .. '-0'
        entries[#entries + 1] = 's'
        entries[#entries + 1] = ''
        side[#side + 1] = seq
        side[#side + 1] = rec
      else
        local id, field, value = logEntry(seq, rec)
        entries[#entries + 1] = id
        entries[#entries + 1] = field
        entries[#entries + 1] = value
      end
    end
    if isPinned then
      pinned = pinned + 1
      kept[#kept + 1] = 'r' .. seq
      kept[#kept + 1] = rec
    elseif tonumber(seq) <= trimmed then
      dropped = dropped + 1
    end
  end
end

-- The stream's entries first: the first XADD is the call's first write, so
-- a refusal there (memory, an id at or below the newest) leaves all as it was.
if #entries > 0 then
  local refused = logWriteEntries(streamKey, entries)
  if refused then
    return refused
  end
end
if #side > 0 then
  bulk('HSET', sideKey, side)
end
if #kept > 0 then
  bulk('HSET', pinnedKey, kept)
end
if #present > 0 then
  bulk('HDEL', hashKey, present)
  bulk('HDEL', settledKey, present)
end
rcall('HSET', metaKey, 'migrated', seqs[count])
return { logged, pinned, dropped, absent }
