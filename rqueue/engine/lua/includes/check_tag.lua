--[[
  Classifies a delivery tag (seq, count, token) presented by consumerName,
  given the message's delivery state d (nil when there is none). A delivery
  state exists exactly while the message is delivered and unsettled, so the
  floor and the acked runs are read only to name the error.
  Returns one of:
    "ok"              the tag may settle the message
    "RQ_ACKED"        the group already settled seq
    "RQ_UNKNOWN_TAG"  no such delivery was made: also a tag whose token is
                      not the delivery's (another group's, queue's or server
                      incarnation's delivery of the same seq and count)
    "RQ_NOT_HELD"     this consumer never held that delivery
    "RQ_CORRUPT"      the message is leased but has no delivery state
    "RQ_STALE"        the delivery was settled explicitly (nacked) by this
                      consumer, or it is no longer held: its lease ran out
                      or a newer delivery exists (with lateOk, only while
                      a newer delivery is out: a late ack of a message
                      waiting to be handed out again completes it)
]]
--@include group_keys
--@include group_names
--@include delivery_state
local function checkTag(seq, count, token, d, lateOk)
  -- Written so that NaN (tonumber('nan')) fails too. A token is a letter
  -- then letters and digits (TOKEN_MAX at most): one holding ':', '=' or a
  -- newline could match a piece of a state or of its history.
  if seq == nil or count == nil or not (seq >= 1 and count >= 1) or seq % 1 ~= 0 then
    return 'RQ_UNKNOWN_TAG'
  end
  if token == nil or #token > TOKEN_MAX or not string.find(token, '^%l[%l%d]*$') then
    return 'RQ_UNKNOWN_TAG'
  end
  if d == nil then
    local floor = tonumber(rcall('HGET', floorsKey, groupName) or '0')
    if not (floor and floor >= 0 and floor % 1 == 0) then
      error('RQ_CORRUPT ' .. floorsKey .. ' field ' .. groupName .. ' (the ack floor) holds '
        .. string.sub(rcall('HGET', floorsKey, groupName), 1, 40) .. ', not a seq')
    end
    if seq <= floor then
      return 'RQ_ACKED'
    end
    -- The first acked run that ends at or above seq holds it if it starts
    -- at or below it (includes/acked_runs.lua).
    -- seq as a number: '%d' would wrap one of 2^63 or more (an error path).
    local run = rcall('ZRANGEBYSCORE', ackedKey, seq, '+inf', 'LIMIT', '0', '1')
    if run[1] ~= nil and run[1] + 0 <= seq then
      return 'RQ_ACKED'
    end
    if rcall('ZSCORE', leaseKey, seq) then
      -- Leased, so delivered and unsettled: its state was deleted.
      return 'RQ_CORRUPT'
    end
    return 'RQ_UNKNOWN_TAG'
  end
  if count > d.count then
    return 'RQ_UNKNOWN_TAG'
  end
  if count == d.count and d.holder == consumerName then
    if token ~= d.token then
      return 'RQ_UNKNOWN_TAG'
    end
    return 'ok'
  end
  if count == d.count and d.holder ~= '' then
    return 'RQ_NOT_HELD'
  end
  -- An earlier delivery, or the current one after its lease was taken back.
  if settledBy(d, count, consumerName, token) then
    return 'RQ_STALE'
  end
  if not receivedBy(d, count, consumerName, token) then
    return 'RQ_NOT_HELD'
  end
  -- A late ack completes the message only while no newer delivery of it is
  -- out: once it was handed out again, a handler may be about to start on
  -- it, and no handler runs for an acked message (guarantee 3).
  if lateOk and d.holder == '' then
    return 'ok'
  end
  return 'RQ_STALE'
end
