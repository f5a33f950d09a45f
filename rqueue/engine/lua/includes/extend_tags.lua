--[[
  Extends the leases of the tags in ARGV[first], ARGV[first+1], ... (seq,
  count, token triples) to deadline when this consumer holds them. Returns
  one status per tag: "ok", the code from checkTag, or RQ_CORRUPT for a
  delivery state that does not parse. A current delivery
  held by this consumer always has a lease; one found without (deleted) is
  given its lease back and recorded as a "corrupt" event.
]]
--@include group_keys
--@include group_names
--@include delivery_state
--@include check_tag
--@include record_event
local function extendTags(first, deadline)
  local statuses = {}
  --@layout stream
  -- Tags of call deliveries (a stream log's, includes/call_state.lua): a
  -- call named whole is extended by its deadline, the others split out.
  local onCalls = nil
  if callsKey then
    --@make callPaths
    onCalls = extendCalls(first, deadline)
  end
  --@end
  for i = first, #ARGV, 3 do
    local seq, count = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    -- A state that does not parse is its own tag's RQ_CORRUPT (as in ack.lua),
    -- not an error of the call: the other leases are still extended.
    --@layout hash
    local d, corrupt = nil, false
    if seq then
      d, corrupt = parseDelivery(seq, rcall('HGET', dlvKey, seq))
    end
    local code = corrupt and 'RQ_CORRUPT' or checkTag(seq, count, ARGV[i + 2], d, false)
    if code == 'ok' and rcall('ZADD', leaseKey, deadline, seq) == 1 then
    --@end
    --@layout stream
    local d, corrupt, raw, synthesized = nil, false, nil, false
    if seq and not (onCalls and onCalls[i]) then
      raw = rcall('HGET', dlvKey, seq)
      if not raw and onCalls then
        -- another tag of a call delivery: judged by the state a split would
        -- give it (includes/call_state.lua), changing nothing
        raw = callStateOf(seq) or false
        synthesized = raw ~= false
      end
      d, corrupt = parseDelivery(seq, raw)
    end
    local code = 'ok'
    if not (onCalls and onCalls[i]) then
      code = corrupt and 'RQ_CORRUPT' or checkTag(seq, count, ARGV[i + 2], d, false)
      if code == 'ok' and synthesized then
        splitSeq(seq) -- its own tag written another way ("07"): extended per message below
      end
    end
    if code == 'ok' and not (onCalls and onCalls[i]) and rcall('ZADD', leaseKey, deadline, seq) == 1 then
    --@end
      recordEvent('corrupt', seq, 'the lease of seq ' .. seq .. ' was missing from ' .. leaseKey
        .. ' (its delivery held by ' .. consumerName .. '): given back by an extension')
    end
    statuses[#statuses + 1] = code
  end
  return statuses
end
