--[[
  Acknowledges one delivery of this consumer, as ack does (strict), and in
  the same call keeps the handler's result under the message and/or
  records a "completed" event: a worker sends its acks here, rather than
  with its next fetch, only for a queue whose settings ask for results or
  completed events, so the common ack pays for neither. A refused ack
  keeps no result and records nothing.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua)
    KEYS[#KEYS] (the last) the result key of the message
      (<base>:result:<seq>), under the queue's hash tag; written only when
      ARGV[8] is not "", and checked by its name first
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the result's time to live in ms, or "" to keep no result
    ARGV[9] the result as the client encoded it (stored after the queue's
      incarnation and a newline, so that a queue made anew under the same
      name never answers with an old result)
    ARGV[10] "1" = record a "completed" event, "0" = not
    ARGV[11] seq, ARGV[12] delivery count, ARGV[13] token of the tag
  Output:
    {"ok"}
  Errors (nothing is changed):
    RQ_ACKED, RQ_UNKNOWN_TAG, RQ_NOT_HELD, RQ_STALE, RQ_CORRUPT <tag>: as
      ack.lua's strict mode
    RQ_BAD_ARGUMENT  the time to live is not a whole number of ms >= 1, or
                     the last key is not the result key of the tag's seq
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
if #ARGV ~= 13 then
  return redis.error_reply('RQ_BAD_ARGUMENT ack_result takes one tag (ARGV[11..13])')
end
-- The result key is the last one, named as keys.py names it: checked before
-- any write, so that a call built against another layout writes nothing.
local resultKey = KEYS[#KEYS]
if ttl ~= '' and resultKey ~= string.sub(metaKey, 1, -5) .. 'result:' .. ARGV[11] then
  return redis.error_reply('RQ_BAD_ARGUMENT the last key is not the result key of seq ' .. ARGV[11] .. ': '
    .. tostring(resultKey))
end

-- What the ack keeps besides: called once the ack is applied.
local function keep()
  if ttl ~= '' then
    local inc = rcall('HGET', metaKey, 'inc') or ''
    rcall('SET', resultKey, inc .. '\n' .. ARGV[9], 'PX', ttl)
  end
  if ARGV[10] == '1' then
    recordEvent('completed', ARGV[11], '', '')
  end
  return {'ok'}
end

if ackHeldOne(11) ~= nil then
  return keep()
end

--@include ack_tags

local result, err = ackTags(true, 11)
if result == nil then
  return redis.error_reply(err)
end
return keep()
