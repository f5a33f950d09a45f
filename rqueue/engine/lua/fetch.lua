--[[
  Claims up to n deliveries for one consumer of a group.

  Order: expired leases are first turned into redeliveries (or dead letters),
  due delayed messages become ready, then ready redeliveries are handed out
  lowest seq first, then new messages from the group's cursor. Holds the
  group's max_inflight and the consumer's prefetch. The delivery count and
  the lease deadline are written in this same call.

  A paused group (group hash field "paused", pause.lua) acks the tags and
  records the beat, and does nothing else: no delivery, no lease taken back.
  A queue on hold (meta field "paused" = "hold:<seq>") hands out no message
  published after <seq>; redeliveries go on.

  Messages published with an ordering key (in the priority log as
  "<seq>:k:<key>") are handed out after the priority messages and before
  the scan of new ones: per key in seq order, at most key_concurrency
  deliveries of a key not yet settled, keys served least recently served
  first (KEYS[21..24]; docs/flow-control.md, "Ordering keys").

  A call sent a negative n (below) that hands out nothing may make its
  consumer the queue's waiter: the one consumer that waits in Redis for the
  queue's wake-up (XREAD on its wake stream, includes/wake.lua). It is so
  when the meta field "wake" names no waiter, this consumer, or a waiter
  whose time ran out; the call then writes "<group> <consumer> <until_ms>"
  there (names hold no whitespace), until_ms being WAITER_MS after now, and
  says so in its reply. The next
  publish, seeing the field, adds the wake-up and clears it. Every other
  idle consumer waits on the wake-up channel, so a publish wakes at most
  one consumer inside Redis, whose fetch runs before the publisher's reply
  is written.

  Tags given after n are acknowledged first, leniently, exactly as ack.lua
  with strict "0" would (the previous batch of a worker settled in the same
  call as its next fetch), so that they free prefetch room for this fetch.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua), and KEYS[25]
      the side hash for a stream log (sideKey there); KEYS[1..17]
      alone for a queue that never had a priority or keyed message (meta
      field "prio"), by a call without a rate limit or ordering key
      settings in ARGV[9]: a plain fetch is spared the other keys' cost
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] n, the most deliveries to return; sent as -n by a consumer that
      waits in Redis for the queue's wake-up when idle (wait_in_redis),
      when its caller waits for news if the call brings nothing: a call
      that hands out nothing then may make it the queue's waiter (above)
    ARGV[9] the token of this call's deliveries: a lowercase letter, then
      lowercase letters and digits, 32 at most, that the client draws at
      random for each call, part of every tag it makes
      (includes/delivery_state.lua); followed by ":<limit>:<period_ms>"
      when the group has a rate limit: at most <limit> deliveries in any
      <period_ms> ms (KEYS[20] holds those inside the window). A call held
      back by it hands out nothing and its next due time is when the
      window has room again. Or followed by
      ":<limit>:<period_ms>:<key_concurrency>:<key_limit>:<key_period_ms>"
      when the group's ordering keys are set otherwise than the default
      (limit 0: no group limit; key_concurrency >= 1; key_limit 0: no
      per-key limit)
    ARGV[10], ARGV[11], ... seq1, count1, token1, seq2, ... tags to ack
      first (none: a plain fetch)
  Output:
    { now_ms, next_due_ms or "", incarnation, last_seq, floor, generation,
      status1, ..., statusK, seq1, count1, record1, seq2, ... }
    where a call sent -n that made its consumer the queue's waiter (it
    handed out nothing) gives "w<next_due_ms>" or "w" for next_due_ms
    the queue's incarnation (meta field "inc", "" when none) and last seq,
    by which a client tells that Redis lost state (the incarnation changed,
    or the last seq went back); the group's ack floor after this call's
    acks and its generation (group hash field "gen",
    includes/group_generation.lua; 0 when none), both as stored (the client
    reads one that is not a number as none), by which a client tells that
    Redis lost acks (the floor went back within a generation: a failover
    to a replica that missed them); one status per tag to ack, in order
    ("ok" or the code of that tag, as ack.lua), then the deliveries. A count is
    "<count>^<earlier>" for a replayed dead letter: <earlier> deliveries
    came before its replay (includes/delivery_state.lua). next_due_ms is the earliest time a waiting
    message becomes due, given only when nothing was delivered, so that an
    idle client can sleep; it is now_ms when the call stopped at its bound
    of messages passed over (delayed, or settled meanwhile) with more to
    look at, so that the client asks again at once.
  Errors:
    RQ_LAYOUT      KEYS[2] is the log key of the other layout than the
                   queue's (includes/layout.lua): nothing is changed
    RQ_FLOW_KEYS   sent KEYS[1..17] for a queue with meta field "prio"
                   (or KEYS[1..24] for one with a stream log): nothing is
                   changed; call again with KEYS[1..24] (KEYS[1..25])
    RQ_NOT_MEMBER  the consumer is not in the group (never joined, or
                   removed); nothing is changed, the tags are not acked
    RQ_CORRUPT     a key is damaged, named with what is wrong; nothing is
                   handed out. Before any delivery: the cursor is below the
                   ack floor, or it or the floor is not a seq, or it is
                   missing while the group has acked runs or delivery
                   states. From the scan
                   of new messages (what it passed stays passed; a call
                   that hands out deliveries returns them, and the next one
                   is refused): the last seq is missing (a deleted meta
                   hash) or below the cursor, or the cursor is below a run
                   the group settled. With nothing to hand out and no tags
                   to ack: the consumers hold more (or fewer) deliveries than
                   the lease set has leases (a deleted lease). A damaged
                   message costs only itself instead: a record that does not
                   parse or is missing, or a lease whose state is missing or
                   does not parse, is dead-lettered (corrupted-record,
                   missing-record, corrupted-state)
    RQ_BAD_ARGUMENT  the token (ARGV[9]) is not of that form: nothing
                   is changed; or the failure policy (ARGV[7]) does not
                   parse: it is read only when a delivery fails, before that
                   delivery is changed, but after the tags were acked and
                   the beat
]]
--@layout stream
--[[
  Stream text: the reply has a seventh field after generation, before the
  statuses, the call field: "<first seq>:<last seq>" when this call wrote
  a call record (includes/call_state.lua), whose deliveries are the
  count-1 ones of those seqs, by which the client acks them as ranges
  (includes/ack_ranges.lua); "" otherwise. The tags to ack may open with
  such ranges, as ack.lua's. The call field ends in
  "/<index>:<first seq>:<last seq>" when the call claimed those seqs (every
  one of them, in order, a first delivery) without reading their records:
  the reply leaves them out (the deliveries after them start at the reply's
  0-based <index>), and the client reads their records from the log itself
  and puts their triples at <index>. The
  plain keys of a stream log are KEYS[1..17], the call keys and KEYS[21]
  the queue's schedule of delayed publishes (<base>:sched, zset seq ->
  not-before ms), by which fetch claims only while no delayed publish is
  still to come.
]]
--@end
--@flags allow-oom
--@include log
--@include layout
--@include group_keys
--@include group_names
--@include group_args
--@include beat
--@include record_head
--@include bulk
--@include bulk_get
--@include settle
--@layout stream
-- Call records (a stream log's first deliveries from the cursor): made on
-- the paths that meet them.
--@lazy callPaths call_state call_ack
--@end
-- What only a failure, a redelivery or a late ack needs is made on those
-- paths, where --@make failurePaths stands: most fetches take none of them.
--@lazy failurePaths delivery_state record_event dead_letter dead_letter_corrupt_state retry_or_dead_letter

-- Strings, as is nowText (includes/read_now.lua): redis.call formats every
-- number it is handed with sprintf, a good part of the cost of a small
-- command; string.format('%d') is cheaper than tostring() where one is made.
local EXPIRE_BATCH = '1000' -- expired leases handled per call
local PROMOTE_BATCH = '1000' -- due delayed messages made ready per call
local SCAN_LIMIT = 1000 -- records passed over per call (deleted or delayed)
-- The group hash's field holding the cursor as fetch last wrote or checked it.
local CURSOR_CHECKED = 'cursor_checked'
-- How long a consumer stays the queue's waiter (ms): more than a wait in
-- Redis lasts (IDLE_POLL_INTERVAL, 0.5 s), as the fetch that ends the wait
-- claims the role again; a waiter that died frees it after this.
local WAITER_MS = 1000

local n = ARGV[8] + 0
local marks = n < 0 -- the consumer waits in Redis when this call finds nothing
if marks then
  n = -n
end
-- Makes this call's consumer the queue's waiter when the role is free
-- (above); the reply's next_due_ms, prefixed with "w", says so. "wake" is
-- the meta field as read. A role that does not parse, or runs out further
-- ahead than WAITER_MS (a damaged field, a clock set back), is free: the
-- worst a bad field can do is one more waiter. A hint (pcall): where Redis
-- refuses the write (over maxmemory on a server that ignores the allow-oom
-- flag), the consumer waits on the channel. Made only for a call that
-- may claim: a function is built anew by every call that reaches its
-- definition.
local claimWaiter = marks and function(out, wake)
  local me = groupName .. ' ' .. consumerName
  if wake then
    local holder, untilMs = string.match(wake, '^(.*) (%d+)$')
    untilMs = tonumber(untilMs or '')
    if holder ~= me and untilMs and untilMs > now and untilMs <= now + WAITER_MS then
      return
    end
  end
  local claimed = redis.pcall('HSET', metaKey, 'wake', me .. ' ' .. string.format('%d', now + WAITER_MS))
  if type(claimed) == 'number' then
    out[2] = out[2] == '' and 'w' or 'w' .. string.format('%d', out[2])
  end
end
local token = ARGV[9]
-- The group's rate limit, when it has one, follows the token: found only
-- where the token alone does not match, so a fetch without one pays nothing.
local rateLimit, ratePeriod = nil, nil
-- Ordering keys: at most keyConcurrency deliveries of a key unsettled, and
-- at most keyRateLimit of a key in any keyRatePeriod ms (nil: no limit).
local keyConcurrency, keyRateLimit, keyRatePeriod = 1, nil, nil
if token == nil or #token > 32 or not string.find(token, '^%l[%l%d]*$') then
  local t, limit, period = string.match(token or '', '^(%l[%l%d]*):(%d+):(%d+)$')
  local ok = t and #t <= 32 and limit + 0 > 0 and period + 0 > 0
  if not t then
    local kc, kl, kp
    t, limit, period, kc, kl, kp = string.match(token or '', '^(%l[%l%d]*):(%d+):(%d+):(%d+):(%d+):(%d+)$')
    ok = t and #t <= 32 and period + 0 > 0 and kc + 0 > 0 and kp + 0 > 0
    if ok then
      keyConcurrency = kc + 0
      if kl + 0 > 0 then
        keyRateLimit, keyRatePeriod = kl + 0, kp + 0
      end
    end
  end
  if not ok then
    return redis.error_reply('RQ_BAD_ARGUMENT the token (ARGV[9]) must be a letter, then letters and digits, '
      .. 'at most 32 in all, optionally followed by :<rate_limit>:<rate_period_ms> (both >= 1) or by '
      .. ':<rate_limit>:<rate_period_ms>:<key_concurrency>:<key_rate_limit>:<key_rate_period_ms> (periods and '
      .. 'key_concurrency >= 1), not ' .. tostring(token))
  end
  token = t
  if limit + 0 > 0 then
    rateLimit, ratePeriod = limit + 0, period + 0
  end
  if not keyFlightKey then
    return redis.error_reply('RQ_BAD_ARGUMENT a rate limit or ordering key settings (ARGV[9]) need KEYS[1..24], '
      .. 'sent ' .. #KEYS .. ' keys')
  end
end

-- What this consumer holds; false when it is not a member.
local holding = rcall('HGET', consumersKey, consumerName)
if not holding then
  return redis.error_reply('RQ_NOT_MEMBER consumer ' .. consumerName .. ' is not a member of group ' .. groupName)
end
-- The cursor is read here with the liveness: no step before the scan of new
-- messages moves it.
-- "paused" (pause.lua) is read with them: a field more of a read the call
-- makes anyway is what flow control costs a fetch of a plain group.
--@layout hash
local groupFields = rcall('HMGET', groupKey, 'live:' .. consumerName, 'cursor', CURSOR_CHECKED, 'paused', 'gen')
--@end
--@layout stream
local groupFields = callsKey
  and rcall('HMGET', groupKey, 'live:' .. consumerName, 'cursor', CURSOR_CHECKED, 'paused', 'gen', 'callout')
  or rcall('HMGET', groupKey, 'live:' .. consumerName, 'cursor', CURSOR_CHECKED, 'paused', 'gen')
--@end
-- The incarnation and the last seq, for the client's check that Redis kept
-- its state; no step of a fetch changes either. And the queue's pause, and
-- "swept": set while deleting what the trim point passed lags it.
local metaFields = rcall('HMGET', metaKey, 'inc', 'seq', 'paused', 'prio', 'wake', 'layout', 'swept')
local lastSeq = tonumber(metaFields[2] or '0')
local wrongLayout = layoutError(metaKey, msgsKey, metaFields[6], metaFields[2])
if wrongLayout then
  return wrongLayout
end
-- A group's join writes the incarnation, and a publish the last seq: a
-- group whose queue has neither while records are stored lost its meta
-- hash (deleted), and with it the flags that say where messages are (a
-- small fetch reads the records before the last seq, and a scan without
-- "prio" would hand out again a priority message acked apart from the
-- cursor). The doctor's repair writes the last seq and the flags again.
if not metaFields[1] and not metaFields[2] and groupFields[2] and logAny(msgsKey) then
  return redis.error_reply('RQ_CORRUPT ' .. metaKey .. ' fields inc and seq are missing (the hash was deleted) while '
    .. groupKey .. ' and ' .. msgsKey .. ' hold state; `rqueue doctor --repair` writes them again')
end
-- A queue that had a priority or keyed message needs the flow-control keys:
-- a client sends the short layout (KEYS[1..17]) until told, here, before
-- any write.
if metaFields[4] and (not keyFlightKey or not sideKey and metaFields[6] == 'stream') then
  return redis.error_reply('RQ_FLOW_KEYS the queue has priority or keyed messages: fetch needs KEYS[1..24] '
    .. '(KEYS[1..25] for a stream log)')
end
-- Acks come before any other write: Redis refuses a script over maxmemory
-- at its first write that may grow memory, unless it already wrote. An
-- ack's first write (ZREM) frees memory, so acks get through when Redis is
-- full, as they would alone.
local acked = {}
if #ARGV > 9 then
  -- Included here, in the one block that uses them: a function is built
  -- anew by every call that reaches its definition, and most fetches carry
  -- no acks (a worker's, one).
--@include ack_held_one
  acked = ackHeldOne(10)
  if acked == nil then
    --@make failurePaths
--@include ack_tags
    acked = ackTags(false, 10)
  end
  holding = rcall('HGET', consumersKey, consumerName)
end
-- A fetch goes on with a lagging deletion (includes/settle_shared.lua)
-- where its acks did not (they settled nothing): an idle queue's settled
-- records go too.
if metaFields[7] and not settledFloor then
  --@make sharedSettling
  local trimmed = tonumber(rcall('HGET', metaKey, 'trimmed') or '0') or 0
  sweep(metaFields[7], trimmed, trimmed)
end
beatWith(groupFields[1])
-- The floor and the generation go back to the client, which tells lost
-- acks from them (rqueue/statewatch.py): the floor as the acks above left
-- it (settledFloor, includes/settle.lua), or read after them.
local generation = groupFields[5] or 0

-- A paused group hands out nothing, and leaves its expired leases where
-- they are: they are taken back by the first fetch after resume, so none
-- goes to anyone before. The acks above and the beat are done.
if groupFields[4] then
  local out = {now, '', metaFields[1] or '', lastSeq, settledFloor or rcall('HGET', floorsKey, groupName), generation}
  --@layout stream
  out[7] = '' -- the call field (above): no call
  --@end
  for _, status in ipairs(acked) do
    out[#out + 1] = status
  end
  if claimWaiter then
    claimWaiter(out, metaFields[5]) -- a resume adds a wake-up (pause.lua)
  end
  out[5] = out[5] or 0 -- no floor field: 0, as everywhere
  return out
end
-- A queue paused with "hold:<seq>" hands out nothing published after seq.
local holdAt = nil
if metaFields[3] then
  holdAt = tonumber(string.match(metaFields[3], '^hold:(%d+)$') or '')
end

-- The in-flight count first: with nothing in flight no lease can have run
-- out, and a consumer that acks before it fetches again asks no more. The
-- expired ones are counted before they are read: a ZCOUNT costs less than
-- a ZRANGEBYSCORE that finds nothing, and most fetches find none.
--@layout hash
local inflight = deliveriesOut()
--@end
--@layout stream
-- The seqs out on calls (a stream log's, includes/call_state.lua), as
-- read above less those this call's acks settled (callsLeft): written back
-- with the cursor by the scan.
local callout = callsKey and (tonumber(groupFields[6] or '0') or 0) - callsLeft
local inflight = deliveriesOut(callout)
-- Calls past their deadline are split into deliveries with a lease each
-- (includes/call_state.lua), which the lease expiry below takes back.
if callsKey and callout > 0 then
  local due = rcall('ZRANGEBYSCORE', callExpKey, '-inf', nowText, 'LIMIT', '0', EXPIRE_BATCH)
  if #due > 0 then
    --@make callPaths
    for _, dueToken in ipairs(due) do
      -- A record that does not parse stays for the doctor (RQ_CORRUPT
      -- there), rather than stop every fetch after this one's acks.
      local _, _, recordGone, firstSeq = pcall(splitCall, dueToken)
      if recordGone then
        -- Its deliveries are handed out to no one again: reported when
        -- their time runs out, not only when someone runs the doctor.
        --@make failurePaths
        recordEvent('corrupt', firstSeq or '', 'call ' .. dueToken .. ' of ' .. callsKey .. ' ran out without its '
          .. 'record (deleted): the deliveries it held, from seq ' .. tostring(firstSeq or '?') .. ', are tracked '
          .. 'by nothing and go to no one again; `rqueue doctor` lists them as untracked')
      end
    end
  end
end
--@end
local expired = {}
if inflight > 0 and rcall('ZCOUNT', leaseKey, '-inf', nowText) > 0 then
  expired = rcall('ZRANGEBYSCORE', leaseKey, '-inf', nowText, 'LIMIT', '0', EXPIRE_BATCH)
end
if #expired > 0 then
  --@make failurePaths
  inflight = nil -- counted again below: expiry takes leases back
end
for _, s in ipairs(expired) do
  local seq = tonumber(s)
  local raw = rcall('HGET', dlvKey, seq)
  local d, corrupt = parseDelivery(seq, raw)
  if corrupt or d == nil then
    -- A lease without a state (deleted) is moved aside as one that does
    -- not parse: its count and holder are gone.
    deadLetterCorruptState(seq, raw)
  else
    retryOrDeadLetter(seq, d, nil, 'lease expired after ' .. ackWait .. ' ms')
    rcall('HINCRBY', groupKey, 'expired', 1)
  end
end

-- Most fetches find nothing waiting: no redelivery, no delayed message. An
-- empty set is no key (Redis deletes it), so one EXISTS stands in for the
-- two reads below. After the expiry above, which may have added to either.
local waiting = rcall('EXISTS', readyKey, delayKey) > 0
if waiting then
  local due = rcall('ZRANGEBYSCORE', delayKey, '-inf', nowText, 'LIMIT', '0', PROMOTE_BATCH)
  for _, s in ipairs(due) do
    rcall('ZADD', readyKey, s, s)
    rcall('ZREM', delayKey, s)
  end
end

-- Compared, not math.min(): a C function call costs more than the rest.
local room = n
local free = maxInflight - (inflight or deliveriesOut())
if free < room then
  room = free
end
if #expired > 0 then
  holding = rcall('HGET', consumersKey, consumerName) -- expiry may have taken some back
end
free = prefetch - (holding or 0)
if free < room then
  room = free
end
-- The rate limit: at most rateLimit deliveries in any ratePeriod ms, kept
-- as the times of the deliveries inside the window (rateKey). Held back,
-- the reply's next due time is when the window has room again.
local rateFree = nil
if rateLimit and room > 0 then
  rcall('ZREMRANGEBYSCORE', rateKey, '-inf', string.format('%d', now - ratePeriod))
  local used = rcall('ZCARD', rateKey)
  if used >= rateLimit then
    local oldest = rcall('ZRANGE', rateKey, '0', '0', 'WITHSCORES')
    rateFree = (tonumber(oldest[2]) or now) + ratePeriod
    room = 0
  elseif rateLimit - used < room then
    room = rateLimit - used
  end
end

-- The ack floor is never above the cursor: a cursor moved back would hand
-- out again what the group settled (and, settled twice, delete it from
-- under another group). Garbage in either is named, not a Lua error.
-- Checked before anything is handed out, so that a refusal strands nothing,
-- and only when the cursor is not the one a fetch last wrote, or checked
-- (CURSOR_CHECKED, written with it). The floor is read for the reply too.
local floorText = nil
if room > 0 and (groupFields[3] ~= groupFields[2] or not groupFields[2]) then
  floorText = rcall('HGET', floorsKey, groupName)
  local floor = tonumber(floorText or '0')
  local cursor = tonumber(groupFields[2] or '0')
  if not (floor and floor >= 0 and floor % 1 == 0) then
    return redis.error_reply('RQ_CORRUPT ' .. floorsKey .. ' field ' .. groupName .. ' (the ack floor) holds '
      .. string.sub(floorText, 1, 40) .. ', not a seq')
  end
  if not (cursor and cursor >= 0 and cursor % 1 == 0) then
    return redis.error_reply('RQ_CORRUPT ' .. groupKey .. ' field cursor holds ' .. string.sub(groupFields[2], 1, 40)
      .. ', not a seq')
  end
  -- In a queue that had priority or keyed messages (meta field "prio") the
  -- floor may pass the cursor: those are settled apart from the scan,
  -- which starts above the floor (below).
  if cursor < floor and not metaFields[4] then
    return redis.error_reply('RQ_CORRUPT ' .. groupKey .. ' field cursor is ' .. (groupFields[2] or 'missing')
      .. ', below the ack floor ' .. floor .. ' (' .. floorsKey .. '): it would hand out settled messages again')
  end
  -- No cursor at all (the group hash was deleted) while the group settled
  -- runs above its floor: a scan from the floor would find their records
  -- (a stream log keeps them, as does a hash log for another group). Or
  -- while it has deliveries: the scan would hand them out again as new,
  -- over their states, while they are held or wait for redelivery.
  if not groupFields[2] then
    if rcall('EXISTS', ackedKey) == 1 then
      return redis.error_reply('RQ_CORRUPT ' .. groupKey .. ' field cursor is missing, while ' .. ackedKey
        .. ' holds runs the group settled: it would hand them out again')
    end
    -- (more fields than the pin, which stays when the last state goes)
    if rcall('HLEN', dlvKey) > rcall('HEXISTS', dlvKey, DLV_PIN_FIELD) then
      return redis.error_reply('RQ_CORRUPT ' .. groupKey .. ' field cursor is missing, while ' .. dlvKey
        .. ' holds deliveries of the group: it would hand them out again as new')
    end
    --@layout stream
    if callsKey and rcall('EXISTS', callsKey) == 1 then
      return redis.error_reply('RQ_CORRUPT ' .. groupKey .. ' field cursor is missing, while ' .. callsKey
        .. ' holds deliveries of the group: it would hand them out again as new')
    end
    --@end
  end
  rcall('HSET', groupKey, CURSOR_CHECKED, groupFields[2] or '0')
end

local out = {now, '', metaFields[1] or '', lastSeq, settledFloor or floorText or rcall('HGET', floorsKey, groupName),
  generation}
--@layout stream
out[7] = '' -- the call field (above): set where a call record is written
--@end
for _, status in ipairs(acked) do
  out[#out + 1] = status
end
local got, redelivered = 0, 0
local leased = {}
local states = {DLV_PIN_FIELD, DLV_PIN_VALUE} -- first: HSET converts the hash before it inserts
-- Built once: every number handed to redis.call is formatted with sprintf
-- again, which costs more than the rest of a delivery.
local deadline = string.format('%d', now + ackWait)

-- The state of every first delivery made by this call.
local firstState = '1:' .. consumerName .. ':' .. nowText .. ':' .. nowText .. ':' .. token

if room > 0 and waiting then
  -- Hands seq to this consumer; field is seq as the string the hashes and the
  -- lease set know it by, d its delivery state, nil when new. Defined here,
  -- where it is used: a closure is made anew by every call that reaches it.
  local function deliver(seq, field, rec, d)
    if recordNotBefore(rec) == nil then
      deadLetter(seq, d, 'corrupted-record', 'record does not parse')
      return
    end
    states[#states + 1] = field
    if d == nil then
      states[#states + 1] = firstState
      d = {count = 1}
    else
      if d.count > 0 then
        redelivered = redelivered + 1 -- a replayed dead letter starts again at 0
      end
      d.count = d.count + 1
      d.holder = consumerName
      d.last = now
      d.token = token
      states[#states + 1] = formatDelivery(d)
      d.replayed = string.match(d.past, '\n(%d+)%^')
    end
    leased[#leased + 1] = field
    out[#out + 1] = seq
    out[#out + 1] = d.replayed and (d.count .. '^' .. d.replayed) or d.count
    out[#out + 1] = rec
    got = got + 1
  end

  local seqs = rcall('ZRANGE', readyKey, '0', room - 1)
  if #seqs > 0 then
    --@make failurePaths
    bulk('ZREM', readyKey, seqs)
    local recs = logReadMany(msgsKey, sideKey, seqs, pinnedKey)
    local raws = bulkGet(dlvKey, seqs)
    for i, s in ipairs(seqs) do
      local seq = tonumber(s)
      local d, corrupt = parseDelivery(seq, raws[i])
      if corrupt then
        deadLetterCorruptState(seq, raws[i])
      elseif recs[i] then
        deliver(seq, s, recs[i], d)
      else
        -- Cannot happen while retention pins what a group still needs: a
        -- dead letter without payload says it was lost (missing-record).
        deadLetter(seq, d, 'redelivery', 'record deleted while the group still needed it')
      end
    end
  end
end

-- Messages published with a priority (meta field "prio", written by the
-- first such publish): what is new in the queue's priority log joins this
-- group's priority set, which hands out the highest priority first, then
-- the lowest seq; the scan of new messages below passes over them. A queue
-- that never had one reads a field more of the meta hash, nothing else.
local fromPrioritySet = nil -- fields this call handed out from the priority set or a key's queue
-- True when a step below stopped at its bound per call with room left and
-- more to look at (delayed or settled messages passed over): the reply's
-- next due time is then now, so that the client asks again at once rather
-- than after its idle poll. Else messages behind many delayed ones would
-- wait one poll per bound's worth.
local morePassed = false
local pickCut = false -- the priority set's pick stopped at its bound
if got < room and metaFields[4] then
  fromPrioritySet = {}
  -- (Locals of this block, as the main chunk's are near Lua's 200.)
  local PULL_BATCH = '1000' -- entries of the priority log moved to the group's priority set per call
  local PICK_ROUNDS = 100 -- picks from the priority set per call, when the picked ones are passed over
  -- A priority set's score is seq - priority x PRIORITY_SPAN (2^45, above any
  -- seq): the highest priority first, then the lowest seq, exact in a double.
  local PRIORITY_SPAN = 35184372088832
  local pulledTo = tonumber(rcall('HGET', groupKey, 'pcur') or '')
  if pulledTo == nil then
    -- A group's first pull: everything above its ack floor is new to it.
    pulledTo = tonumber(rcall('HGET', floorsKey, groupName) or '0') or 0
  end
  local upper = '+inf'
  if holdAt then
    upper = string.format('%d', holdAt)
  end
  --@layout stream
  if sideKey then
    -- No group needs a record at or below the trim point (the lowest ack
    -- floor, or in retention mode the trim step's point), and the
    -- priority log lists every seq with a side record: those it lists
    -- there go from both, PULL_BATCH a call, so that a trim point that
    -- jumps far is caught up over the fetches after it. A seq reopened by
    -- replay keeps its record beside the pins (includes/log.lua).
    local trimmedTo = rcall('HGET', metaKey, 'trimmed')
    if trimmedTo then
      local passedLog = rcall('ZRANGEBYSCORE', prioKey, '-inf', trimmedTo, 'WITHSCORES', 'LIMIT', '0', PULL_BATCH)
      if #passedLog > 0 then
        local fields = {}
        for i = 2, #passedLog, 2 do
          fields[#fields + 1] = passedLog[i]
        end
        bulk('HDEL', sideKey, fields)
        rcall('ZREMRANGEBYSCORE', prioKey, '-inf', passedLog[#passedLog])
      end
    end
  end
  --@end
  local pulled = rcall('ZRANGEBYSCORE', prioKey, '(' .. string.format('%d', pulledTo), upper, 'WITHSCORES', 'LIMIT',
    '0', PULL_BATCH)
  morePassed = #pulled == 2 * tonumber(PULL_BATCH)
  if #pulled > 0 then
    local adds, keyed, newKeys = {}, {}, {}
    for i = 1, #pulled, 2 do
      local key = string.match(pulled[i], '^%d+:k:(.+)$')
      if key then
        -- An ordering key's message: to the group's key queue, in key then
        -- seq order, and its key a candidate to hand out (below).
        keyed[#keyed + 1] = '0'
        keyed[#keyed + 1] = key .. ' ' .. string.format('%016d', pulled[i + 1])
        if not newKeys[key] then
          newKeys[key] = true
          newKeys[#newKeys + 1] = key
        end
      else
        -- A member whose priority does not parse counts as priority 1: it is
        -- handed out all the same, never passed over.
        local p = tonumber(string.match(pulled[i], ':(%d)$') or '1')
        adds[#adds + 1] = pulled[i + 1] - p * PRIORITY_SPAN
        adds[#adds + 1] = pulled[i + 1]
      end
    end
    bulk('ZADD', prioSetKey, adds)
    if #keyed > 0 then
      bulk('ZADD', keyQueueKey, keyed)
      -- A key new to the ready set joins at its back; one already there
      -- keeps its turn. One busy to its limit is dropped by the pick.
      local top = rcall('ZRANGE', keyReadyKey, '-1', '-1', 'WITHSCORES')
      local turn = (tonumber(top[2]) or 0) + 1
      for i = 1, #newKeys, 500 do
        local ready = {}
        for j = i, math.min(i + 499, #newKeys) do
          ready[#ready + 1] = turn
          ready[#ready + 1] = newKeys[j]
        end
        rcall('ZADD', keyReadyKey, 'NX', unpack(ready))
      end
    end
    rcall('HSET', groupKey, 'pcur', pulled[#pulled])
    -- The log keeps its entries as long as their records: those at or
    -- below the trim point go (the lowest ack floor, or in retention mode
    -- the trim step's point), so a reset back pulls what it may hand out
    -- again with its priority. A stream log's go with their side records
    -- (above).
    local trimmedTo = tonumber(rcall('HGET', metaKey, 'trimmed') or '0')
    if trimmedTo and trimmedTo > 0 and not sideKey then
      rcall('ZREMRANGEBYSCORE', prioKey, '-inf', string.format('%d', trimmedTo))
    end
  end
  -- Picks until the room is filled: a delayed message picked is parked in
  -- the delay set and the next ones are picked, up to SCAN_LIMIT passed
  -- over or PICK_ROUNDS picks (a fetch of one picks one at a time).
  local prioPassed, rounds = 0, 0
  while got < room do
    if prioPassed >= SCAN_LIMIT or rounds >= PICK_ROUNDS then
      -- Lower priorities (ordering keys, the scan) wait for the next call,
      -- which the client sends at once.
      if rcall('ZCARD', prioSetKey) > 0 then
        morePassed, pickCut = true, true
      end
      break
    end
    local picked = rcall('ZRANGE', prioSetKey, '0', math.min(room - got, SCAN_LIMIT - prioPassed) - 1)
    if #picked == 0 then
      break
    end
    rounds = rounds + 1
    local gotBefore = got
    bulk('ZREM', prioSetKey, picked)
    --@layout stream
    local recs = sideKey and logReadFlow(msgsKey, sideKey, picked, pinnedKey)
      or logReadMany(msgsKey, sideKey, picked, pinnedKey)
    --@end
    --@layout hash
    local recs = logReadMany(msgsKey, nil, picked, pinnedKey)
    --@end
    -- Settled meanwhile (a purge, settle_through) or handed out another way
    -- (a delivery state exists): not handed out again.
    local raws = bulkGet(dlvKey, picked)
    local prioFloor = tonumber(rcall('HGET', floorsKey, groupName) or '0') or 0
    local runsExist = rcall('EXISTS', ackedKey) == 1
    local prioSince, prioGone = nil, {}
    for i, field in ipairs(picked) do
      local seq = field + 0
      local settledAlready = seq <= prioFloor or raws[i]
      if not settledAlready and runsExist then
        local run = rcall('ZRANGEBYSCORE', ackedKey, field, '+inf', 'LIMIT', '0', '1')
        settledAlready = run[1] ~= nil and run[1] + 0 <= seq
      end
      if not settledAlready and not recs[i] then
        -- As the scan of new messages judges a missing record: deleted as
        -- settled (includes/missing_record.lua), nothing to deliver, and
        -- settled for this group.
        prioSince = prioSince or tonumber(rcall('HGET', groupKey, 'since') or '') or 0
        if seq <= prioSince and (string.byte(msgsKey, -1) ~= LOG_STREAM_BYTE
          or rcall('HEXISTS', metaKey, 'gaps') == 1
          and seq <= (tonumber(rcall('HGET', metaKey, 'gaps_to') or '') or math.huge)) then
          prioGone[#prioGone + 1] = seq
          settledAlready = true
        end
      end
      local notBefore = recs[i] and recordNotBefore(recs[i])
      if settledAlready then
        -- nothing to hand out
      elseif not notBefore then
        --@make failurePaths
        if recs[i] then
          deadLetter(seq, nil, 'corrupted-record', 'record does not parse')
        else
          deadLetter(seq, nil, 'new message', 'record deleted before the group read it') -- missing-record
        end
      elseif notBefore > now then
        rcall('ZADD', delayKey, notBefore, field)
      else
        states[#states + 1] = field
        states[#states + 1] = firstState
        leased[#leased + 1] = field
        fromPrioritySet[#fromPrioritySet + 1] = field
        out[#out + 1] = seq
        out[#out + 1] = 1
        out[#out + 1] = recs[i]
        got = got + 1
      end
    end
    if #prioGone > 0 then
      settleMany(prioGone)
    end
    prioPassed = prioPassed + #picked - (got - gotBefore)
  end
end

-- Messages of ordering keys (in the priority log as "<seq>:k:<key>", moved
-- to the group's key queue by the pull above).
local keyNextDue = nil -- when a key held back by its rate limit or a delay may go
if got < room and not pickCut and metaFields[4] and rcall('EXISTS', keyReadyKey, keyBusyKey) > 0 then
--@include ordering_keys
end

if got < room and not pickCut then
  local SPECULATE_MAX = 8 -- deliveries wanted up to which records are read before the last seq
  -- A seq >= 100 as its hundreds and two digits (the claim's look-up in
  -- the schedule, the scan's reads); included here, as the main chunk is
  -- near Lua's limit of 200 locals
--@include two_digits
  --@layout stream
  -- Fewest first deliveries from the cursor for which the scan writes a
  -- call record (includes/call_state.lua; measured by benchmarks/icount.py,
  -- docs/layout-d-plan.md): below it, a state and a lease per seq cost
  -- less than the record and its ack.
  local CALL_MIN = 16
  -- Most seqs on one call record: an ack of one rewrites its record, so its
  -- cost grows with the record; the rest of a larger fetch takes the
  -- per-message path.
  local CALL_MAX = 128
  -- Fewest first deliveries the scan claims without reading their records
  -- (below): under it the client's second round trip costs one consumer
  -- more than Redis saves (benchmarks/prototypes/two_round_fetch/NOTES.md).
  local CLAIM_MIN = 32
  --@end
  local cursor = (groupFields[2] or 0) + 0
  local from = cursor
  local cursorText = nil -- cursor as the field string it was last read as
  if metaFields[4] then
    -- Settling a priority or keyed message (the acks of this call, too) may
    -- take the floor past the cursor read above: the scan starts at the
    -- floor, as every seq up to it is settled, and the log may have
    -- dropped those seqs (includes/settle.lua moves the stored cursor).
    local floorNow = tonumber(rcall('HGET', floorsKey, groupName) or '0') or 0
    if floorNow > cursor then
      cursor, cursorText = floorNow, string.format('%d', floorNow)
    end
  end
  -- The last seq bounds the scan. A small fetch reads the records first
  -- and the last seq only when one is missing (gone, or not published
  -- yet): a fetch of one message that is there is one call less.
  local last = nil
  if room - got > SPECULATE_MAX then
    last = lastSeq
  end
  if holdAt and holdAt < lastSeq then
    last = math.max(holdAt, from)
  elseif holdAt then
    last = lastSeq
  end
  -- What the scan found wrong (RQ_CORRUPT): it stops there, keeps what it
  -- did, and the call is refused when it hands out nothing, else the next
  -- call is. A last seq that is garbage, below what the group read, or
  -- gone with the meta hash while records are stored, would let a publish
  -- reuse seqs.
  local refusal = nil
  -- Judged by the last seq itself, not by a hold's bound: a hold that began
  -- on an empty queue bounds the scan at 0 while records are stored.
  local judged = last
  if holdAt then
    judged = lastSeq or last
  end
  if judged ~= nil and (judged < from or judged == 0 and logAny(msgsKey)) then
    refusal = metaKey .. ' field seq (the last seq) is ' .. (rcall('HGET', metaKey, 'seq') or 'missing')
      .. ', below the cursor ' .. from .. ' of ' .. groupKey .. ' or the records stored'
    last = cursor
  end
  local since = nil -- the last seq when the group was created, read at the first missing record
  local passed = 0
  --@layout stream
  -- A scan that may take CALL_MIN first deliveries or more writes them as
  -- one call record (includes/call_state.lua): their seqs gather here, and
  -- go to the per-message path below when fewer were taken. Not with a
  -- rate limit, whose window counts deliveries.
  local scanned = nil
  if callsKey and not rateLimit and room - got >= CALL_MIN then
    scanned = {}
  end
  -- The claim: CLAIM_MIN or more first deliveries from the cursor are taken
  -- without reading their records, and the client reads those records with
  -- one XRANGE of its own (rqueue/engine/commands.py, fill_claimed): their
  -- copy into Lua and into the reply is most of what a large fetch costs
  -- Redis. Only where the scan would hand out each of them as it stands: no
  -- stubs (meta "prio"), no seq of the claim whose time is still to come
  -- (the schedule, KEYS[21], which a plain fetch alone is sent: unscheduled
  -- below), nothing
  -- refused, and no seq above the cursor that may lack its entry by right:
  -- the scan passes over a record missing at or below the group's since
  -- (deleted before the group was made), and in the stream layout a seq
  -- above the trim point lacks its entry only where entries were deleted
  -- one by one, which meta field "gaps" says (a migration from the hash
  -- layout, a replay or purge of dead letters, a repaired meta hash): there
  -- the cursor must be at or past since, or past "gaps_to", the last seq
  -- that may lack its entry, where it holds one. A claimed seq without an entry is
  -- set aside by the client and dead-lettered (set_aside.lua:
  -- missing-record), as the scan would. The seqs join the call record as
  -- the scan's would.
  local claimed = nil -- the reply's claim part: "/<index of the first seq>:<first seq>:<last seq>"
  -- Whether no seq from lo to hi waits in the schedule for a time after
  -- now (a delayed publish): a delayed record is never claimed before its
  -- time. The seqs are looked up only while the schedule holds such a
  -- time: delayed messages the cursor has passed (in the group's delay
  -- set by now) leave the claim to the seqs above them. When fewer seqs
  -- wait than the claim would take, the waiting ones are read instead
  -- (at most CALL_MAX): a schedule of up to 128 entries is a listpack,
  -- where each ZMSCORE lookup scans the whole set. A Redis that
  -- refuses ZMSCORE (an ACL rule older than docs/ACL.md's, a server
  -- before 6.2) leaves the seqs to the scan, which reads their records.
  local function unscheduled(lo, hi)
    local toCome = rcall('ZCOUNT', KEYS[21], '(' .. nowText, '+inf')
    if toCome == 0 then
      return true
    end
    if toCome <= hi - lo + 1 then
      for _, member in ipairs(rcall('ZRANGEBYSCORE', KEYS[21], '(' .. nowText, '+inf')) do
        local s = tonumber(member)
        if s and s >= lo and s <= hi then
          return false
        end
      end
      return true
    end
    -- As text: redis.call makes a number a string with a sprintf each.
    local seqs, digits, hundreds, prefix = {}, twoDigits(), nil, nil
    for s = lo, hi do
      local h = math.floor(s / 100)
      if h ~= hundreds then
        hundreds, prefix = h, h > 0 and tostring(h) or ''
      end
      seqs[s - lo + 1] = prefix .. (h > 0 and digits[s - h * 100 + 1] or tostring(s))
    end
    local scores = redis.pcall('ZMSCORE', KEYS[21], unpack(seqs))
    if scores.err then
      return false
    end
    for _, at in ipairs(scores) do
      if at and tonumber(at) > now then
        return false
      end
    end
    return true
  end
  -- (A fetch of CLAIM_MIN knows the last seq already, SPECULATE_MAX being less.)
  local top = last or lastSeq
  local upTo = top and cursor + math.min(room - got, top - cursor, CALL_MAX)
  if scanned and not refusal and not metaFields[4] and top ~= nil and top - cursor >= CLAIM_MIN
    and room - got >= CLAIM_MIN and KEYS[21] == string.sub(msgsKey, 1, -4) .. 'sched'
    and (rcall('HEXISTS', metaKey, 'gaps') == 0 or cursor >= math.min(
      tonumber(rcall('HGET', groupKey, 'since') or '') or top,
      tonumber(rcall('HGET', metaKey, 'gaps_to') or '') or math.huge))
    and unscheduled(cursor + 1, upTo) then
    last = top
    claimed = '/' .. #out .. ':' .. string.format('%d', cursor + 1) .. ':' .. string.format('%d', upTo)
    -- The claimed deliveries are not in the reply: the claim field says
    -- them whole (seq after seq, each a first delivery), and the client
    -- makes their triples from it and the log's entries.
    -- Appends by a counter: # on a growing table searches its bounds each time.
    local ns = #scanned
    for s = cursor + 1, upTo do
      ns = ns + 1
      scanned[ns] = s
    end
    got = got + (upTo - cursor)
    cursor, cursorText = upTo, string.format('%d', upTo)
  end
  --@end
  local gone = {}
  while got < room and (last == nil or cursor < last) and passed < SCAN_LIMIT do
    local want = room - got
    if last ~= nil then
      want = math.min(want, last - cursor)
    end
    local fields = {}
    if want < 16 or cursor < 100 then
      for s = cursor + 1, cursor + want do
        fields[s - cursor] = string.format('%d', s)
      end
    else
      local digits = twoDigits()
      local hundreds, prefix = nil, nil
      for s = cursor + 1, cursor + want do
        local h = math.floor(s / 100)
        if h ~= hundreds then
          hundreds, prefix = h, tostring(h)
        end
        fields[s - cursor] = prefix .. digits[s - h * 100 + 1]
      end
    end
    -- Seqs published with a priority are handed out from the priority set
    -- above, not here: the scan passes over them without reading them.
    local prioritized = nil
    local recs
    local inLog = metaFields[4] and rcall('ZRANGEBYSCORE', prioKey, fields[1], fields[#fields])
    if inLog and (#inLog > 0 or rcall('EXISTS', prioKey) == 0) then
      prioritized = {}
      for _, m in ipairs(inLog) do
        prioritized[string.match(m, '^(%d+)') or m] = true
      end
      if #inLog == 0 then
        -- The log is gone (a deleted key): a seq with a delivery state, or
        -- handed out from the priority set by this call, came from the
        -- priority set and is passed over too, rather than handed out twice.
        for _, field in ipairs(fromPrioritySet or {}) do
          prioritized[field] = true
        end
        for i, state in ipairs(bulkGet(dlvKey, fields)) do
          if state then
            prioritized[fields[i]] = true
          end
        end
        -- And so is a seq in a run the group settled above its cursor:
        -- only the priority set hands out above the cursor, so it was
        -- handed out from there and settled (its delivery state is gone).
        local top = cursor + #fields
        local runs = rcall('ZRANGEBYSCORE', ackedKey, fields[1], '+inf', 'WITHSCORES', 'LIMIT', '0', #fields)
        for r = 1, #runs, 2 do
          local first = runs[r] + 0
          if first > top then
            break
          end
          for s = math.max(first, cursor + 1), math.min(runs[r + 1] + 0, top) do
            prioritized[string.format('%d', s)] = true
          end
        end
      end
      local read = {}
      for _, field in ipairs(fields) do
        if not prioritized[field] then
          read[#read + 1] = field
        end
      end
      if sideKey then
        -- The stubs keep the run whole: one XRANGE, which leaves the
        -- prioritized seqs' records unread.
        recs = logReadMany(msgsKey, sideKey, fields, pinnedKey, prioritized)
      else
        local stored = logReadMany(msgsKey, sideKey, read, pinnedKey)
        recs = {}
        local j = 0
        for i, field in ipairs(fields) do
          if not prioritized[field] then
            j = j + 1
            recs[i] = stored[j]
          end
        end
      end
    else
      recs = logReadMany(msgsKey, sideKey, fields, pinnedKey)
    end
    for i, field in ipairs(fields) do
      local rec = recs[i]
      local seq = cursor + 1
      if prioritized and prioritized[field] then
        cursor, cursorText = seq, field
        passed = passed + 1
      else
        if not rec and last == nil then
          last = lastSeq
        end
        if not rec and (last == nil or last < from) then
          refusal = metaKey .. ' field seq (the last seq) is ' .. (rcall('HGET', metaKey, 'seq') or 'missing')
            .. ', below the cursor ' .. from .. ' of ' .. groupKey
          last = cursor
        end
        if not rec and seq > last then
          break -- not published yet: the cursor stays before it
        end
        cursor, cursorText = seq, field
        -- For a seq without a record: nil when it went as settled, true
        -- when the group settled it above its cursor, else false (deleted
        -- while the group still needed it: a dead letter below).
        local settledRun = false
        if not rec then
          since = since or tonumber(rcall('HGET', groupKey, 'since') or '') or last
          -- includes/missing_record.lua's rule, written out: the main chunk
          -- has no local to spare for its function.
          if seq <= since and (string.byte(msgsKey, -1) ~= LOG_STREAM_BYTE
            or rcall('HEXISTS', metaKey, 'gaps') == 1
            and seq <= (tonumber(rcall('HGET', metaKey, 'gaps_to') or '') or math.huge)) then
            settledRun = nil
          else
            -- Unless the cursor was moved back over seqs it settled (the
            -- check before the scan sees the floor; this, its acked runs).
            local run = rcall('ZRANGEBYSCORE', ackedKey, seq, '+inf', 'LIMIT', '0', '1')
            settledRun = run[1] ~= nil and run[1] + 0 <= seq
          end
        end
        if settledRun == nil then
          -- Deleted as settled: nothing to deliver.
          gone[#gone + 1] = seq
          passed = passed + 1
        elseif settledRun then
          refusal = groupKey .. ' field cursor is ' .. from .. ', below seq ' .. seq .. ' the group settled ('
            .. ackedKey .. ')'
          cursor, cursorText, last = seq - 1, string.format('%d', seq - 1), seq - 1
          break
        else
          local notBefore = rec and recordNotBefore(rec)
          if not notBefore then
            --@make failurePaths
            if rec then
              deadLetter(seq, nil, 'corrupted-record', 'record does not parse') -- as deliver() would
            else
              deadLetter(seq, nil, 'new message', 'record deleted before the group read it') -- missing-record
            end
          elseif notBefore > now then
            rcall('ZADD', delayKey, notBefore, field)
            passed = passed + 1
          else
            -- A first delivery, as deliver() above would make it: the common
            -- case, without a call, a state table and a second parse.
            --@layout hash
            states[#states + 1] = field
            states[#states + 1] = firstState
            leased[#leased + 1] = field
            --@end
            --@layout stream
            if scanned and #scanned < CALL_MAX then
              scanned[#scanned + 1] = seq
            else
              states[#states + 1] = field
              states[#states + 1] = firstState
              leased[#leased + 1] = field
            end
            --@end
            out[#out + 1] = seq
            out[#out + 1] = 1
            out[#out + 1] = rec
            got = got + 1
          end
        end
      end
    end
  end
  if passed >= SCAN_LIMIT and got < room then
    morePassed = true
  end
  --@layout stream
  if scanned and #scanned > 0 then
    local firstSeq = scanned[1]
    local record = nil
    if #scanned >= CALL_MIN then
      local lastScanned = scanned[#scanned]
      local bytes
      if lastScanned - firstSeq + 1 == #scanned then
        bytes = string.rep('1', #scanned) -- no seq passed over (a claim's)
      else
        local parts, at = {}, 1
        for s = firstSeq, lastScanned do
          if scanned[at] == s then
            parts[s - firstSeq + 1] = '1'
            at = at + 1
          else
            parts[s - firstSeq + 1] = '0'
          end
        end
        bytes = table.concat(parts)
      end
      record = string.format('%d', firstSeq) .. ' ' .. nowText .. ' ' .. #scanned .. ' ' .. bytes .. ' ' .. consumerName
    end
    -- A token already on a call (drawn again) keeps its record: the
    -- deliveries take the per-message path.
    if record and rcall('HSETNX', callsKey, token, record) == 1 then
      rcall('ZADD', callExpKey, deadline, token, '+inf', SKIPLIST_PIN)
      rcall('ZADD', callSeqKey, firstSeq, token, '+inf', SKIPLIST_PIN)
      -- written with the cursor: callout as read, less what left calls in
      -- this call (acks, expiry), and these
      callout = (tonumber(groupFields[6] or '0') or 0) - callsLeft + #scanned
      scanned.written = true
      out[7] = string.format('%d', firstSeq) .. ':' .. string.format('%d', scanned[#scanned])
    else
      for _, seq in ipairs(scanned) do
        local field = string.format('%d', seq)
        states[#states + 1] = field
        states[#states + 1] = firstState
        leased[#leased + 1] = field
      end
    end
    if claimed then
      out[7] = out[7] .. claimed
    end
  end
  --@end
  if cursor ~= from then
    --@layout hash
    rcall('HSET', groupKey, 'cursor', cursorText, CURSOR_CHECKED, cursorText)
    --@end
    --@layout stream
    if scanned and scanned.written then
      rcall('HSET', groupKey, 'cursor', cursorText, CURSOR_CHECKED, cursorText, 'callout', string.format('%d', callout))
    else
      rcall('HSET', groupKey, 'cursor', cursorText, CURSOR_CHECKED, cursorText)
    end
    --@end
  end
  settleMany(gone)
  if refusal and got == 0 then
    return redis.error_reply('RQ_CORRUPT ' .. refusal)
  end
end

if got > 0 then
  --@layout stream
  -- (None when every delivery is on the call record written above.)
  if #leased > 0 then
  --@end
  bulk('HSET', dlvKey, states)
  -- The pin first: ZADD converts the set to a skiplist before it adds the
  -- leases (includes/group_keys.lua). Then highest seq first: were the set
  -- a listpack all the same (a server with a larger zset-max-listpack-value),
  -- ZADD walks from the head past every member of equal score that sorts
  -- before the new one; in this order it stops at once.
  local leases = {'+inf', SKIPLIST_PIN}
  for i = #leased, 1, -1 do
    leases[#leases + 1] = deadline
    leases[#leases + 1] = leased[i]
  end
  bulk('ZADD', leaseKey, leases)
  --@layout stream
  end
  --@end
  rcall('HINCRBY', consumersKey, consumerName, got == 1 and '1' or got) -- fetch(1): no sprintf
  if rateLimit then
    local window = {}
    for _, field in ipairs(leased) do
      window[#window + 1] = nowText
      window[#window + 1] = field .. ':' .. token
    end
    bulk('ZADD', rateKey, window)
  end
  if redelivered > 0 then
    rcall('HINCRBY', groupKey, 'redelivered', redelivered)
  end
else
  -- Nothing to hand out. What the consumers hold adds up to the leases:
  -- a delivery without a lease (deleted) never runs out, so nothing else
  -- would ever offer it again. Checked only here, where a fetch found
  -- nothing (two reads), and not after acks, whose statuses the reply holds.
  if #ARGV <= 9 then
    local leases = deliveriesOut()
    local held = 0
    for _, v in ipairs(rcall('HVALS', consumersKey)) do
      held = held + (tonumber(v) or 0 / 0)
    end
    if held ~= leases then
      return redis.error_reply('RQ_CORRUPT ' .. leaseKey .. ' holds ' .. leases .. ' leases, but the consumers hold '
        .. tostring(held) .. ' deliveries (' .. consumersKey .. '): the counts and the lease set disagree; '
        .. '`rqueue doctor --repair` recomputes the counts and gives a lease back to any delivery without one')
    end
  end
  local nextDue = nil
  --@layout hash
  for _, key in ipairs({delayKey, leaseKey}) do
  --@end
  --@layout stream
  for _, key in ipairs({delayKey, leaseKey, callExpKey}) do
  --@end
    local first = rcall('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] ~= nil and first[1] ~= SKIPLIST_PIN and (nextDue == nil or tonumber(first[2]) < nextDue) then
      nextDue = tonumber(first[2])
    end
  end
  if keyNextDue ~= nil and (nextDue == nil or keyNextDue < nextDue) then
    nextDue = keyNextDue
  end
  if morePassed then
    nextDue = now
  end
  if rateFree ~= nil then
    nextDue = rateFree -- nothing is handed out before, whatever waits
  end
  if nextDue ~= nil then
    out[2] = nextDue
  end
  -- A call that stopped at its bound is asked again at once: no wait in Redis.
  if claimWaiter and not morePassed then
    claimWaiter(out, metaFields[5])
  end
end
-- A floor the deliveries' dead letters moved is the newer.
out[5] = settledFloor or out[5] or 0
return out
