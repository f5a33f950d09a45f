--[[
  A failed attempt (nack, expired lease, dead holder): the message is
  dead-lettered once it had max_deliveries, else offered again after
  delayMs, or after the redelivery policy's delay when delayMs is nil.
  Returns "dead" and the dead-letter seq (0 when dropped), or the due time
  in ms. settled: the holder failed it itself (nack), see release.
]]
--@include group_keys
--@include group_args
--@include delivery_state
--@include release
--@include requeue
--@include redelivery_delay
--@include dead_letter
local function retryOrDeadLetter(seq, d, delayMs, errText, settled)
  local policy = failurePolicy() -- before release(), as in deadLetter
  local dead = policy.maxDeliveries ~= -1 and d.count >= policy.maxDeliveries
  if dead then
    deadLetterSeqFree() -- before release() too
  end
  release(seq, d, settled)
  if dead then
    return 'dead', deadLetter(seq, d, 'max-deliveries', errText)
  end
  writeDelivery(dlvKey, seq, d)
  if delayMs == nil then
    delayMs = redeliveryDelay(policy, d.count, seq)
  end
  requeue(seq, delayMs)
  return now + delayMs
end
