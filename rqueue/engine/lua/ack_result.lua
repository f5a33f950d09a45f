--[[
  Acknowledges deliveries of this consumer, as ack does, and in the same
  call keeps the handler's result under the message and/or records a
  "completed" event per message it settles: a worker sends its acks here,
  rather than with its next fetch, only for a queue whose settings ask for
  results or completed events, and so does a Consumer's ack, ack_available
  and ack_and_fetch when completed events are on, so the common ack pays
  for neither. A refused ack keeps no result and records nothing.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua)
    KEYS[#KEYS] (the last) the result key of the message for this group
      (<base>:result:<seq>:<group>: each group keeps its own outcome),
      under the queue's hash tag; written only when ARGV[8] is not "", and
      checked by its name first
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the result's time to live in ms, or "" to keep no result
    ARGV[9] the result as the client encoded it (stored after the queue's
      incarnation and a newline, so that a queue made anew under the same
      name never answers with an old result)
    ARGV[10] "1" = record a "completed" event per message settled, "0" =
      not (both strict: every tag or none); "1l" = record them, and settle
      what is valid (lenient, as ack.lua's "0")
    ARGV[11], ARGV[12], ARGV[13] seq, delivery count, token of the tag;
      more tags after it (three arguments each) only when ARGV[8] is ""
  Output:
    strict: {"ok"}; lenient: one status per tag, as ack.lua
  Errors (nothing is changed):
    RQ_ACKED, RQ_UNKNOWN_TAG, RQ_NOT_HELD, RQ_STALE, RQ_CORRUPT <tag>: as
      ack.lua's strict mode
    RQ_BAD_ARGUMENT  the time to live is not a whole number of ms >= 1, the
                     last key is not the result key of the tag's seq and
                     the group, ARGV[10] is none of the modes, or a result
                     comes with more than one tag
    RQ_CORRUPT <floors key> field <group>: as ack.lua
]]
--@flags allow-oom
--@include group_keys
--@include group_names
--@include group_args
--@include record_event
--@include ack_held_one

local ttl = ARGV[8]
if ttl ~= '' and not string.find(ttl, '^[1-9]%d*$') then
  return redis.error_reply('RQ_BAD_ARGUMENT the result time to live (ARGV[8]) is not a whole number of ms: ' .. ttl)
end
local mode = ARGV[10]
if mode ~= '0' and mode ~= '1' and mode ~= '1l' then
  return redis.error_reply('RQ_BAD_ARGUMENT the event mode (ARGV[10]) is not "0", "1" or "1l": ' .. tostring(mode))
end
if #ARGV < 13 or (#ARGV - 10) % 3 ~= 0 or (ttl ~= '' and #ARGV ~= 13) then
  return redis.error_reply('RQ_BAD_ARGUMENT ack_result takes one tag with a result, else tags (ARGV[11..])')
end
-- The result key is the last one, named as keys.py names it: checked before
-- any write, so that a call built against another layout writes nothing.
local resultKey = KEYS[#KEYS]
if ttl ~= '' and resultKey ~= string.sub(metaKey, 1, -5) .. 'result:' .. ARGV[11] .. ':' .. ARGV[1] then
  return redis.error_reply('RQ_BAD_ARGUMENT the last key is not the result key of seq ' .. ARGV[11]
    .. ' and group ' .. ARGV[1] .. ': ' .. tostring(resultKey))
end

-- What the ack keeps besides, for the tags whose status is "ok": called
-- once the ack is applied.
local function keep(statuses)
  -- A result comes with one tag; a lenient call that refused it ("1l")
  -- keeps none, as a strict one does.
  if ttl ~= '' and statuses[1] == 'ok' then
    local inc = rcall('HGET', metaKey, 'inc') or ''
    rcall('SET', resultKey, inc .. '\n' .. ARGV[9], 'PX', ttl)
  end
  if mode ~= '0' then
    for i, status in ipairs(statuses) do
      if status == 'ok' then
        recordEvent('completed', ARGV[8 + 3 * i], '', '')
      end
    end
  end
  if mode == '1l' then
    return statuses
  end
  return {'ok'}
end

local one = ackHeldOne(11)
if one ~= nil then
  return keep(one)
end

--@include ack_tags

local result, err = ackTags(mode ~= '1l', 11)
if result == nil then
  return redis.error_reply(err)
end
return keep(result)
