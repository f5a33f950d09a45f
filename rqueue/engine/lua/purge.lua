--[[
  Purges one group's backlog: every message the group has not settled and
  that is not in flight (due and delayed redeliveries, and everything its
  cursor has not read yet, delayed publishes and messages published with a
  priority or an ordering key included) is settled as purged.
  In-flight deliveries are left to their consumers (RabbitMQ's queue.purge).
  Records go once every group has settled them, as for acks.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the most messages to purge in this call
  Output:
    { purged, more } with more = 1 when the group still has a backlog
  Errors (nothing is changed):
    RQ_CORRUPT  the cursor, the ack floor or the last seq is not a seq, the
                cursor is below the floor (it would settle settled messages
                again), or the last seq is below the cursor or missing while
                records are stored (a deleted meta hash)
  Work: at most ARGV[8] messages per call; call again while more is 1.
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include bulk
--@include bulk_get
--@include settle
--@include record_event

local limit = tonumber(ARGV[8])
local seqs = {}

-- The positions it works from, checked before any write.
local function seqAt(key, field)
  local raw = rcall('HGET', key, field)
  local v = tonumber(raw or '0')
  if not (v and v >= 0 and v % 1 == 0) then
    error('RQ_CORRUPT ' .. key .. ' field ' .. field .. ' holds ' .. string.sub(raw, 1, 40) .. ', not a seq')
  end
  return v
end
local floor, cursor, last = seqAt(floorsKey, groupName), seqAt(groupKey, 'cursor'), seqAt(metaKey, 'seq')
if cursor < floor then
  return redis.error_reply('RQ_CORRUPT ' .. groupKey .. ' field cursor is ' .. cursor .. ', below the ack floor '
    .. floor .. ' (' .. floorsKey .. '): a purge would settle settled messages again')
end
if last < cursor or last == 0 and rcall('EXISTS', msgsKey) == 1 then
  return redis.error_reply('RQ_CORRUPT ' .. metaKey .. ' field seq (the last seq) is '
    .. (rcall('HGET', metaKey, 'seq') or 'missing') .. ', below the cursor ' .. cursor .. ' of ' .. groupKey
    .. ' or the records stored')
end

for _, key in ipairs({readyKey, delayKey}) do
  if #seqs < limit then
    local waiting = rcall('ZRANGE', key, 0, limit - #seqs - 1)
    if #waiting > 0 then
      bulk('ZREM', key, waiting)
      bulk('HDEL', dlvKey, waiting)
      for _, s in ipairs(waiting) do
        seqs[#seqs + 1] = tonumber(s)
      end
    end
  end
end

-- What the group pulled from the priority log and has not handed out (its
-- priority set, its ordering keys' queue) may lie below the cursor, which
-- the scan of new messages moved past it: settled here, unless handed out
-- meanwhile (a delivery state) or already settled (at or below the floor).
for _, key in ipairs({prioSetKey, keyQueueKey}) do
  if #seqs < limit and rcall('EXISTS', key) == 1 then
    local waiting = rcall('ZRANGE', key, 0, limit - #seqs - 1)
    bulk('ZREM', key, waiting)
    local fields = {}
    for i, m in ipairs(waiting) do
      fields[i] = string.format('%d', tonumber(string.match(m, '(%d+)$')) or 0)
    end
    for i, state in ipairs(bulkGet(dlvKey, fields)) do
      local s = fields[i] + 0
      if not state and s > floor and s <= cursor then
        seqs[#seqs + 1] = s
      end
    end
  end
end

local upto = math.min(last, cursor + limit - #seqs)
-- A message published with a priority (meta field "prio") may be in flight
-- above the cursor (fetch hands those out apart from the cursor): a seq
-- with a delivery state is left to its consumer.
local inFlight = {}
if upto > cursor and rcall('HEXISTS', metaKey, 'prio') == 1 then
  local range = {}
  for s = cursor + 1, upto do
    range[#range + 1] = s
  end
  for i, state in ipairs(bulkGet(dlvKey, range)) do
    if state then
      inFlight[range[i]] = true
    end
  end
end
for s = cursor + 1, upto do
  if not inFlight[s] then
    seqs[#seqs + 1] = s
  end
end
if upto > cursor then
  rcall('HSET', groupKey, 'cursor', upto)
end

settleMany(seqs)
if #seqs > 0 then
  rcall('HINCRBY', groupKey, 'purged', #seqs)
  recordEvent('purged-messages', #seqs, 'purge')
end
local more = 0
if upto < last or rcall('EXISTS', readyKey, delayKey, prioSetKey, keyQueueKey) > 0 then
  more = 1
end
return {#seqs, more}
