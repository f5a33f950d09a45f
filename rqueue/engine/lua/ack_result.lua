--[[
  Acknowledges deliveries of this consumer, as ack does, and in the same
  call keeps the handler's result under each message and/or records a
  "completed" event per message it settles: a worker sends the acks of a
  round here, rather than with its next fetch, only for a queue whose
  settings ask for results or completed events, and so does a Consumer's
  ack, ack_available and ack_and_fetch when completed events are on, so the
  common ack pays for neither. A refused ack keeps no result and records
  nothing.

  Input:
    KEYS[1..24] the group layout (includes/group_keys.lua), and KEYS[25] the
      side hash for a stream log
    KEYS after it: when ARGV[8] is not "", the result key of each tag's
      message for this group, in the tags' order
      (<base>:result:<seq>:<group>: each group keeps its own outcome),
      under the queue's hash tag, each checked by its name first; else one
      key that is not written (the meta key stands in)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the results' time to live in ms, or "" to keep no result
    ARGV[9] when ARGV[8] is not "", the result of each tag as the client
      encoded it, in the tags' order, each as "<length in bytes>:<bytes>";
      else "". A result is stored after the queue's incarnation and a
      newline, so that a queue made anew under the same name never answers
      with an old result
    ARGV[10] "1" = record a "completed" event per message settled, "0" =
      not; both strict (every tag or none); "1l" and "0l" = the same, and
      settle what is valid (lenient, as ack.lua's "0")
    ARGV[11], ARGV[12], ARGV[13], ... seq, delivery count, token of each tag
  Output:
    strict: {"ok"}; lenient: one status per tag, as ack.lua; a result is
    kept, and an event recorded, for each tag whose status is "ok"
  Errors (nothing is changed):
    RQ_ACKED, RQ_UNKNOWN_TAG, RQ_NOT_HELD, RQ_STALE, RQ_CORRUPT <tag>: as
      ack.lua's strict mode
    RQ_BAD_ARGUMENT  the time to live is not a whole number of ms >= 1,
                     ARGV[10] is none of the modes, the tags are not in
                     threes, ARGV[9] does not hold one result per tag in
                     that form or holds an empty one, a tag's seq (when
                     results are kept) is not written as a seq ("07",
                     "7.0"), or a result key is not the one of its tag's
                     seq and the group
    RQ_CORRUPT <floors key> field <group>: as ack.lua
]]
--@layout stream
--[[
  Stream text: ack.lua's ranges are refused (RQ_BAD_ARGUMENT, before any
  write): the client sends this script triples alone.
]]
--@end
--@flags allow-oom
--@include group_keys
--@include group_names
--@include group_args
--@include record_event
--@layout stream
--@include settle
-- A call's own deliveries (a stream log's): made on their path alone.
--@lazy callPaths call_state call_ack
--@end
--@include ack_held_one
--@include layout
--@include result_keys

-- A stream key only (includes/layout.lua says why).
local wrongLayout = string.byte(msgsKey, -1) == LOG_STREAM_BYTE and checkLayout(metaKey, msgsKey)
if wrongLayout then
  return wrongLayout
end

local ttl = ARGV[8]
local badTtl = resultTtlError(ttl, 'ARGV[8]')
if badTtl then
  return redis.error_reply(badTtl)
end
local mode = ARGV[10]
local events = mode == '1' or mode == '1l'
local lenient = mode == '0l' or mode == '1l'
if not events and not lenient and mode ~= '0' then
  return redis.error_reply('RQ_BAD_ARGUMENT the mode (ARGV[10]) is not "0", "1", "0l" or "1l": ' .. tostring(mode))
end
if #ARGV < 13 or (#ARGV - 10) % 3 ~= 0 then
  return redis.error_reply('RQ_BAD_ARGUMENT ack_result takes tags in threes (ARGV[11..])')
end
--@layout stream
-- A range (includes/ack_ranges.lua) is ack's and fetch's alone: a result, a
-- result key and an event go per tag, by position. Ranges come first, so
-- the first tag's count tells.
if string.byte(ARGV[12], 1) == 114 then -- 114: 'r'
  return redis.error_reply('RQ_BAD_ARGUMENT ack_result takes tags, not ranges (ARGV[12]): '
    .. string.sub(ARGV[12], 1, 40))
end
--@end
local tagCount = (#ARGV - 10) / 3
if ttl == '' and ARGV[9] ~= '' then
  return redis.error_reply('RQ_BAD_ARGUMENT results (ARGV[9]) without a time to live (ARGV[8])')
end
-- Each result, and its key: the last tagCount keys (includes/result_keys.lua).
local results, firstResultKey = {}, #KEYS - tagCount
if ttl ~= '' then
  local blob, at = ARGV[9], 1
  while at <= #blob and #results < tagCount do
    local _, colon, length = string.find(blob, '^(%d+):', at)
    if colon == nil or colon + length > #blob then
      break
    end
    results[#results + 1] = string.sub(blob, colon + 1, colon + length)
    at = colon + length + 1
  end
  if #results ~= tagCount or at ~= #blob + 1 then
    return redis.error_reply('RQ_BAD_ARGUMENT ARGV[9] does not hold one result per tag as "<length>:<bytes>"')
  end
  local seqs = {}
  for i = 1, tagCount do
    seqs[i] = ARGV[8 + 3 * i]
  end
  local badKey = resultKeysError(firstResultKey, seqs, results)
  if badKey then
    return redis.error_reply(badKey)
  end
end

-- What the ack keeps besides, for the tags whose status is "ok": called
-- once the ack is applied.
local function keep(statuses)
  for i, status in ipairs(statuses) do
    if status == 'ok' then
      if ttl ~= '' then
        keepResult(KEYS[firstResultKey + i], results[i], ttl)
      end
      if events then
        recordEvent('completed', ARGV[8 + 3 * i], '', '')
      end
    end
  end
  if lenient then
    return statuses
  end
  return {'ok'}
end

local one = ackHeldOne(11)
if one ~= nil then
  return keep(one)
end

--@include ack_tags

local result, err = ackTags(not lenient, 11)
if result == nil then
  return redis.error_reply(err)
end
return keep(result)
