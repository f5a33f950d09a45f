--[[
  Repairs one finding of `rqueue doctor` (rqueue/doctor.py) in one group, in
  one atomic step, only while what the doctor saw is still so; otherwise it
  does nothing and answers "gone" (fixed meanwhile). Nothing a group needs
  is deleted: a message whose state is lost goes to the dead-letter queue
  (what goes is a stream log's side records no group needs, "side-leak").

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua), and KEYS[25] the
      side hash for a stream log
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] what to repair:
      "lease-without-state", ARGV[9] seq: a leased message without a
        delivery state is moved to the dead-letter queue as corrupted-state
        (its delivery count and holder are lost with the state)
      "state-without-lease", ARGV[9] seq: a delivery held by a member gets a
        lease that runs out now, so the next fetch offers it again (counted
        as an attempt, as any expiry); one held by a consumer that is no
        member, or waiting but in no set, is made ready at once, its count
        kept
      "cursor", ARGV[9] the cursor the doctor read, ARGV[10] the new one:
        written while the cursor is still the one read and the new one is
        at or above the ack floor
      "counts": each member's count of held deliveries, recomputed from
        the lease set and the states, and acked_above from the acked runs
      "meta", ARGV[9] seq: the queue's last seq, written only while it is
        missing; with it meta field layout, for a stream log's key, and
        the trim point (field trimmed), the lowest ack floor
      "prio": meta field prio (the queue has had priority or keyed
        messages), written only while it is missing
      "dead-letter-seq", ARGV[9] seq: the dead-letter queue's last seq,
        raised to seq while the dead letter after it exists (its meta was
        deleted: the next dead letter would overwrite one)
      "untracked", ARGV[9] seq: a seq the group read (above its floor, at
        or below its cursor; or a priority or keyed message it pulled from
        the priority log, at or below its pull position, whatever the
        cursor) that is not settled, has no delivery state and waits in no
        set, whose record is stored and that no group counts settled, is
        made ready: the next fetch hands it out as a first delivery; one in
        the priority log by pulling it again (the pull position is set
        below it), so that it keeps its priority or its key's order (not in
        a stream log: RQ_BAD_ARGUMENT)
      "side-leak", ARGV[9..] seqs (at most 1,000): a stream log's side
        records of seqs at or below the trim point without their priority
        log entries (by which fetch deletes them), or in a queue without
        groups (where no fetch comes), are deleted; no group needs them.
        Those that are no longer so are left
      --@layout stream
      "calls": a stream log's call records (includes/call_state.lua) that
        disagree with their deadlines, first seqs, bytes or the group's
        callout: every seq out on a call that has no delivery state gets
        the state and the lease a split gives it, a record that does not
        parse is deleted (its seqs are then reported as lost), and the call
        keys go, callout 0
      --@end
      "key-stranded", ARGV[9] an ordering key with messages waiting in the
        group's key queue and neither ready nor busy: put at the back of the
        ready keys (and first among the busy keys when it has deliveries
        out), so that fetch hands them out in order again
      "register", ARGV[9] floor: a group whose hash is there while the
        floors hash has no field for it is registered again at floor, only
        while the floors hash names no group, the queue is not in retention
        mode and its trim point is floor (the one group's floor: each settle
        that moved it wrote both)
    "check:<what>", the same arguments: answers "holds" while the
      finding is still so, "gone" otherwise, and changes nothing. The
      doctor's reads are not one snapshot, so it confirms each finding in
      one atomic look before it reports it. Two findings have no repair
      and are only checked:
      "record-missing", ARGV[9] seq: the record is missing while the group
        has a delivery state for seq, or has yet to read it (above its
        cursor, at or below the last seq, and not deleted as settled:
        includes/missing_record.lua)
      "lost-seq", ARGV[9] seq: the group read seq (as for "untracked"),
        did not settle it (in no acked run) and has no delivery state for
        it, nor does it wait in any set
      "last-below-cursor": the queue's last seq is below the cursor
      "unregistered": the group's hash is there, the floors hash has no
        field for it
  Output:
    { "done", "gone" or (a check) "holds", what was done }
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  what is unknown, or the failure policy (ARGV[7]) does
                     not parse
  Work: "counts" reads the lease set (at most max_inflight entries), their
  states, the members and the acked runs; the others a few keys.
]]
--@include lowest_floor
--@include log_one
--@include group_keys
--@include group_names
--@include group_args
--@include delivery_state
--@include requeue
--@include dead_letter_corrupt_state
--@include layout
--@include missing_record
--@layout stream
--@include bulk
-- Call records (a stream log's first deliveries): read by the checks below.
--@lazy callPaths call_state
--@end

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end

local what = ARGV[8]
failurePolicy() -- parsed before any write
local checking = string.sub(what, 1, 6) == 'check:'
if checking then
  what = string.sub(what, 7)
end
local HOLDS = {'holds', ''}
--@layout stream
if callsKey then
  --@make callPaths
end

-- Whether seq (a number) is out on a call; a record that does not parse
-- says nothing (the "calls" finding names it).
local function onCall(seq)
  if not callsKey or not seq then
    return false
  end
  local ok, state = pcall(callStateOf, seq)
  return ok and state ~= nil
end
--@end

-- Read by the group, unsettled, and tracked nowhere (see "lost-seq"). A
-- priority or keyed message is read once pulled from the priority log (at
-- or below the pull position, field pcur, as fetch.lua reads it), whatever
-- the cursor; until then it waits in the log. Answers false, or true and
-- whether seq is in the priority log.
local function untracked(seqText)
  local seq = tonumber(seqText)
  local floor = tonumber(rcall('HGET', floorsKey, groupName) or '0')
  local cursor = tonumber(rcall('HGET', groupKey, 'cursor') or '0')
  if seq == nil or floor == nil or cursor == nil or seq <= floor then
    return false
  end
  local member = rcall('ZRANGEBYSCORE', prioKey, seqText, seqText, 'LIMIT', '0', '1')[1]
  if member then
    local pulledTo = tonumber(rcall('HGET', groupKey, 'pcur') or '') or floor
    local key = string.match(member, '^%d+:k:(.+)$')
    if seq > pulledTo or rcall('ZSCORE', prioSetKey, seqText)
      or (key and rcall('ZSCORE', keyQueueKey, key .. ' ' .. string.format('%016d', seq))) then
      return false
    end
  elseif seq > cursor then
    return false
  end
  local run = rcall('ZRANGEBYSCORE', ackedKey, seqText, '+inf', 'LIMIT', '0', '1')
  local tracked = (run[1] ~= nil and run[1] + 0 <= seq) or rcall('HEXISTS', dlvKey, seqText) == 1
    or rcall('ZSCORE', readyKey, seqText) or rcall('ZSCORE', delayKey, seqText) or rcall('ZSCORE', leaseKey, seqText)
    --@layout stream
    or onCall(seq)
    --@end
  return not tracked, member ~= nil
end

if checking and what == 'record-missing' then
  local seq = ARGV[9]
  if logHas(msgsKey, sideKey, seq, pinnedKey) then
    return {'gone', ''}
  end
  --@layout hash
  if rcall('HEXISTS', dlvKey, seq) == 1 then
  --@end
  --@layout stream
  if rcall('HEXISTS', dlvKey, seq) == 1 or onCall(tonumber(seq)) then
  --@end
    return HOLDS
  end
  local n = tonumber(seq)
  -- Settled meanwhile (a priority or keyed message acked above the cursor,
  -- whose record went with its ack): nothing is missing.
  local floor = tonumber(rcall('HGET', floorsKey, groupName) or '0')
  local run = rcall('ZRANGEBYSCORE', ackedKey, seq, '+inf', 'LIMIT', '0', '1')
  if n == nil or (floor ~= nil and n <= floor) or (run[1] ~= nil and run[1] + 0 <= n) then
    return {'gone', ''}
  end
  local cursor = tonumber(rcall('HGET', groupKey, 'cursor') or '0')
  local since = tonumber(rcall('HGET', groupKey, 'since') or '0')
  local last = tonumber(rcall('HGET', metaKey, 'seq') or '0')
  if n ~= nil and cursor ~= nil and n > cursor and not recordSettledAway(n, since or -1) and last ~= nil
    and n <= last then
    return HOLDS
  end
  return {'gone', ''}
end

if checking and what == 'lost-seq' then
  return untracked(ARGV[9]) and HOLDS or {'gone', ''}
end

if checking and what == 'last-below-cursor' then
  local last = tonumber(rcall('HGET', metaKey, 'seq') or '')
  local cursor = tonumber(rcall('HGET', groupKey, 'cursor') or '0')
  return (last ~= nil and cursor ~= nil and last < cursor) and HOLDS or {'gone', ''}
end

if what == 'register' or what == 'unregistered' then
  -- The group's hash is there and the floors hash has no field for it;
  -- registered again only as the queue's one group outside retention
  -- mode, at its trim point ARGV[9] (includes/settle.lua writes both).
  if rcall('HEXISTS', floorsKey, groupName) == 1 or rcall('EXISTS', groupKey) == 0 then
    return {'gone', ''}
  end
  if what == 'register' and (rcall('HLEN', floorsKey) > 0 or rcall('HEXISTS', metaKey, 'retain') == 1
      or (rcall('HGET', metaKey, 'trimmed') or '0') ~= ARGV[9]) then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  if what == 'unregistered' then
    return redis.error_reply('RQ_BAD_ARGUMENT "unregistered" is only checked: its floor is not known')
  end
  rcall('HSET', floorsKey, groupName, ARGV[9])
  return {'done', 'registered group ' .. groupName .. ' again in ' .. floorsKey .. ' with the ack floor ' .. ARGV[9]
    .. ' (the trim point)'}
end

if what == 'lease-without-state' then
  local seq = ARGV[9]
  if not rcall('ZSCORE', leaseKey, seq) or rcall('HEXISTS', dlvKey, seq) == 1 then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  local dseq = deadLetterCorruptState(tonumber(seq), nil)
  return {'done', 'moved seq ' .. seq .. ' to the dead-letter queue as corrupted-state (dead letter ' .. dseq .. ')'}
end

if what == 'state-without-lease' then
  local seq = ARGV[9]
  local raw = rcall('HGET', dlvKey, seq)
  local d, corrupt = parseDelivery(tonumber(seq), raw)
  if d == nil or corrupt then
    return {'gone', ''}
  end
  local leased = rcall('ZSCORE', leaseKey, seq)
  if d.holder ~= '' and rcall('HEXISTS', consumersKey, d.holder) == 1 then
    if leased then
      return {'gone', ''}
    end
    if checking then
      return HOLDS
    end
    rcall('ZADD', leaseKey, now, seq)
    return {'done', 'gave seq ' .. seq .. ' (held by ' .. d.holder .. ') a lease that runs out now: the next fetch '
      .. 'offers it again'}
  end
  if d.holder == '' and (rcall('ZSCORE', readyKey, seq) or rcall('ZSCORE', delayKey, seq) or leased) then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  local was = d.holder
  if leased then
    rcall('ZREM', leaseKey, seq)
  end
  rememberHolder(d, false)
  d.holder = ''
  writeDelivery(dlvKey, seq, d)
  requeue(seq, 0)
  if was == '' then
    return {'done', 'made seq ' .. seq .. ' ready again (it waited in no set)'}
  end
  return {'done', 'made seq ' .. seq .. ' ready again (its holder ' .. was .. ' is no member)'}
end

if what == 'cursor' then
  local cursor = rcall('HGET', groupKey, 'cursor') or '0'
  local floor = tonumber(rcall('HGET', floorsKey, groupName) or '0')
  local new = tonumber(ARGV[10])
  if cursor ~= ARGV[9] or floor == nil or new == nil or new < floor then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  rcall('HSET', groupKey, 'cursor', ARGV[10])
  return {'done', 'set the cursor from ' .. cursor .. ' to ' .. ARGV[10]}
end

--@layout stream
if what == 'calls' then
  if not callsKey then
    return {'gone', ''}
  end
  -- The finding holds while a record does not parse or disagrees with its
  -- bytes, its deadline, its first seq or a delivery state, a token of
  -- cexp or cseq has no record, or callout is not the sum of out. The
  -- repair turns every call into per-message deliveries and drops the keys.
  local all = rcall('HGETALL', callsKey)
  local damaged, total, tokens = false, 0, {}
  for i = 1, #all, 2 do
    local ok, c = pcall(callRead, all[i], all[i + 1])
    tokens[all[i]] = true
    if not ok then
      damaged = true
    else
      total = total + c.out
      local ones = 0
      for j = 1, #c.bytes do
        if string.sub(c.bytes, j, j) == '1' then
          ones = ones + 1
          if rcall('HEXISTS', dlvKey, string.format('%d', c.first + j - 1)) == 1 then
            damaged = true
          end
        end
      end
      damaged = damaged or ones ~= c.out or not rcall('ZSCORE', callExpKey, all[i])
        or tonumber(rcall('ZSCORE', callSeqKey, all[i]) or '') ~= c.first
    end
  end
  for _, key in ipairs({callExpKey, callSeqKey}) do
    for _, token in ipairs(rcall('ZRANGE', key, '0', '-1')) do
      damaged = damaged or not (tokens[token] or token == SKIPLIST_PIN)
    end
  end
  damaged = damaged or (tonumber(rcall('HGET', groupKey, 'callout') or '0') or -1) ~= total
  if not damaged then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  local split, dropped = 0, 0
  for i = 1, #all, 2 do
    local ok, c = pcall(callRead, all[i], all[i + 1])
    if ok and c then
      local deadline = rcall('ZSCORE', callExpKey, all[i]) or c.ms
      local state = '1:' .. c.holder .. ':' .. c.ms .. ':' .. c.ms .. ':' .. all[i]
      for j = 1, #c.bytes do
        local field = string.format('%d', c.first + j - 1)
        if string.sub(c.bytes, j, j) == '1' and rcall('HEXISTS', dlvKey, field) == 0 then
          rcall('HSET', dlvKey, field, state)
          rcall('ZADD', leaseKey, deadline, field)
          split = split + 1
        end
      end
    else
      dropped = dropped + 1
    end
  end
  rcall('DEL', callsKey, callExpKey, callSeqKey)
  rcall('HDEL', groupKey, 'callout')
  return {'done', 'split ' .. split .. ' call deliveries out to delivery states and leases, and dropped ' .. dropped
    .. ' call records that do not parse'}
end

--@end
if what == 'counts' then
  local held = {}
  --@layout stream
  if callsKey then
    -- Call deliveries count for their holder (includes/call_state.lua).
    local all = rcall('HGETALL', callsKey)
    for i = 1, #all, 2 do
      local ok, c = pcall(callRead, all[i], all[i + 1])
      if ok and c then
        held[c.holder] = (held[c.holder] or 0) + c.out
      end
    end
  end
  --@end
  for _, s in ipairs(rcall('ZRANGE', leaseKey, 0, -1)) do
    if s ~= SKIPLIST_PIN then
      local d = parseDelivery(tonumber(s), rcall('HGET', dlvKey, s))
      if d ~= nil and d.holder ~= '' then
        held[d.holder] = (held[d.holder] or 0) + 1
      end
    end
  end
  local writes, changed = {}, {}
  local members = rcall('HGETALL', consumersKey)
  for i = 1, #members, 2 do
    local name, count = members[i], members[i + 1]
    local want = held[name] or 0
    if tonumber(count) ~= want then
      writes[#writes + 1] = {consumersKey, name, want}
      changed[#changed + 1] = name .. ' ' .. count .. ' -> ' .. want
    end
  end
  local above = 0
  local runs = rcall('ZRANGE', ackedKey, 0, -1, 'WITHSCORES')
  for i = 1, #runs, 2 do
    above = above + (tonumber(runs[i + 1]) - tonumber(runs[i]) + 1)
  end
  local stored = rcall('HGET', groupKey, ACKED_ABOVE) or '0'
  if tonumber(stored) ~= above then
    writes[#writes + 1] = {groupKey, ACKED_ABOVE, above}
    changed[#changed + 1] = ACKED_ABOVE .. ' ' .. stored .. ' -> ' .. above
  end
  if #changed == 0 then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  for _, w in ipairs(writes) do
    rcall('HSET', w[1], w[2], w[3])
  end
  return {'done', 'recomputed ' .. table.concat(changed, ', ')}
end

if what == 'meta' then
  if rcall('HEXISTS', metaKey, 'seq') == 1 then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  rcall('HSET', metaKey, 'seq', ARGV[9])
  -- A stream log's queue says so again (the call was sent its key, and a
  -- queue without a seq takes the layout of the key it is sent).
  markLayout(metaKey, msgsKey, rcall('HGET', metaKey, 'layout'))
  if logIsStream(msgsKey) and rcall('HEXISTS', metaKey, 'gaps') == 0 then
    -- Whether entries were deleted one by one (includes/missing_record.lua)
    -- went with the hash: as far as a fetch can tell, up to this seq they
    -- were; above it, entries go only by the trim.
    rcall('HSET', metaKey, 'gaps', '1', 'gaps_to', ARGV[9])
  end
  -- The trim point, the lowest ack floor (retention mode went with the
  -- hash): without it no settle would move it, and a stream log would
  -- keep every entry from here on.
  local low = lowestFloor(floorsKey)
  local also = ''
  if low and low > 0 and rcall('HEXISTS', metaKey, 'trimmed') == 0 then
    rcall('HSET', metaKey, 'trimmed', string.format('%d', low))
    if logIsStream(msgsKey) then
      -- The entries below it go in steps, as after a jump of the lowest
      -- floor (includes/settle_shared.lua): from the oldest one on.
      local oldest = logOldest(msgsKey)
      if oldest and oldest <= low then
        rcall('HSET', metaKey, 'swept', string.format('%d', oldest - 1))
      end
    end
    also = ' and the trim point ' .. string.format('%d', low)
  end
  return {'done', 'wrote the last seq ' .. ARGV[9] .. also .. ' to ' .. metaKey}
end

if what == 'prio' then
  if rcall('HEXISTS', metaKey, 'prio') == 1 then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  rcall('HSET', metaKey, 'prio', '1')
  return {'done', 'wrote field prio to ' .. metaKey .. ': fetch hands out priority and keyed messages apart '
    .. 'from the cursor again'}
end

if what == 'dead-letter-seq' then
  local current = tonumber(rcall('HGET', dlqMetaKey, 'seq') or '0')
  local seq = tonumber(ARGV[9])
  if current == nil or seq == nil or seq <= current or not logTaken(dlqMsgsKey, current + 1) then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  rcall('HSET', dlqMetaKey, 'seq', ARGV[9])
  -- A stream dead-letter queue says so again, as the meta repair does for
  -- the queue: else the next dead letter is refused (RQ_LAYOUT).
  markLayout(dlqMetaKey, dlqMsgsKey, rcall('HGET', dlqMetaKey, 'layout'))
  return {'done', 'raised the last dead-letter seq from ' .. current .. ' to ' .. ARGV[9]}
end

if what == 'untracked' then
  if logIsStream(msgsKey) then
    -- A stream log keeps settled records above the lowest floor and no
    -- counts: a stored record does not say that no group settled the seq.
    return redis.error_reply('RQ_BAD_ARGUMENT "untracked" is not repaired in a stream log: it is only reported')
  end
  local lost, inLog = untracked(ARGV[9])
  if not lost or not logHas(msgsKey, sideKey, ARGV[9], pinnedKey) or rcall('HEXISTS', settledKey, ARGV[9]) == 1 then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  if inLog then
    -- Pulled again by the next fetch, as it pulls any: a keyed message
    -- goes back to its key's queue (in key order, within key_concurrency),
    -- a priority message to the priority set. What the pull finds again
    -- that is settled or out is passed over there.
    -- Only ever lowered: the pull of another seq repaired before this one
    -- stays below it.
    local to = math.min(tonumber(rcall('HGET', groupKey, 'pcur') or '') or 0, ARGV[9] - 1)
    rcall('HSET', groupKey, 'pcur', string.format('%d', to))
    return {'done', 'set the pull position to ' .. string.format('%d', to) .. ': the next fetch pulls seq '
      .. ARGV[9] .. ' from the priority log again'}
  end
  requeue(ARGV[9], 0)
  return {'done', 'made seq ' .. ARGV[9] .. ' ready for redelivery'}
end

if what == 'side-leak' then
  local SIDE_LEAK_MAX = 1000 -- as rqueue/doctor.py's: HDEL's and the checks' work per call
  if #ARGV - 8 > SIDE_LEAK_MAX then
    return redis.error_reply('RQ_BAD_ARGUMENT "side-leak" takes at most ' .. SIDE_LEAK_MAX .. ' seqs; sent '
      .. (#ARGV - 8))
  end
  local trimmed = tonumber(rcall('HGET', metaKey, 'trimmed') or '0') or 0
  local leaked = {}
  if sideKey then
    local groups = rcall('HLEN', floorsKey) > 0
    for i = 9, #ARGV do
      local seq = tonumber(ARGV[i])
      if seq and seq <= trimmed and rcall('HEXISTS', sideKey, ARGV[i]) == 1
        and (not groups or rcall('ZCOUNT', prioKey, ARGV[i], ARGV[i]) == 0) then
        leaked[#leaked + 1] = ARGV[i]
      end
    end
  end
  if #leaked == 0 then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  rcall('HDEL', sideKey, unpack(leaked))
  return {'done', 'deleted ' .. #leaked .. ' side records at or below the trim point ' .. trimmed .. ' from '
    .. sideKey}
end

if what == 'key-stranded' then
  local key = ARGV[9] or ''
  local first = rcall('ZRANGE', keyQueueKey, '[' .. key .. ' ', '(' .. key .. '!', 'BYLEX', 'LIMIT', '0', '1')
  if key == '' or #first == 0 or rcall('ZSCORE', keyReadyKey, key) or rcall('ZSCORE', keyBusyKey, key) then
    return {'gone', ''}
  end
  if checking then
    return HOLDS
  end
  local top = rcall('ZRANGE', keyReadyKey, '-1', '-1', 'WITHSCORES')
  rcall('ZADD', keyReadyKey, (tonumber(top[2]) or 0) + 1, key)
  if rcall('HEXISTS', keyFlightKey, key) == 1 then
    -- Deliveries it had out: checked by the next fetch, which frees the key
    -- once they are settled.
    rcall('ZADD', keyBusyKey, 0, key)
  end
  return {'done', 'put ordering key ' .. key .. ' back in line (' .. keyReadyKey .. ')'}
end

return redis.error_reply('RQ_BAD_ARGUMENT unknown repair ' .. tostring(what))
