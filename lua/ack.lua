--[[
  Acknowledges deliveries of one consumer. A tag is a (seq, count) pair: the
  count-th delivery of seq in this group.

  A tag is accepted when it is the current delivery held by this consumer,
  when its lease ran out but nobody else got the message yet, or when it is an
  earlier delivery of a message that is still unsettled (the work was done:
  a late ack completes the message and the newer delivery becomes stale).

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua)
    ARGV[1..14] the group arguments (includes/group_args.lua)
    ARGV[15] strict: "1" = all tags or none, "0" = settle what is valid
    ARGV[16], ARGV[17], ... seq1, count1, seq2, count2, ...
  Output:
    one status per tag, in order: "ok", or the error code of that tag
  Errors (strict only; nothing is changed):
    RQ_ACKED <seq>.<count>     the group has already settled that message
    RQ_UNKNOWN_TAG <seq>.<count> no such delivery was ever made
    RQ_NOT_HELD <seq>.<count>  this consumer never held that delivery
    RQ_CORRUPT <seq>.<count>   the message's delivery state does not parse
      (its lease runs out and fetch moves it to the dead-letter queue)
]]
--@include read_now
--@include group_keys
--@include group_args
--@include delivery_state
--@include record
--@include bulk
--@include settle
--@include redelivery
--@include group_ops
--@include check_tag

local strict = ARGV[15] == '1'

-- Seqs stay the strings the client sent: handing a number to redis.call
-- formats it again with sprintf, several times per tag.
local fields = {}
for i = 16, #ARGV, 2 do
  fields[#fields + 1] = ARGV[i]
end
local raws = bulkGet(dlvKey, fields)

local result = {}
local done, seen = {}, {}
local leased, waiting, stateFields = {}, {}, {}
local released = {} -- holder -> deliveries taken from it
-- The last state that passed the fast path and its count: every message of
-- one fetch shares one state string (Lua strings are interned, so == is a
-- pointer compare), and most of a batch passes on it.
local okRaw, okCount = nil, nil
for i, field in ipairs(fields) do
  local d, corrupt, code = nil, false, nil
  local raw = raws[i]
  local countArg = ARGV[15 + 2 * i]
  local seq = tonumber(field)
  if raw and raw == okRaw and countArg == okCount then
    code = 'ok'
  elseif raw and countArg then
    -- Fast path: this consumer's current delivery, with no history. A state
    -- found under the sent string means that string is the canonical seq.
    local held = countArg .. ':' .. consumerName .. ':'
    if string.sub(raw, 1, #held) == held and string.find(raw, '^%d+:%d+$', #held + 1) then
      code = 'ok'
      okRaw, okCount = raw, countArg
    end
  end
  local holder = consumerName
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
      code = checkTag(seq, tonumber(countArg), d, true)
    end
    holder = d and d.holder
  end
  if code == 'ok' and seen[seq] then
    code = 'RQ_ACKED' -- listed twice in one call
  end
  if code ~= 'ok' and strict then
    return redis.error_reply(code .. ' ' .. ARGV[14 + 2 * i] .. '.' .. ARGV[15 + 2 * i])
  end
  result[i] = code
  if code == 'ok' then
    seen[seq] = true
    done[#done + 1] = seq
    stateFields[#stateFields + 1] = field
    if holder == '' then
      waiting[#waiting + 1] = field
    else
      leased[#leased + 1] = field
      released[holder] = (released[holder] or 0) + 1
    end
  end
end

if #done > 0 then
  bulk('ZREM', leaseKey, leased)
  bulk('ZREM', readyKey, waiting)
  bulk('ZREM', delayKey, waiting)
  for holder, k in pairs(released) do
    rcall('HINCRBY', consumersKey, holder, -k)
  end
  bulk('HDEL', dlvKey, stateFields)
  settleMany(queueKeys, groupName, done, stateFields)
  rcall('HINCRBY', groupKey, 'acked', #done)
end
return result
