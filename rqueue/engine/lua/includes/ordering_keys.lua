--[[
  Hands out messages of ordering keys, for fetch.lua (included in the block
  that runs only when the group has keys waiting or busy). Adds to fetch's
  out, states, leased and got as its other paths do.

  A key's deliveries not yet settled are kept in kflight ("<seq> <seq>"):
  a delivery is settled once its delivery state is gone (an ack, a dead
  letter, a purge, a reset), whatever script removed it, so no settle path
  knows about keys. A nack or an expiry keeps the state, so its key stays
  held (the redelivery itself goes out as any redelivery). The busy keys
  are checked oldest check first, room + KEY_CHECK_EXTRA of them per call,
  each checked one moving to the back: bounded work, and every busy key is
  checked again within (busy keys / KEY_CHECK_EXTRA) fetches.

  Then keys are taken from kready least recently served first, each at most
  once per call and at most (room x 2 + KEY_CHECK_EXTRA) of them; a key
  hands out its lowest seqs, as many as key_concurrency and its rate limit
  leave room for, and goes to the back of kready (or leaves it: no more
  waiting, or at its concurrency, when kbusy brings it back). A key whose
  next message is delayed, or that is over its rate limit, is passed over
  and goes to the back.

  Sets keyNextDue to the earliest time a key passed over may hand out.
  Code, not a function: a function would hold more upvalues than Lua's 60.
]]
do
  local KEY_CHECK_EXTRA = 16
  local nextDue = nil
  local top = rcall('ZRANGE', keyReadyKey, '-1', '-1', 'WITHSCORES')
  local turn = (tonumber(top[2]) or 0) + 1
  local busyTop = rcall('ZRANGE', keyBusyKey, '-1', '-1', 'WITHSCORES')
  local busyTurn = (tonumber(busyTop[2]) or 0) + 1

  -- Busy keys: which of their deliveries are settled.
  local flights = {} -- key -> its unsettled deliveries (fields), for keys read this call
  local checked = rcall('ZRANGE', keyBusyKey, '0', string.format('%d', room - got + KEY_CHECK_EXTRA - 1))
  if #checked > 0 then
    local held = bulkGet(keyFlightKey, checked)
    local all = {}
    for i = 1, #checked do
      for seq in string.gmatch(held[i] or '', '%d+') do
        all[#all + 1] = seq
      end
    end
    local alive = {}
    local leasedNow, waitingAgain = nil, nil
    for i, state in ipairs(bulkGet(dlvKey, all)) do
      if state then
        alive[all[i]] = true
      else
        -- No state, yet not settled when it waits to be offered again, or
        -- was offered again earlier in this call (whose states are written
        -- last): a sync heartbeat hands back a delivery its consumer never
        -- saw, dropping the state of a count back at 0 (heartbeat.lua).
        -- The key stays held until it is settled. Most calls find neither
        -- set (one EXISTS), and most stateless seqs are acked ones.
        if leasedNow == nil then
          leasedNow = {}
          for _, f in ipairs(leased) do
            leasedNow[f] = true
          end
          waitingAgain = rcall('EXISTS', readyKey, delayKey) > 0
        end
        local seq = all[i]
        if leasedNow[seq] or waitingAgain and (rcall('ZSCORE', readyKey, seq) or rcall('ZSCORE', delayKey, seq)) then
          alive[seq] = true
        end
      end
    end
    for i, key in ipairs(checked) do
      local kept, was = {}, 0
      for seq in string.gmatch(held[i] or '', '%d+') do
        was = was + 1
        if alive[seq] then
          kept[#kept + 1] = seq
        end
      end
      if #kept == 0 then
        -- Its rate window goes once nothing in it counts any more, so that a
        -- key used once leaves nothing behind. Until then the key stays in
        -- kbusy (with no deliveries), so that a later check drops it: no
        -- other step reads the window of a key nothing waits on.
        local window = rcall('HGET', keyFlightKey, '~' .. key)
        local counts = window and keyRateLimit
          and (tonumber(string.match(window, '(%d+)$')) or 0) > now - keyRatePeriod
        if was > 0 then
          rcall('HDEL', keyFlightKey, key)
        end
        if counts then
          rcall('ZADD', keyBusyKey, busyTurn, key)
          busyTurn = busyTurn + 1
        else
          rcall('ZREM', keyBusyKey, key)
          if window then
            rcall('HDEL', keyFlightKey, '~' .. key)
          elseif was == 0 then
            -- Busy with neither deliveries nor a rate window: its kflight
            -- field was deleted. Its waiting messages would wait for a
            -- new one of the key to bring it back: it goes back in line
            -- now, and the damage is an event.
            local waiting = rcall('ZRANGE', keyQueueKey, '[' .. key .. ' ', '(' .. key .. '!', 'BYLEX', 'LIMIT', '0', '1')
            if #waiting > 0 then
              rcall('ZADD', keyReadyKey, 'NX', turn, key)
              turn = turn + 1
              --@make failurePaths
              recordEvent('corrupt', '', 'ordering key ' .. key .. ' was busy without deliveries in ' .. keyFlightKey
                .. ' (its field deleted): put back in line (' .. keyReadyKey .. ')')
            end
          end
        end
      else
        if #kept < was then
          rcall('HSET', keyFlightKey, key, table.concat(kept, ' '))
        end
        rcall('ZADD', keyBusyKey, busyTurn, key)
        busyTurn = busyTurn + 1
      end
      flights[key] = kept
      -- A key kept for its rate window alone (nothing was out) is brought
      -- back by the pull when a message of it comes.
      if #kept < keyConcurrency and was > 0 then
        -- May hand out again: back to the ready keys (its turn kept if there).
        rcall('ZADD', keyReadyKey, 'NX', turn, key)
        turn = turn + 1
      end
    end
  end

  -- Keys passed over in this call (over their rate limit, a delayed next
  -- message, at their concurrency, nothing waiting): not looked at again.
  local passed = {}
  local rateTimes = {} -- key -> its deliveries inside the rate window, for keys read this call
  local examined, examineAtMost = 0, (room - got) * 2 + KEY_CHECK_EXTRA
  local floor, runsExist, since = nil, nil, nil
  local gone = {}
  while got < room and examined < examineAtMost do
    local candidates = rcall('ZRANGE', keyReadyKey, '0', string.format('%d', room - got - 1))
    -- Each key in turn takes its share of the room left, so that a key with
    -- much waiting does not take a whole call while others wait.
    local share = math.ceil((room - got) / math.max(1, #candidates))
    local progress = false
    for _, key in ipairs(candidates) do
      if got >= room or examined >= examineAtMost then
        break
      end
      if not passed[key] then
        -- A key looked at is progress even when it is passed over (it went
        -- to the back, or left the line): the keys behind it are looked at
        -- next, until examineAtMost.
        examined = examined + 1
        progress = true
        local flight = flights[key]
        if flight == nil then
          flight = {}
          for seq in string.gmatch(rcall('HGET', keyFlightKey, key) or '', '%d+') do
            flight[#flight + 1] = seq
          end
          flights[key] = flight
        end
        local free = keyConcurrency - #flight
        local times, limited = nil, false
        if free > 0 and keyRateLimit then
          times = rateTimes[key]
          if times == nil then
            times = {}
            for t in string.gmatch(rcall('HGET', keyFlightKey, '~' .. key) or '', '%d+') do
              if t + 0 > now - keyRatePeriod then
                times[#times + 1] = t
              end
            end
            rateTimes[key] = times
          end
          if #times >= keyRateLimit then
            limited = true
            local at = times[1] + keyRatePeriod -- appended in time order: the oldest first
            if nextDue == nil or at < nextDue then
              nextDue = at
            end
          elseif keyRateLimit - #times < free then
            free = keyRateLimit - #times
          end
        end
        if limited then
          passed[key] = true
          rcall('ZADD', keyReadyKey, turn, key)
          turn = turn + 1
        elseif free <= 0 then
          passed[key] = true
          rcall('ZREM', keyReadyKey, key) -- kbusy brings it back once one settles
        else
          local want = free
          if share < want then
            want = share
          end
          if room - got < want then
            want = room - got
          end
          local members = rcall('ZRANGE', keyQueueKey, '[' .. key .. ' ', '(' .. key .. '!', 'BYLEX', 'LIMIT', '0',
            string.format('%d', want))
          local fields = {}
          for i, m in ipairs(members) do
            fields[i] = string.format('%d', tonumber(string.sub(m, #key + 2)) or 0)
          end
          local recs = sideKey and logReadFlow(msgsKey, sideKey, fields, pinnedKey)
            or logReadMany(msgsKey, sideKey, fields, pinnedKey)
          local raws = bulkGet(dlvKey, fields)
          local done, handed, waitAt = {}, 0, nil
          for i, field in ipairs(fields) do
            local seq = field + 0
            floor = floor or tonumber(rcall('HGET', floorsKey, groupName) or '0') or 0
            -- Settled meanwhile (a purge, settle_through), or handed out
            -- another way (a delivery state exists): not handed out again.
            local settledAlready = seq <= floor or raws[i]
            if not settledAlready then
              if runsExist == nil then
                runsExist = rcall('EXISTS', ackedKey) == 1
              end
              if runsExist then
                local run = rcall('ZRANGEBYSCORE', ackedKey, field, '+inf', 'LIMIT', '0', '1')
                settledAlready = run[1] ~= nil and run[1] + 0 <= seq
              end
            end
            if not settledAlready and not recs[i] then
              -- As the scan of new messages judges a missing record.
              since = since or tonumber(rcall('HGET', groupKey, 'since') or '') or 0
              -- includes/missing_record.lua's rule, written out (fetch.lua
              -- has no local to spare for its function).
              if seq <= since and (string.byte(msgsKey, -1) ~= LOG_STREAM_BYTE
                or rcall('HEXISTS', metaKey, 'gaps') == 1
                and seq <= (tonumber(rcall('HGET', metaKey, 'gaps_to') or '') or math.huge)) then
                gone[#gone + 1] = seq
                settledAlready = true
              end
            end
            local notBefore = recs[i] and recordNotBefore(recs[i])
            if settledAlready then
              done[#done + 1] = members[i]
            elseif not notBefore then
              --@make failurePaths
              if recs[i] then
                deadLetter(seq, nil, 'corrupted-record', 'record does not parse')
              else
                deadLetter(seq, nil, 'new message', 'record deleted before the group read it') -- missing-record
              end
              done[#done + 1] = members[i]
            elseif notBefore > now then
              waitAt = notBefore -- a delayed message holds its key's later ones
              break
            else
              states[#states + 1] = field
              states[#states + 1] = firstState
              leased[#leased + 1] = field
              out[#out + 1] = seq
              out[#out + 1] = 1
              out[#out + 1] = recs[i]
              got = got + 1
              -- Known to the scan below as handed out by this call (it passes
              -- over it should the log be gone: its state is written last).
              fromPrioritySet[#fromPrioritySet + 1] = field
              flight[#flight + 1] = field
              done[#done + 1] = members[i]
              handed = handed + 1
              if times then
                times[#times + 1] = nowText
              end
            end
          end
          if #done > 0 then
            bulk('ZREM', keyQueueKey, done)
          end
          if handed > 0 then
            rcall('HSET', keyFlightKey, key, table.concat(flight, ' '))
            rcall('ZADD', keyBusyKey, 'NX', busyTurn, key)
            busyTurn = busyTurn + 1
            if times then
              rcall('HSET', keyFlightKey, '~' .. key, table.concat(times, ' '))
            end
          end
          if waitAt and (nextDue == nil or waitAt < nextDue) then
            nextDue = waitAt
          end
          if #flight >= keyConcurrency or (waitAt == nil and #members < want and #done == #members) then
            passed[key] = true
            rcall('ZREM', keyReadyKey, key) -- at its concurrency, or nothing more waiting
          else
            passed[key] = waitAt ~= nil
            rcall('ZADD', keyReadyKey, turn, key) -- to the back
            turn = turn + 1
          end
        end
      end
    end
    if not progress then
      break -- every key in view was passed over already
    end
  end
  if #gone > 0 then
    settleMany(gone)
  end
  keyNextDue = nextDue
end
