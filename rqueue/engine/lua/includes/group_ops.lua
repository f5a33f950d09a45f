--[[
  Moves of one message inside a group, shared by fetch, ack, nack, reject
  and leave. Needs group_keys, group_args, delivery_state, record, bulk,
  settle and redelivery included before it.
]]
local MAX_ERROR_TEXT = 1024 -- bytes of the last error kept on a dead letter
local EVENTS_MAX = 10000 -- entries kept in the events stream (approximately)

local function recordEvent(kind, seq, reason, extra)
  rcall('XADD', eventsKey, 'MAXLEN', '~', EVENTS_MAX, '*', 'event', kind, 'group', groupName,
    'seq', seq, 'reason', reason or '', 'at', now, 'dlq_seq', extra or '')
end

-- Takes the message away from its holder; the delivery count stays.
local function release(seq, d)
  rcall('ZREM', leaseKey, seq)
  if d.holder ~= '' then
    rcall('HINCRBY', consumersKey, d.holder, -1)
    rememberHolder(d)
    d.holder = ''
  end
end


-- Offers the message again, now or after delayMs.
local function requeue(seq, delayMs)
  if delayMs > 0 then
    rcall('ZADD', delayKey, now + delayMs, seq)
  else
    rcall('ZADD', readyKey, seq, seq)
  end
end

-- The group is done with the message: forget its delivery and settle it.
local function complete(seq, d)
  if d.holder == '' then
    rcall('ZREM', readyKey, seq)
    rcall('ZREM', delayKey, seq)
  end
  release(seq, d)
  rcall('HDEL', dlvKey, seq)
  settleMany({seq})
end

local function deliveryHeaders(headers, seq, d, reason, errText, published)
  headers['x-rq-queue'] = failurePolicy().queueName
  headers['x-rq-published'] = tostring(published)
  headers['x-rq-group'] = groupName
  headers['x-rq-seq'] = tostring(seq)
  headers['x-rq-reason'] = reason
  headers['x-rq-deliveries'] = tostring(d.count)
  headers['x-rq-first-delivery'] = tostring(d.first)
  headers['x-rq-last-delivery'] = tostring(d.last)
  if errText ~= nil and errText ~= '' then
    headers['x-rq-error'] = string.sub(errText, 1, MAX_ERROR_TEXT)
  end
  return headers
end

-- Moves the message into the dead-letter queue (or drops it, counted) and
-- settles it for this group, in the same atomic call. Returns the dead-letter
-- seq, or 0 when dropped.
local function deadLetter(seq, d, reason, errText)
  local policy = failurePolicy() -- before any write: a policy that does not parse stops the call here
  local rec = rcall('HGET', msgsKey, seq)
  d = d or {count = 0, holder = '', first = '', last = '', past = ''}
  complete(seq, d)
  if rec == false or policy.deadLetterMode == 'drop' then
    rcall('HINCRBY', groupKey, 'dropped', 1)
    recordEvent('dropped', seq, reason)
    return 0
  end
  local headers, payload = splitRecord(rec)
  local published = recordPublished(rec) or ''
  if headers == nil then
    -- Kept byte for byte so that nothing is lost; the reason says why.
    headers, payload, reason = {}, rec, 'corrupted-record'
  end
  headers = deliveryHeaders(headers, seq, d, reason, errText, published)
  local dseq = rcall('HINCRBY', dlqMetaKey, 'seq', 1)
  rcall('HSET', dlqMsgsKey, dseq, makeRecord('', now, cjson.encode(headers), payload))
  rcall('HINCRBY', groupKey, 'dead_lettered', 1)
  recordEvent('dead-lettered', seq, reason, dseq)
  return dseq
end

-- A message whose delivery state does not parse: moved aside, byte for
-- byte, so that it neither blocks the group nor is lost.
local function deadLetterCorruptState(seq, raw)
  failurePolicy() -- before the ZREM, as in deadLetter
  rcall('ZREM', leaseKey, seq)
  local d = {count = 0, holder = '', first = '', last = '', past = ''}
  deadLetter(seq, d, 'corrupted-state', 'delivery state does not parse: ' .. string.sub(raw, 1, 200))
end

-- A failed attempt (nack, expired lease, dead holder): dead-letter once the
-- message had max_deliveries, else offer it again under the policy.
-- Returns "dead" and the dead-letter seq (0 when dropped), or the due time in ms.
local function retryOrDeadLetter(seq, d, delayMs, errText)
  local policy = failurePolicy() -- before release(), as in deadLetter
  release(seq, d)
  if policy.maxDeliveries ~= -1 and d.count >= policy.maxDeliveries then
    return 'dead', deadLetter(seq, d, 'max-deliveries', errText)
  end
  writeDelivery(dlvKey, seq, d)
  if delayMs == nil then
    delayMs = redeliveryDelay(policy, d.count, seq)
  end
  requeue(seq, delayMs)
  return now + delayMs
end
