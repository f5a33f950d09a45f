--[[
  Acknowledges tags of consumerName, shared by ack (alone) and fetch (acks
  of the previous batch sent with the next fetch). The tags are
  ARGV[first], ARGV[first + 1], ... as seq1, count1, token1, seq2, ...
  Returns one status per tag ("ok" or the error code of that tag); with
  strict, the first tag that is not ok instead returns nil and the error
  text "<code> <seq>.<count>.<token>", having changed nothing. It reads no
  clock.
  Callers try ackHeldOne (includes/ack_held_one.lua) first.
]]
--@include group_keys
--@include group_names
--@include bulk
--@include bulk_get
--@include delivery_state
--@include settle
--@include check_tag
--@layout stream
--@include ack_ranges
--@end
local function ackTags(strict, first)
  --@layout stream
  -- Ranges first (includes/ack_ranges.lua): checked against their calls
  -- here; their seqs off the calls join the tags below as fallbacks.
  local calls = nil -- the call records met, by token (includes/call_state.lua, callTag)
  local ranges, fbFields, fbTokens, spanSeqs = nil, nil, nil, nil
  if callsKey and ARGV[first + 1] and string.byte(ARGV[first + 1], 1) == 114 then -- 114: 'r'
    --@make callPaths
    calls = {}
    ranges, fbFields, fbTokens, spanSeqs, first = ackRangesRead(first, calls)
  end
  --@end
  -- Seqs stay the strings the client sent: handing a number to redis.call
  -- formats it again with sprintf, several times per tag.
  local fields = {}
  for i = first, #ARGV, 3 do
    fields[#fields + 1] = ARGV[i]
  end
  --@layout stream
  local tags = #fields -- fields[tags + j] is fallback j of the ranges
  if ranges then
    for j, f in ipairs(fbFields) do
      fields[tags + j] = f
    end
  end
  --@end
  local raws = bulkGet(dlvKey, fields)

  local result = {}
  local done, seen = {}, {}
  --@layout stream
  if spanSeqs then
    done = spanSeqs -- the seqs the ranges' spans settle, the tags' after them
  end
  --@end
  local leased, waiting, stateFields = {}, {}, {}
  local released = {} -- holder -> deliveries taken from it
  -- The last state that passed the fast path, its count and token: every message of
  -- one fetch shares one state string (Lua strings are interned, so == is a
  -- pointer compare), and most of a batch passes on it.
  local okRaw, okCount, okToken = nil, nil, nil
  for i, field in ipairs(fields) do
    local d, corrupt, code = nil, false, nil
    local raw = raws[i]
    local countArg, tokenArg = ARGV[first - 2 + 3 * i], ARGV[first - 1 + 3 * i]
    --@layout stream
    if i > tags then
      countArg, tokenArg = '1', fbTokens[i - tags]
    end
    --@end
    local seq = nil
    if raw and raw == okRaw and countArg == okCount and tokenArg == okToken then
      code = 'ok'
    elseif raw and countArg and tokenArg and #tokenArg <= 32 and string.find(tokenArg, '^%l[%l%d]*$') then
      -- (a token of another form goes to checkTag, which names it)
      -- Fast path: this consumer's current delivery, with no history. A state
      -- found under the sent string means that string is the canonical seq.
      local held = countArg .. ':' .. consumerName .. ':'
      if string.sub(raw, 1, #held) == held then
        local _, times = string.find(raw, '^%d+:%d+:', #held + 1)
        if times ~= nil and string.sub(raw, times + 1) == tokenArg then
          code = 'ok'
          okRaw, okCount, okToken = raw, countArg, tokenArg
        end
      end
    end
    local holder = consumerName
    --@layout hash
    if code == 'ok' then
    --@end
    --@layout stream
    local synthesized = false
    if code == nil and raw == false and callsKey then
      -- A call's own delivery (includes/call_state.lua), settled by its
      -- record; another tag of a seq out on a call is judged by the state
      -- a split would give it.
      --@make callPaths
      calls = calls or {}
      local callSeq, twice = nil, nil
      if countArg == '1' then
        callSeq, twice = callTag(field, tokenArg, calls)
      end
      if twice then
        code = 'RQ_ACKED' -- in a range of this call too
      elseif callSeq then
        code, seq, holder = 'ok', callSeq, nil
      else
        seq = tonumber(field)
        raw = seq and callStateOf(seq) or false
        synthesized = raw ~= false
      end
    end
    if holder == nil then
      -- settled by its call record, below
    elseif code == 'ok' then
    --@end
      -- A seq with a delivery state: "+ 0" parses it once, tonumber() twice.
      seq = field + 0
    else
      seq = tonumber(field)
    end
    if code == nil then
      if seq ~= nil and raw == false and tostring(seq) ~= field then
        -- A seq written another way ("07"): states are kept under the canonical one.
        field = tostring(seq)
        raw = rcall('HGET', dlvKey, field)
      end
      if seq ~= nil then
        d, corrupt = parseDelivery(seq, raw)
      end
      code = 'RQ_CORRUPT'
      if not corrupt then
        code = checkTag(seq, tonumber(countArg), tokenArg, d, true)
      end
      holder = d and d.holder
      --@layout stream
      if synthesized and code == 'ok' then
        code = 'RQ_CORRUPT' -- only callTag settles a call's delivery
      end
      --@end
    end
    if code == 'ok' and seen[seq] then
      code = 'RQ_ACKED' -- listed twice in one call
    end
    if code ~= 'ok' and strict then
      local why = ''
      if code == 'RQ_CORRUPT' then
        why = ': its delivery state in ' .. dlvKey .. ' is missing or does not parse'
      end
      return nil, code .. ' ' .. fields[i] .. '.' .. tostring(countArg) .. '.' .. tostring(tokenArg) .. why
    end
    result[i] = code
    if code == 'ok' then
      seen[seq] = true
      done[#done + 1] = seq
      --@layout hash
      stateFields[#stateFields + 1] = field
      if holder == '' then
      --@end
      --@layout stream
      if holder == nil then
        -- on a call: its record is written below
      elseif holder == '' then
        stateFields[#stateFields + 1] = field
      --@end
        waiting[#waiting + 1] = field
      else
        --@layout stream
        stateFields[#stateFields + 1] = field
        --@end
        leased[#leased + 1] = field
        released[holder] = (released[holder] or 0) + 1
      end
    end
  end

  if #done > 0 then
    local floor = ackFloor() -- before any write (includes/settle.lua)
    --@layout stream
    if calls then
      local k = callAcksStore(calls)
      if k > 0 then
        released[consumerName] = (released[consumerName] or 0) + k
      end
    end
    --@end
    bulk('ZREM', leaseKey, leased)
    bulk('ZREM', readyKey, waiting)
    bulk('ZREM', delayKey, waiting)
    -- The counts of a single ack go as strings: redis.call formats a number
    -- with sprintf, a good part of a small command's cost.
    for holder, k in pairs(released) do
      rcall('HINCRBY', consumersKey, holder, k == 1 and '-1' or -k)
    end
    bulk('HDEL', dlvKey, stateFields)
    --@layout hash
    settleMany(done, stateFields, floor)
    --@end
    --@layout stream
    -- The fields name done's seqs only when no seq was settled by a call
    -- (whose seqs have no field): else settleMany makes them again, as a
    -- field out of line would name another seq as the new floor.
    settleMany(done, #stateFields == #done and stateFields or nil, floor)
    --@end
    rcall('HINCRBY', groupKey, 'acked', #done == 1 and '1' or #done)
  end
  --@layout stream
  if ranges then
    return ackRangesResult(ranges, result, tags)
  end
  --@end
  return result
end
