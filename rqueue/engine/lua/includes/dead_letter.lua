--[[
  Moves a message into the queue's dead-letter queue (KEYS[15], KEYS[16]),
  or drops it and counts it when the failure policy says "drop", and settles
  it for this group, in the same atomic call. The dead letter keeps the
  message's own headers and payload, with the x-rq-* headers below added.
  A message whose record is gone (deleted) is dead-lettered without payload
  and headers, with the reason "missing-record", so that its loss is seen.
  Returns the dead-letter seq, or 0 when dropped; then the reason and the
  error text it kept (either may differ from those given: a missing or
  corrupt record is named so, and the text is cut to its limit).
  Errors: RQ_BAD_ARGUMENT (the failure policy does not parse), and
  RQ_CORRUPT (the dead-letter queue's next seq holds a dead letter: its
  meta hash was deleted), raised before any write.
]]
--@include log_one
--@include layout
--@include group_keys
--@include group_names
--@include group_args
--@include record
--@include record_event
--@include complete
--@include text_prefix
local MAX_ERROR_TEXT = 1024 -- bytes of the last error kept on a dead letter

local function deliveryHeaders(headers, seq, d, reason, errText, published)
  headers['x-rq-queue'] = failurePolicy().queueName
  headers['x-rq-published'] = tostring(published)
  headers['x-rq-group'] = groupName
  headers['x-rq-seq'] = tostring(seq)
  headers['x-rq-reason'] = reason
  -- The queue's incarnation (meta field "inc"): replay.lua leaves a dead
  -- letter of an earlier incarnation alone, whose seq names another message.
  local inc = rcall('HGET', metaKey, 'inc')
  if inc and inc ~= '' then
    headers['x-rq-incarnation'] = inc
  end
  headers['x-rq-deliveries'] = tostring(d.count)
  headers['x-rq-first-delivery'] = tostring(d.first)
  headers['x-rq-last-delivery'] = tostring(d.last)
  if errText ~= nil and errText ~= '' then
    headers['x-rq-error'] = textPrefix(errText, MAX_ERROR_TEXT)
  end
  return headers
end

-- The dead-letter queue's next seq must be free: with its meta hash gone
-- (deleted) it would overwrite a dead letter. RQ_CORRUPT otherwise; and
-- RQ_LAYOUT when its log has the other layout (includes/layout.lua). Callers
-- ask before their first write (deadLetter does too).
local function deadLetterSeqFree()
  if failurePolicy().deadLetterMode == 'drop' then
    return
  end
  local dlqMeta = rcall('HMGET', dlqMetaKey, 'seq', 'layout')
  local wrongLayout = layoutProblem(dlqMetaKey, dlqMsgsKey, dlqMeta[2], dlqMeta[1])
  if wrongLayout then
    error(wrongLayout)
  end
  local nextSeq = (tonumber(dlqMeta[1] or '0') or 0) + 1
  if logTaken(dlqMsgsKey, nextSeq) then
    error('RQ_CORRUPT ' .. dlqMetaKey .. ' field seq (the last dead letter) is '
      .. (rcall('HGET', dlqMetaKey, 'seq') or 'missing') .. ', but dead letter ' .. nextSeq .. ' exists in ' .. dlqMsgsKey)
  end
  return dlqMeta[2]
end

local function deadLetter(seq, d, reason, errText)
  local policy = failurePolicy() -- before any write: a policy that does not parse stops the call here
  local rec = logRead(msgsKey, sideKey, seq, pinnedKey)
  local dlqLayout = deadLetterSeqFree()
  d = d or {count = 0, holder = '', first = '', last = '', past = ''}
  complete(seq, d)
  if rec == false then
    errText = 'record of seq ' .. seq .. ' is missing from ' .. msgsKey .. ' (' .. reason .. ': ' .. (errText or '') .. ')'
    reason = 'missing-record'
  end
  if policy.deadLetterMode == 'drop' then
    rcall('HINCRBY', groupKey, 'dropped', 1)
    recordEvent('dropped', seq, reason)
    return 0, reason, errText and textPrefix(errText, MAX_ERROR_TEXT) or ''
  end
  local headers, payload, published = {}, '', ''
  if rec then
    headers, payload = splitRecord(rec)
    published = recordPublished(rec) or ''
  end
  if headers == nil then
    -- Kept byte for byte so that nothing is lost; the reason says why.
    headers, payload, reason = {}, rec, 'corrupted-record'
  end
  headers = deliveryHeaders(headers, seq, d, reason, errText, published)
  local dseq = rcall('HINCRBY', dlqMetaKey, 'seq', 1)
  markLayout(dlqMetaKey, dlqMsgsKey, dlqLayout)
  logWriteOne(dlqMsgsKey, dseq, makeRecord('', now, cjson.encode(headers), payload))
  rcall('HINCRBY', groupKey, 'dead_lettered', 1)
  recordEvent('dead-lettered', seq, reason, dseq)
  return dseq, reason, headers['x-rq-error'] or ''
end
