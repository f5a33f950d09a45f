--[[
  Returns dead letters to the group that dead-lettered them, and only to it:
  the original seq is reopened for that group (the other groups never see it
  again), with a fresh delivery count, ready ahead of new messages. The dead
  letter is deleted in the same call, so a replay run twice, or killed
  midway, neither doubles nor loses a message.

  A replayed message's stored result for this group (the outcome of the
  run before the replay, docs/results.md) is deleted in the same call: the
  message is unsettled again, and q.result waits for the outcome of a
  later delivery rather than answer with the old one.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua) of the group
      named in the dead letters' x-rq-group header
    KEYS[18..] per dead-letter seq of ARGV[8..], in their order, the result
      key of the message it holds for this group
      (<base>:result:<seq>:<group>, its x-rq-seq header), or any other key
      of the queue's slot (the meta key) when that seq is not known: a key
      that is not the result key of the seq replayed is left alone
    in a stream log, the group's call keys come right after the first 17
      (includes/group_keys.lua) and the result keys after them; then its
      side hash, last (includes/group_keys.lua), where a reopened seq's
      stub has its record: the record kept beside the pins is the one a
      read of the seq finds (includes/log_one.lua, logWriteNew)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8], ARGV[9], ... seqs in the dead-letter queue
  Output:
    one status per dead-letter seq: "replayed", "missing" (not there any
    more: replayed or purged before), "other-group" (it belongs to another
    queue or group; left alone), "other-incarnation" (its x-rq-incarnation
    header names another incarnation of the queue than meta field "inc":
    the queue was made again since, and its seq is another message's; left
    alone), "corrupt" (headers do not parse; left alone),
    "pending" (the group already has that seq open, or out on a call;
    left alone), "unread"
    (above the group's cursor and ack floor, and not in its acked runs: a
    reset moved the group back over it and its fetches hand it out again;
    left alone), "lost" (a missing-record dead
    letter: its record was lost, there is nothing to replay; left alone)
  Errors (nothing is changed):
    RQ_LAYOUT        the log key is of the other layout than the queue's, or
                     a stream log's call was not sent its side hash or its
                     call keys
    RQ_BAD_ARGUMENT  the failure policy (ARGV[7]) does not parse
    RQ_CORRUPT       the group's ack floor is not a seq, or a call record
                     does not parse
]]
--@flags allow-oom
--@include log_one
--@include group_keys
--@include group_names
--@include group_args
--@include delivery_state
--@include record
--@include record_event
--@include layout
--@layout stream
-- Call records (a stream log's first deliveries): a seq out on one is
-- pending (includes/call_state.lua).
--@include call_state
--@end

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end
--@layout stream
-- A group fetched on calls hands a seq out again after a reset back over
-- it; a call sent no call keys could not tell it is out.
callsOut()
--@end
-- What takes a reopened seq out of its acked run: made only when a replay
-- reopens a seq above the floor.
--@lazy ackedRuns acked_runs

-- The headers rqueue adds when it dead-letters a message (includes/dead_letter.lua).
local DEAD_LETTER_HEADERS = {
  'x-rq-queue', 'x-rq-published', 'x-rq-group', 'x-rq-seq', 'x-rq-reason', 'x-rq-deliveries',
  'x-rq-first-delivery', 'x-rq-last-delivery', 'x-rq-error', 'x-rq-incarnation',
}

-- The result keys follow the group layout's first 17, one per dead-letter
-- seq (ARGV[8..]): ARGV[i]'s is KEYS[FIRST_RESULT_KEY + i - 7].
--@layout hash
local FIRST_RESULT_KEY = 17
--@end
--@layout stream
-- In a stream log they follow the call keys too (includes/group_keys.lua).
local FIRST_RESULT_KEY = callsKey and 20 or 17
--@end
local resultBase = string.sub(metaKey, 1, -5) .. 'result:'

-- Whether the group settled seq above its ack floor since its last reset
-- (a reset clears the acked runs): a seq above the cursor there was handed
-- out apart from the cursor (a priority or keyed message), and the scan
-- passes over it (fetch.lua), so a replay hands it out once.
local function inAckedRun(seq)
  local run = rcall('ZRANGEBYSCORE', ackedKey, string.format('%d', seq), '+inf', 'LIMIT', '0', '1')
  return run[1] ~= nil and run[1] + 0 <= seq
end

local out = {}
local groups = rcall('HLEN', floorsKey)
-- The floor is compared below: garbage is named before anything changes.
local floorText = rcall('HGET', floorsKey, groupName)
local floorNow = tonumber(floorText or '0')
if not (floorNow and floorNow >= 0 and floorNow % 1 == 0) then
  return redis.error_reply('RQ_CORRUPT ' .. floorsKey .. ' field ' .. groupName .. ' (the ack floor) holds '
    .. string.sub(floorText, 1, 40) .. ', not a seq')
end
for i = 8, #ARGV do
  local dseq = ARGV[i]
  -- The dead-letter queue's side hash is not sent: a dead letter is never
  -- a stub (includes/dead_letter.lua), so a stub there is a message
  -- published to that queue, no dead letter of this group.
  local rec, stub = logRead(dlqMsgsKey, nil, dseq)
  local status = 'replayed'
  if stub then
    status = 'other-group'
  elseif not rec then
    status = 'missing'
  else
    local headers, payload = splitRecord(rec)
    local seq = headers and tonumber(headers['x-rq-seq'])
    if headers == nil or seq == nil or not (seq >= 1) or seq % 1 ~= 0 then
      status = 'corrupt'
    elseif headers['x-rq-group'] ~= groupName or headers['x-rq-queue'] ~= failurePolicy().queueName then
      status = 'other-group'
    elseif headers['x-rq-incarnation'] ~= nil
      and headers['x-rq-incarnation'] ~= (rcall('HGET', metaKey, 'inc') or '') then
      -- The queue was deleted (or lost to Redis) and made again since: its
      -- seq is another message's now, and reopening it would hand that one
      -- out again.
      status = 'other-incarnation'
    elseif headers['x-rq-reason'] == 'missing-record' then
      status = 'lost'
    elseif rcall('HEXISTS', dlvKey, seq) == 1 then
      status = 'pending'
    --@layout stream
    elseif callsKey and callStateOf(seq) then
      status = 'pending'
    --@end
    elseif seq > tonumber(rcall('HGET', groupKey, 'cursor') or '0') and seq > floorNow and not inAckedRun(seq) then
      -- Above the cursor and unsettled: a reset moved the group back over
      -- it, and its fetches hand it out again; reopened as well, it would go
      -- out twice.
      status = 'unread'
    else
      local published = headers['x-rq-published'] or tostring(now)
      local reason = headers['x-rq-reason']
      local earlier = string.match(headers['x-rq-deliveries'] or '', '^%d+$') or '0'
      for _, name in ipairs(DEAD_LETTER_HEADERS) do
        headers[name] = nil
      end
      local hjson = ''
      if next(headers) ~= nil then
        hjson = cjson.encode(headers)
      end
      -- Reopen seq for this group only: it leaves the acked runs (seqs under
      -- the floor stay under it), joins the group's reopen set, and its
      -- record is pinned so that no other group's progress deletes it.
      if seq > tonumber(rcall('HGET', floorsKey, groupName) or '0') then
        --@make ackedRuns
        removeAckedSeq(seq)
      end
      rcall('ZADD', reopenKey, seq, seq)
      rcall('HINCRBY', pinnedKey, seq, 1)
      local record = makeRecord('', published, hjson, payload)
      if reason == 'corrupted-record' and hjson == '' and splitRecord(payload) ~= nil then
        -- A compact record that a consumer unable to read that form moved
        -- aside byte for byte (docs/upgrading.md): it goes back as it was.
        record = payload
      end
      if logWriteNew(msgsKey, seq, record, pinnedKey, sideKey) and not logIsStream(msgsKey) then
        -- It had been deleted, so every group had settled it (a stream log
        -- keeps no settled counts: its trim follows the lowest floor).
        rcall('HSET', settledKey, seq, groups)
      end
      -- Its count starts again (max_deliveries counts from the replay); the
      -- history's replay line keeps how many deliveries came before, for
      -- fetch to report (includes/delivery_state.lua).
      writeDelivery(dlvKey, seq, {count = 0, holder = '', first = now, last = now, past = '\n' .. earlier .. '^'})
      rcall('ZADD', readyKey, seq, seq)
      logDeleteOne(dlqMsgsKey, nil, dseq)
      if logIsStream(dlqMsgsKey) then
        -- a seq of the dead-letter queue now lacks its entry above the trim point, any seq
        -- (includes/missing_record.lua): "gaps" with no bound
        rcall('HSET', dlqMetaKey, 'gaps', '1')
        rcall('HDEL', dlqMetaKey, 'gaps_to')
      end
      -- The result of the run before the replay answers no more: the
      -- message is pending again. Only the key named as this seq's result
      -- for this group is deleted (a stand-in key, or the side hash, never).
      local resultKey = KEYS[FIRST_RESULT_KEY + i - 7]
      if resultKey ~= nil and resultKey == resultBase .. string.format('%d', seq) .. ':' .. groupName then
        rcall('DEL', resultKey)
      end
      rcall('HINCRBY', groupKey, 'replayed', 1)
      recordEvent('replayed', seq, reason, dseq)
    end
  end
  out[#out + 1] = status
end
return out
