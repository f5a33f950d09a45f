--[[
  Dead-letters the deliveries a consumer's client set aside unrun from the
  fetch that handed them out: records that do not parse, messages past
  their time to live, messages settled before Redis lost acks. A delivery
  set aside as "not-due" (a claim took a delayed message before its time:
  the queue's schedule, <base>:sched, lacked its seq) is not dead-lettered:
  it is taken back and waits in the group's delay set until its time, with
  no delivery state, as a fetch's scan leaves a delayed message it passes,
  and a "corrupt" event names it. One call for
  all of them, so that a fetch of n set aside costs one round trip more,
  not n. Each tag is judged and dead-lettered as reject.lua does it alone;
  one that may not be settled changes nothing and the others go on. For a
  queue that keeps results, each one dead-lettered keeps its failure in the
  same call, with the reason and error text its dead letter got, so that a
  caller waiting for its result learns why it never ran
  (includes/result_keys.lua).

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua)
    KEYS[18..] when ARGV[8] is not "", the result key of each tag's
      message for this group, in the tags' order
      (<base>:result:<seq>:<group>)
    then, for a stream log only, its side hash (includes/group_keys.lua)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the results' time to live in ms, or "" to keep no result
    ARGV[9], ARGV[10], ... per tag, six: seq, delivery count, token, reason
      ("corrupted-record", "expired", "settled-before-loss", ...), error
      text for the record (may be ""), and "failed" or "expired" to record
      that event (its reason the error text, its dlq_seq the dead
      letter's) or "" for none. At most MAX_TAGS tags. Reason "not-due":
      the text is the message's not-before (ms), the event "".
  Output:
    one value per tag, in order: the seq of the message in the dead-letter
    queue (0 when dropped), "deferred" for a "not-due" tag taken back, or
    the error code of that tag (which keeps no result)
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  there is no ARGV[8], the time to live is not a whole
                     number of ms from 1 to MAX_RESULT_TTL_MS, the tags do
                     not come in sixes, there are more than MAX_TAGS, a
                     tag's event is none of those, a seq is not written as
                     one while results are kept, a result key is not the
                     one of its tag's seq and the group, the failure
                     policy (ARGV[7]) does not parse, or a "not-due" tag's
                     not-before is not a whole number of ms, or it has an
                     event
    RQ_LAYOUT        KEYS[2] is the log key of the other layout than the
                     queue's (includes/layout.lua)
  Work: one reject per tag.
]]
--@flags allow-oom
--@include layout
--@layout stream
--@include group_keys
--@include group_names
--@include bulk
-- Call records (a stream log's first deliveries): split out when named.
--@lazy callPaths call_state
--@end
--@include reject_one
--@include result_keys
--@include release
--@include record_event

-- The reason of a tag handed out before its time (see above).
local NOT_DUE = 'not-due'

-- Takes back the delivery of a "not-due" tag: it waits in the group's delay
-- set until notBefore (ms, text), with no delivery state, as the scan
-- leaves a delayed message it passes. Returns "deferred", or nil and the
-- tag's error text (heldTag's), having changed nothing.
local function deferOne(seqText, countText, token, notBefore)
  local seq, d = heldTag(seqText, countText, token)
  if not seq then
    return nil, d
  end
  release(seq, d, false)
  rcall('HDEL', dlvKey, seq)
  rcall('ZADD', delayKey, notBefore, seq)
  recordEvent('corrupt', string.format('%d', seq), 'seq ' .. seq .. ' was handed out before its time ('
    .. notBefore .. ' ms), unrun: the schedule ' .. string.sub(metaKey, 1, -5) .. 'sched lacked it; it waits in '
    .. delayKey .. ' until then')
  return 'deferred'
end

-- A fetch hands out at most this many deliveries (rqueue/constants.py, MAX_FETCH).
local MAX_TAGS = 10000
--@layout hash
local FIRST_RESULT_KEY = 17 -- the result keys follow the group layout's first 17
--@end
--@layout stream
-- The result keys follow the group layout's first 17, and a stream log's
-- call keys (includes/group_keys.lua).
local FIRST_RESULT_KEY = callsKey and 20 or 17
--@end

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end
if #ARGV < 8 then
  return redis.error_reply('RQ_BAD_ARGUMENT set_aside takes the group arguments and a result time to live '
    .. '(ARGV[8], "" for none), then tags; sent ' .. #ARGV .. ' arguments')
end
local ttl = ARGV[8]
local badTtl = resultTtlError(ttl, 'ARGV[8]')
if badTtl then
  return redis.error_reply(badTtl)
end
local tags = (#ARGV - 8) / 6
if tags % 1 ~= 0 or tags > MAX_TAGS then
  return redis.error_reply('RQ_BAD_ARGUMENT set_aside takes up to ' .. MAX_TAGS .. ' tags of six (seq, count, '
    .. 'token, reason, text, event) after ARGV[8]; sent ' .. (#ARGV - 8) .. ' arguments after it')
end
local seqs = {}
for i = 9, #ARGV, 6 do
  if ARGV[i + 5] ~= '' and ARGV[i + 5] ~= 'failed' and ARGV[i + 5] ~= 'expired' then
    return redis.error_reply('RQ_BAD_ARGUMENT set_aside records no event ' .. ARGV[i + 5] .. ' (ARGV[' .. (i + 5)
      .. ']: failed, expired or "")')
  end
  if ARGV[i + 3] == NOT_DUE and (not string.find(ARGV[i + 4], '^%d+$') or ARGV[i + 5] ~= '') then
    return redis.error_reply('RQ_BAD_ARGUMENT a ' .. NOT_DUE .. ' tag takes its not-before in ms and no event (ARGV['
      .. (i + 4) .. '] and ARGV[' .. (i + 5) .. ']), not ' .. string.format('%q', string.sub(ARGV[i + 4], 1, 40))
      .. ' and ' .. string.format('%q', string.sub(ARGV[i + 5], 1, 40)))
  end
  seqs[#seqs + 1] = ARGV[i]
end
if ttl ~= '' then
  local want = FIRST_RESULT_KEY + tags + (sideKey and 1 or 0) -- a stream log's side hash last
  if #KEYS ~= want then
    return redis.error_reply('RQ_BAD_ARGUMENT set_aside keeping results takes ' .. FIRST_RESULT_KEY .. ' keys and '
      .. 'one result key per tag' .. (sideKey and ', then the side hash, ' or ', ') .. want .. ' in all; sent ' .. #KEYS)
  end
  local badKey = resultKeysError(FIRST_RESULT_KEY, seqs)
  if badKey then
    return redis.error_reply(badKey)
  end
end
local out = {}
for i = 9, #ARGV, 6 do
  if ARGV[i + 3] == NOT_DUE then
    local deferred, err = deferOne(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 4])
    out[#out + 1] = deferred or string.match(err, '^%S+')
  else
    local dseq, reason, text = rejectOne(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5])
    out[#out + 1] = dseq or string.match(reason, '^%S+')
    if dseq and ttl ~= '' then
      keepResult(KEYS[FIRST_RESULT_KEY + #out], failureResult(reason, text), ttl)
    end
  end
end
return out
