--[[
  Publishes due ticks of one recurring schedule, each tick at most once: a
  tick is published only when it is later than the last tick the schedule
  handled, and that last tick moves in the same call: a tick sent again (by
  a scheduler that restarted, or by another scheduler) is passed over. The
  client computes the ticks from the schedule's timing (rqueue/ticks.py);
  the script judges them by its own clock.

  Input:
    KEYS[1] schedule  hash  the schedule: version (of its timing), paused
        ("1" when paused), since (ms: no tick at or before it fires), last
        (ms: the latest tick handled), payload, headers (a JSON object of
        str to str, x-rq-schedule included), fired and skipped (counters),
        fired_at (ms: when the latest publish was stored)
    KEYS[2] meta      hash  seq (last assigned) of the target queue
    KEYS[3] msgs      hash  seq -> record of the target queue
    KEYS[4] floors    hash  group -> ack floor of the target queue (read:
        whether a missing last seq means a deleted meta hash)
    KEYS[5] wakes     stream  the target queue's wake-up, as publish.lua's
    KEYS[6] events    stream  the target queue's events: given only when
        its events setting names "scheduled"; one "scheduled" entry per
        message published (seq, reason: the schedule's name), capped as
        includes/record_event.lua caps it
    ARGV[1] now in ms, or "" for the server's TIME
    ARGV[2] the version of the timing the ticks were computed from
    ARGV[3] lateness limit, ms: a due tick older than now minus it is
        skipped (handled, not published); "" for none
    ARGV[4] channel to announce new messages on, or ""
    ARGV[5..] ticks, ms since the epoch, ascending, at most 1000
  Each tick after since and last and not after now is handled in order:
  published as a record with the schedule's payload and headers plus
  x-rq-tick (the tick, ms), or skipped when late; ticks after now are left.
  Output:
    { status, last, published, skipped, first_seq }: status "ok", "gone"
    (no such schedule), "changed" (the schedule's timing has another
    version) or "paused" (nothing is written but for "ok"); last is the
    schedule's latest tick handled after the call (0: none); first_seq the
    seq of the first message published (0: none)
  Errors (nothing is written):
    RQ_BAD_ARGUMENT  a tick that is not a whole number, ticks not in
        ascending order, more than 1000 ticks, or a bad lateness limit
    RQ_CORRUPT       the schedule's headers are not a JSON object, or the
        target queue's last seq is garbage, or missing while the queue has
        records or a group that settled some (as publish.lua)
]]
--@include log
--@include layout
--@include read_now
--@include seq_guard
--@include bulk
--@include record
--@include wake

local rcall = redis.call
local MAX_TICKS = 1000
local scheduleKey, metaKey, msgsKey, floorsKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local wakesKey, eventsKey = KEYS[5], KEYS[6]
local EVENTS_MAX = 10000 -- as includes/record_event.lua
local now, nowText = readNow(ARGV[1])
local channel = ARGV[4]

local lateness = nil
if ARGV[3] ~= '' then
  lateness = tonumber(ARGV[3])
  if lateness == nil or lateness < 0 then
    return redis.error_reply('RQ_BAD_ARGUMENT lateness limit ' .. string.sub(ARGV[3], 1, 40))
  end
end
if #ARGV - 4 > MAX_TICKS then
  return redis.error_reply('RQ_BAD_ARGUMENT ' .. (#ARGV - 4) .. ' ticks, over the limit of ' .. MAX_TICKS)
end
local previous = -1
for i = 5, #ARGV do
  local tick = string.match(ARGV[i], '^%d+$') and tonumber(ARGV[i])
  if not tick or tick <= previous then
    return redis.error_reply('RQ_BAD_ARGUMENT tick ' .. string.sub(ARGV[i], 1, 40) .. ' is not a whole number above the one before')
  end
  previous = tick
end

local fields = rcall('HMGET', scheduleKey, 'version', 'paused', 'since', 'last', 'headers')
local version, paused, since, last, headersJson = fields[1], fields[2], fields[3], fields[4], fields[5]
if not version then
  return {'gone', 0, 0, 0, 0}
end
local lastTick = tonumber(last or '') or 0
if version ~= ARGV[2] then
  return {'changed', lastTick, 0, 0, 0}
end
if paused == '1' then
  return {'paused', lastTick, 0, 0, 0}
end
local floor = math.max(lastTick, tonumber(since or '') or 0)

-- The ticks this call handles: after the floor, not after now.
local publish, skipped, newLast = {}, 0, nil
for i = 5, #ARGV do
  local tick = tonumber(ARGV[i])
  if tick > now then
    break
  end
  if tick > floor then
    newLast = ARGV[i]
    if lateness ~= nil and now - tick > lateness then
      skipped = skipped + 1
    else
      publish[#publish + 1] = ARGV[i]
    end
  end
end
if newLast == nil then
  return {'ok', lastTick, 0, 0, 0}
end

local firstSeq = 0
if #publish > 0 then
  local ok, headers = pcall(cjson.decode, headersJson or '')
  if not ok or type(headers) ~= 'table' then
    return redis.error_reply('RQ_CORRUPT ' .. scheduleKey .. ' headers are not a JSON object')
  end
  local payload = rcall('HGET', scheduleKey, 'payload') or ''
  local meta = rcall('HMGET', metaKey, 'seq', 'layout')
  local raw = meta[1]
  local wrongLayout = layoutError(metaKey, msgsKey, meta[2], raw)
  if wrongLayout then
    return wrongLayout
  end
  if raw and not string.find(raw, '^%d+$') then
    return badSeqError(metaKey, raw)
  end
  if not raw then
    local refused = reusedSeqsError(metaKey, msgsKey, floorsKey)
    if refused then
      return refused
    end
  end
  -- The first write may grow memory: over maxmemory Redis refuses the whole
  -- call here, before anything is written.
  local seq = rcall('HINCRBY', metaKey, 'seq', #publish) - #publish
  firstSeq = seq + 1
  local records = {}
  for _, tick in ipairs(publish) do
    seq = seq + 1
    headers['x-rq-tick'] = tick
    records[#records + 1] = seq
    records[#records + 1] = makeRecord('', nowText, cjson.encode(headers), payload)
  end
  local refused = logWrite(msgsKey, records)
  if refused then
    -- The HINCRBY above, undone: nothing else was written.
    if raw then
      rcall('HSET', metaKey, 'seq', raw)
    else
      rcall('HDEL', metaKey, 'seq')
    end
    return refused
  end
  markLayout(metaKey, msgsKey, meta[2])
  rcall('HINCRBY', scheduleKey, 'fired', #publish)
  rcall('HSET', scheduleKey, 'fired_at', nowText)
  if eventsKey then
    -- The key is <base>:schedule:<name>, the base ending in its {tag} and
    -- any ":dlq" (rqueue.engine.keys): the name is all after the first
    -- ":schedule:" there, and may hold ":schedule:" itself.
    local name = string.match(scheduleKey, '^[^}]*}[:dlq]-:schedule:(.*)$') or scheduleKey
    for i = 1, #publish do
      rcall('XADD', eventsKey, 'MAXLEN', '~', EVENTS_MAX, '*', 'event', 'scheduled', 'group', '',
        'seq', firstSeq + i - 1, 'reason', name, 'at', now, 'dlq_seq', '')
    end
  end
  if channel ~= '' then
    -- Only a wake-up hint: a refusal must not fail a publish already stored.
    redis.pcall('PUBLISH', channel, string.format('%d', seq))
    if wakesKey and rcall('HEXISTS', metaKey, 'wake') == 1 then
      wakeWaiters(metaKey, wakesKey, string.format('%d', seq))
    end
  end
end
if skipped > 0 then
  rcall('HINCRBY', scheduleKey, 'skipped', skipped)
end
rcall('HSET', scheduleKey, 'last', newLast)
return {'ok', tonumber(newLast), #publish, skipped, firstSeq}
