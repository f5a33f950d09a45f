--[[
  Pauses or resumes a group (its fetches hand out nothing; acks, nacks,
  extensions, heartbeats and lease expiry keep working) or a queue (its
  publishes are refused, or stored and held from every group).

  Input:
    KEYS[1] meta     hash  field "paused": "refuse", or "hold:<seq>" (the
                           last seq when the hold began: no group hands out
                           a message published after it until resume)
    KEYS[2] floors   hash  group -> ack floor: the group registry
    KEYS[3] group    hash  field "paused": "1" while the group is paused
                           (the queue's target reads no KEYS[3])
    KEYS[4] events   stream  the queue's events: a change is recorded as a
                           "paused" event when ARGV[6] is "1"
    KEYS[5] wakes    stream  the queue's wake-up (includes/wake.lua): a
                           resume adds an entry when ARGV[5] is not empty
    ARGV[1] target: "queue" or "group"
    ARGV[2] "pause" or "resume"
    ARGV[3] the group's name (target "group"), else ""
    ARGV[4] the queue's pause mode (target "queue", "pause"): "refuse" or
      "hold"
    ARGV[5] the channel announcing new messages: a resume publishes on it
      so that waiting consumers fetch at once, or ""
    ARGV[6] "1": record a change in KEYS[4] (the events setting names
      "paused"), else nothing is recorded
    ARGV[7] now in ms for the event's time, or "" for the server's
      (includes/read_now.lua)
  Output:
    { changed (0/1), state } state the target's state after the call: ""
    (running), "paused" (a group), "refuse" or "hold" (a queue)
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  a target, action or mode not among those above
    RQ_NOT_MEMBER    target "group": the queue has no such group
  Runs over maxmemory too: a queue on hold can fill Redis, and its resume
  is what lets consumers drain it.
]]
--@flags allow-oom
--@include read_now
--@include wake
local rcall = redis.call
local metaKey, floorsKey, groupKey = KEYS[1], KEYS[2], KEYS[3]
local target, action, groupName, mode, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if action ~= 'pause' and action ~= 'resume' then
  return redis.error_reply('RQ_BAD_ARGUMENT the action (ARGV[2]) must be pause or resume, not ' .. tostring(action))
end
local changed = 0
local state = ''
if target == 'group' then
  if rcall('HEXISTS', floorsKey, groupName) == 0 then
    return redis.error_reply('RQ_NOT_MEMBER group ' .. tostring(groupName) .. ' does not exist')
  end
  local was = rcall('HGET', groupKey, 'paused')
  if action == 'pause' then
    state = 'paused'
    if not was then
      rcall('HSET', groupKey, 'paused', '1')
      changed = 1
    end
  elseif was then
    rcall('HDEL', groupKey, 'paused')
    changed = 1
  end
elseif target == 'queue' then
  local was = rcall('HGET', metaKey, 'paused')
  if action == 'pause' then
    if mode ~= 'refuse' and mode ~= 'hold' then
      return redis.error_reply('RQ_BAD_ARGUMENT the pause mode (ARGV[4]) must be refuse or hold, not ' .. tostring(mode))
    end
    state = mode
    local value = mode
    if mode == 'hold' then
      -- A hold that replaces a hold keeps its seq: what it held stays held.
      local held = was and string.match(was, '^hold:(%d+)$')
      value = 'hold:' .. (held or rcall('HGET', metaKey, 'seq') or '0')
    end
    if was ~= value then
      rcall('HSET', metaKey, 'paused', value)
      changed = 1
    end
  elseif was then
    rcall('HDEL', metaKey, 'paused')
    changed = 1
  end
else
  return redis.error_reply('RQ_BAD_ARGUMENT the target (ARGV[1]) must be queue or group, not ' .. tostring(target))
end
if changed == 1 and ARGV[6] == '1' and KEYS[4] then
  -- As includes/record_event.lua writes its entries (reason: what changed).
  local what = action == 'pause' and ('paused' .. (state ~= 'paused' and (' (' .. state .. ')') or '')) or 'resumed'
  local _, nowText = readNow(ARGV[7])
  rcall('XADD', KEYS[4], 'MAXLEN', '~', 10000, '*', 'event', 'paused', 'group', target == 'group' and groupName or '',
    'seq', '', 'reason', what, 'at', nowText, 'dlq_seq', '')
end
if action == 'resume' and changed == 1 and channel ~= '' then
  -- Only a wake-up hint: consumers poll as well. A paused group's fetch
  -- sets no "wake" (it returns before), so the entry is added whatever it says.
  local last = rcall('HGET', metaKey, 'seq') or '0'
  redis.pcall('PUBLISH', channel, last)
  if KEYS[5] then
    wakeWaiters(metaKey, KEYS[5], last)
  end
end
return {changed, state}
