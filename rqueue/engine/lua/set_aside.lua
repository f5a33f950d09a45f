--[[
  Dead-letters the deliveries a consumer's client set aside unrun from the
  fetch that handed them out: records that do not parse, messages past
  their time to live, messages settled before Redis lost acks. One call for
  all of them, so that a fetch of n set aside costs one round trip more,
  not n. Each tag is judged and dead-lettered as reject.lua does it alone;
  one that may not be settled changes nothing and the others go on.

  Input:
    KEYS[1..17] the group layout (includes/group_keys.lua)
    ARGV[1..7] the group arguments (includes/group_args.lua)
    ARGV[8], ARGV[9], ... per tag, six: seq, delivery count, token,
      reason ("corrupted-record", "expired", "settled-before-loss", ...),
      error text for the record (may be ""), and "failed" or "expired" to
      record that event (its reason the error text, its dlq_seq the dead
      letter's) or "" for none; at most MAX_TAGS tags
  Output:
    one value per tag, in order: the seq of the message in the dead-letter
    queue (0 when dropped), or the error code of that tag
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  the tags do not come in sixes, there are more than
                     MAX_TAGS, a tag's event is none of those, or the
                     failure policy (ARGV[7]) does not parse
    RQ_LAYOUT        KEYS[2] is the log key of the other layout than the
                     queue's (includes/layout.lua)
  Work: one reject per tag.
]]
--@flags allow-oom
--@include layout
--@include reject_one

-- A fetch hands out at most this many deliveries (rqueue/constants.py, MAX_FETCH).
local MAX_TAGS = 10000

local wrongLayout = checkLayout(metaKey, msgsKey)
if wrongLayout then
  return wrongLayout
end
local tags = (#ARGV - 7) / 6
if tags % 1 ~= 0 or tags < 0 or tags > MAX_TAGS then
  return redis.error_reply('RQ_BAD_ARGUMENT set_aside takes the group arguments, then up to ' .. MAX_TAGS
    .. ' tags of six (seq, count, token, reason, text, event); sent ' .. (#ARGV - 7) .. ' arguments after them')
end
for i = 13, #ARGV, 6 do
  if ARGV[i] ~= '' and ARGV[i] ~= 'failed' and ARGV[i] ~= 'expired' then
    return redis.error_reply('RQ_BAD_ARGUMENT set_aside records no event ' .. ARGV[i] .. ' (ARGV[' .. i
      .. ']: failed, expired or "")')
  end
end
local out = {}
for i = 8, #ARGV, 6 do
  local dseq, err = rejectOne(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5])
  out[#out + 1] = dseq or string.match(err, '^%S+')
end
return out
