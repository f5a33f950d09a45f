--[[
  A failed attempt (nack, expired lease, dead holder): the message is
  dead-lettered once it had max_deliveries, or (reason "deadline") once it
  is older than the retry deadline (its publish time, read from its
  record), else offered again after delayMs, or after the redelivery
  policy's delay when delayMs is nil.
  Returns "dead" and the dead-letter seq (0 when dropped), or the due time
  in ms. settled: the holder failed it itself (nack), see release.
]]
--@include log_one
--@include group_keys
--@include group_args
--@include delivery_state
--@include release
--@include requeue
--@include redelivery_delay
--@include dead_letter
-- The publish time (ms, a number) of a record in either form
-- (includes/record.lua), or nil when it is missing or does not parse. Not
-- recordPublished, which gives the time as text: a script may include both.
local function recordPublishedMs(rec)
  if not rec then
    return nil
  end
  if string.byte(rec, 1) == 126 then -- '~': the compact form, 6 bytes big-endian
    if #rec < 7 then
      return nil
    end
    local ms = 0
    for i = 2, 7 do
      ms = ms * 256 + string.byte(rec, i)
    end
    return ms
  end
  return tonumber(string.match(rec, '^%d*:(%d+):') or '')
end

-- Whether a failed attempt of seq (delivery state d) dead-letters it under
-- policy, and why ("max-deliveries" or "deadline"). It writes nothing.
local function failedForGood(seq, d, policy)
  if policy.maxDeliveries ~= -1 and d.count >= policy.maxDeliveries then
    return true, 'max-deliveries'
  end
  if policy.deadline > 0 then
    local published = recordPublishedMs(logRead(msgsKey, sideKey, seq, pinnedKey))
    if published and now - published >= policy.deadline then
      return true, 'deadline'
    end
  end
  return false, 'max-deliveries'
end

local function retryOrDeadLetter(seq, d, delayMs, errText, settled)
  local policy = failurePolicy() -- before release(), as in deadLetter
  local dead, reason = failedForGood(seq, d, policy)
  if dead then
    deadLetterSeqFree() -- before release() too
  end
  release(seq, d, settled)
  if dead then
    return 'dead', deadLetter(seq, d, reason, errText)
  end
  writeDelivery(dlvKey, seq, d)
  if delayMs == nil then
    delayMs = redeliveryDelay(policy, d.count, seq)
  end
  requeue(seq, delayMs)
  return now + delayMs
end
