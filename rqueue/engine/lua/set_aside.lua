--[[
  Dead-letters the deliveries a consumer's client set aside unrun from the
  fetch that handed them out: records that do not parse, messages past
  their time to live, messages settled before Redis lost acks. One call for
  all of them, so that a fetch of n set aside costs one round trip more,
  not n. Each tag is judged and dead-lettered as reject.lua does it alone;
  one that may not be settled changes nothing and the others go on. For a
  queue that keeps results, each one dead-lettered keeps its failure in the
  same call, so that a caller waiting for its result learns why it never
  ran (includes/result_keys.lua).

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua)
    KEYS[18..] when ARGV[8] is not "", the result key of each tag's
      message for this group, in the tags' order
      (<base>:result:<seq>:<group>)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8] the results' time to live in ms, or "" to keep no result
    ARGV[9], ARGV[10], ... per tag: seq, delivery count, token, reason
      ("corrupted-record", "expired", "settled-before-loss", ...), error
      text for the record (may be ""), and "failed" or "expired" to record
      that event (its reason the error text, its dlq_seq the dead
      letter's) or "" for none; when ARGV[8] is not "", then the failure
      to keep, as rqueue/stored_results.py encodes it (its kind byte
      first). At most MAX_TAGS tags
  Output:
    one value per tag, in order: the seq of the message in the dead-letter
    queue (0 when dropped), or the error code of that tag (which keeps no
    result)
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  the time to live is not a whole number of ms >= 1,
                     the tags do not come in sixes (sevens with results),
                     there are more than MAX_TAGS, a tag's event is none of
                     those, a result is empty or its key is not the result
                     key of its tag's seq and the group, or the failure
                     policy (ARGV[7]) does not parse
    RQ_LAYOUT        KEYS[2] is the log key of the other layout than the
                     queue's (includes/layout.lua)
  Work: one reject per tag.
]]
--@flags allow-oom
--@include layout
--@include reject_one
--@include result_keys

-- A fetch hands out at most this many deliveries (rqueue/constants.py, MAX_FETCH).
local MAX_TAGS = 10000
local FIRST_RESULT_KEY = 17 -- the result keys follow the group layout's first 17

local wrongLayout = checkLayout(metaKey, msgsKey)
if wrongLayout then
  return wrongLayout
end
local ttl = ARGV[8]
local badTtl = resultTtlError(ttl, 'ARGV[8]')
if badTtl then
  return redis.error_reply(badTtl)
end
local width = ttl == '' and 6 or 7
local tags = (#ARGV - 8) / width
if tags % 1 ~= 0 or tags < 0 or tags > MAX_TAGS then
  return redis.error_reply('RQ_BAD_ARGUMENT set_aside takes the group arguments and a time to live, then up to '
    .. MAX_TAGS .. ' tags of ' .. width .. ' (seq, count, token, reason, text, event'
    .. (width == 7 and ', result' or '') .. '); sent ' .. (#ARGV - 8) .. ' arguments after them')
end
local seqs, results = {}, {}
for i = 9, #ARGV, width do
  if ARGV[i + 5] ~= '' and ARGV[i + 5] ~= 'failed' and ARGV[i + 5] ~= 'expired' then
    return redis.error_reply('RQ_BAD_ARGUMENT set_aside records no event ' .. ARGV[i + 5] .. ' (ARGV[' .. (i + 5)
      .. ']: failed, expired or "")')
  end
  seqs[#seqs + 1] = ARGV[i]
  if width == 7 then
    results[#results + 1] = ARGV[i + 6]
  end
end
if width == 7 then
  if #KEYS ~= FIRST_RESULT_KEY + tags then
    return redis.error_reply('RQ_BAD_ARGUMENT set_aside keeping results takes ' .. FIRST_RESULT_KEY .. ' keys and '
      .. 'one result key per tag, ' .. (FIRST_RESULT_KEY + tags) .. ' in all; sent ' .. #KEYS)
  end
  local badKey = resultKeysError(FIRST_RESULT_KEY, seqs, results)
  if badKey then
    return redis.error_reply(badKey)
  end
end
local out = {}
for i = 9, #ARGV, width do
  local dseq, err = rejectOne(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5])
  out[#out + 1] = dseq or string.match(err, '^%S+')
  if dseq and width == 7 then
    keepResult(KEYS[FIRST_RESULT_KEY + #out], ARGV[i + 6], ttl)
  end
end
return out
