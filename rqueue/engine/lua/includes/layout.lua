--[[
  A queue's layout (includes/log.lua) against the log key a call was sent.
  The layout is meta field "layout": "stream", or no field for the hash
  layout; "migrating" while migrate.lua moves the log from the hash to the
  stream, when the keys of both layouts are refused. A queue without the
  field and without a seq has stored nothing yet: a publish sent a stream
  key makes it a stream queue (markLayout).
  Every script that touches the log checks before any write (RQ_LAYOUT),
  so that a client of the other layout changes nothing: it would read no
  records, and take the messages for lost. ack and ack_result check a
  stream key only: an ack of a hash-layout client that met a stream queue
  (its tags came from before the queue was made again) settles its
  messages and leaves their entries to the trim, which a refusal would not
  save, and the check would cost every ack of the hash layout a read. A
  dead-letter queue is checked when a message is dead-lettered
  (includes/dead_letter.lua).
]]
--@include log

-- The RQ_LAYOUT error text when the log key is of the other layout than
-- the queue's, else nil. layout and seq are meta fields "layout" and "seq"
-- as read (false when missing).
local function layoutProblem(metaKey, logKey, layout, seq)
  local stream = string.byte(logKey, -1) == LOG_STREAM_BYTE
  if layout == 'stream' and stream or not layout and (not stream or not seq) then
    return nil
  end
  if layout == 'migrating' then
    return 'RQ_LAYOUT ' .. metaKey .. ' says the log is being migrated to the stream layout (`rqueue migrate`): '
      .. 'every call is refused until it is done, and the call was sent the key ' .. logKey
  end
  return 'RQ_LAYOUT ' .. metaKey .. ' says the log has the ' .. tostring(layout or 'hash')
    .. ' layout, and the call was sent the key ' .. logKey
end

-- layoutProblem as an error reply, or nil.
local function layoutError(metaKey, logKey, layout, seq)
  local problem = layoutProblem(metaKey, logKey, layout, seq)
  return problem and redis.error_reply(problem)
end

-- layoutError, with the meta fields read here.
local function checkLayout(metaKey, logKey)
  local fields = redis.call('HMGET', metaKey, 'layout', 'seq')
  return layoutError(metaKey, logKey, fields[1], fields[2])
end

-- Writes meta field "layout" of a queue that stores its first records into
-- a stream log (layout: the field as read).
local function markLayout(metaKey, logKey, layout)
  if not layout and string.byte(logKey, -1) == LOG_STREAM_BYTE then
    redis.call('HSET', metaKey, 'layout', 'stream')
  end
end

-- The RQ_LAYOUT error reply when logKey is a stream log and the call was
-- not sent its side hash last of its KEYS (sideKey nil: a client of an
-- earlier build), else nil. Every script that can meet a stub (includes/
-- log.lua) asks before its first write: its helpers would refuse the stub
-- later, after writes.
local function sideKeyError(logKey, sideKey)
  --@layout hash
  return nil -- the hash layout's text runs only for calls sent no stream log (rqueue.engine.scripts)
  --@end
  --@layout stream
  if sideKey or string.byte(logKey, -1) ~= LOG_STREAM_BYTE then
    return nil
  end
  return redis.error_reply('RQ_LAYOUT ' .. logKey .. ' is a stream log: the call must be sent its side hash, '
    .. string.sub(logKey, 1, -4) .. 'side, last of its KEYS, and its last key is ' .. tostring(KEYS[#KEYS]))
  --@end
end
