--[[
  Purges one group's backlog: every message the group has not settled and
  that is not in flight (due and delayed redeliveries, and everything its
  cursor has not read yet, delayed publishes and messages published with a
  priority or an ordering key included) is settled as purged.
  In-flight deliveries are left to their consumers (RabbitMQ's queue.purge).
  Records go once every group has settled them, as for acks.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua), and KEYS[25] the
      side hash for a stream log
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
--@include log
--@include group_keys
--@include group_names
--@include bulk
--@include bulk_get
--@include settle
--@include record_event
--@include layout
--@include stored_seq

local wrongLayout = checkLayout(metaKey, msgsKey)
if wrongLayout then
  return wrongLayout
end

local limit = tonumber(ARGV[8])
local seqs = {}

-- The positions it works from, checked before any write.
local floor, cursor, last = seqAt(floorsKey, groupName), seqAt(groupKey, 'cursor'), seqAt(metaKey, 'seq')
if cursor < floor then
  return redis.error_reply('RQ_CORRUPT ' .. groupKey .. ' field cursor is ' .. cursor .. ', below the ack floor '
    .. floor .. ' (' .. floorsKey .. '): a purge would settle settled messages again')
end
if last < cursor or last == 0 and logAny(msgsKey) then
  return redis.error_reply('RQ_CORRUPT ' .. metaKey .. ' field seq (the last seq) is '
    .. (rcall('HGET', metaKey, 'seq') or 'missing') .. ', below the cursor ' .. cursor .. ' of ' .. groupKey
    .. ' or the records stored')
end

-- Seqs settled by this call ahead of the range of new messages below
-- (which passes over them): a delayed priority message waits in the delay
-- set above the cursor, without a delivery state.
local taken = {}
for _, key in ipairs({readyKey, delayKey}) do
  if #seqs < limit then
    local waiting = rcall('ZRANGE', key, 0, limit - #seqs - 1)
    if #waiting > 0 then
      bulk('ZREM', key, waiting)
      bulk('HDEL', dlvKey, waiting)
      for _, s in ipairs(waiting) do
        seqs[#seqs + 1] = tonumber(s)
        taken[seqs[#seqs]] = true
      end
    end
  end
end

-- Settled above the floor already: in one of the group's acked runs
-- (member: a run's first seq, score: its last).
local function inAckedRun(s)
  local run = rcall('ZRANGEBYSCORE', ackedKey, string.format('%d', s), '+inf', 'LIMIT', '0', '1')
  return run[1] ~= nil and run[1] + 0 <= s
end

-- What the group pulled from the priority log and has not handed out (its
-- priority set, its ordering keys' queue), below or above the cursor (the
-- scan of new messages passes over those seqs): settled here as it is taken
-- out, unless handed out meanwhile (a delivery state) or already settled
-- (at or below the floor, or in an acked run). Those above the cursor are
-- passed over by the range below.
for _, key in ipairs({prioSetKey, keyQueueKey}) do
  if #seqs < limit and rcall('EXISTS', key) == 1 then
    local waiting = rcall('ZRANGE', key, 0, limit - #seqs - 1)
    bulk('ZREM', key, waiting)
    local fields = {}
    for i, m in ipairs(waiting) do
      fields[i] = string.format('%d', tonumber(string.match(m, '(%d+)$')) or 0)
    end
    local runsExist = rcall('EXISTS', ackedKey) == 1
    for i, state in ipairs(bulkGet(dlvKey, fields)) do
      local s = fields[i] + 0
      if not state and s > floor and s <= last and not taken[s] and not (runsExist and inAckedRun(s)) then
        seqs[#seqs + 1] = s
        taken[s] = true
      end
    end
  end
end

local upto = math.min(last, cursor + limit - #seqs)
-- A message published with a priority or a key (meta field "prio") may be
-- in flight above the cursor, or acked there (fetch hands those out apart
-- from the cursor): a seq with a delivery state is left to its consumer,
-- and one in an acked run is settled already, as is one taken above.
local passOver = taken
if upto > cursor and rcall('HEXISTS', metaKey, 'prio') == 1 then
  local range = {}
  for s = cursor + 1, upto do
    range[#range + 1] = s
  end
  for i, state in ipairs(bulkGet(dlvKey, range)) do
    if state then
      passOver[range[i]] = true
    end
  end
  -- The runs that end above the cursor, as many as the range has seqs:
  -- runs are disjoint, so those hold every run that meets the range.
  local runs = rcall('ZRANGEBYSCORE', ackedKey, string.format('%d', cursor + 1), '+inf', 'WITHSCORES', 'LIMIT', '0',
    string.format('%d', upto - cursor))
  for i = 1, #runs, 2 do
    for s = math.max(runs[i] + 0, cursor + 1), math.min(runs[i + 1] + 0, upto) do
      passOver[s] = true
    end
  end
end
for s = cursor + 1, upto do
  if not passOver[s] then
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
