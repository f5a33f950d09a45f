--[[
  Acknowledges deliveries of one consumer. A tag is a (seq, count, token)
  triple: the count-th delivery of seq in this group, made by the fetch
  call whose token it carries.

  A tag is accepted when it is the current delivery held by this consumer,
  or when it is a delivery this consumer received whose lease ran out, of a
  message that is still unsettled and that nobody holds now (the work was
  done: a late ack completes the message). Once a newer delivery is out,
  it is RQ_STALE: its holder may be about to start a handler on it.

  Input:
    KEYS[1..13] the first 13 of the group layout (includes/group_keys.lua):
      every key an ack can touch
    ARGV[1] group name, ARGV[2] consumer name: the first two of the group
      arguments (includes/group_names.lua), not the whole block: an ack
      reads no clock and no setting, and every argument costs the call
    ARGV[3] strict: "1" = all tags or none, "0" = settle what is valid
    ARGV[4], ARGV[5], ... seq1, count1, token1, seq2, count2, token2, ...
  Output:
    one status per tag, in order: "ok", or the error code of that tag
  Errors (strict only; nothing is changed):
    RQ_ACKED <tag>        the group has already settled that message
    RQ_UNKNOWN_TAG <tag>  no such delivery was ever made (or the token is
                          not that delivery's)
    RQ_NOT_HELD <tag>     this consumer never held that delivery
    RQ_STALE <tag>        this consumer nacked that delivery
    RQ_CORRUPT <tag>      the message's delivery state does not parse, or
      is missing though the message is leased (its lease runs out and fetch
      moves it to the dead-letter queue)
  RQ_LAYOUT: KEYS[2] is a stream log key and the queue's log is not a
    stream (includes/layout.lua; a hash key is not checked): nothing is
    changed.
  Error of any ack (not a tag's): RQ_CORRUPT <floors key> field <group>:
    the group's ack floor is not a seq; raised before any write, so the
    delivery stays held (rqueue doctor names the floor, docs/doctor.md)
]]
--@layout stream
--[[
  Stream text: the tags may open with ranges of a call record's deliveries
  (includes/ack_ranges.lua), each three ARGV as a tag is:
    <first seq>, "r<in>[,<gap>,<in>...]", <token>
  every seq of it the tag (seq, 1, token). The reply has one element per
  range, "ok" when every seq of it is ok, else a list of one status per seq
  in seq order; then one status per tag. RQ_BAD_ARGUMENT (nothing is
  changed): a range that does not parse, or spans more than RANGE_MAX seqs.
  A strict ack checks the tags before the ranges' seqs that are not on
  their call, so its error may name another bad tag than the first in the
  caller's order (the client sends a refused one again as triples).
]]
--@end
--@flags allow-oom
--@layout stream
--@include group_keys
--@include group_names
--@include settle
-- A call's own deliveries (a stream log's): made on their path alone.
--@lazy callPaths call_state call_ack
--@end
--@include ack_held_one
--@include layout

-- A stream key only (includes/layout.lua says why).
--@layout stream
local wrongLayout = string.byte(msgsKey, -1) == LOG_STREAM_BYTE and checkLayout(metaKey, msgsKey)
if wrongLayout then
  return wrongLayout
end
--@end

local one = ackHeldOne(4)
if one ~= nil then
  return one
end

--@include ack_tags

local result, err = ackTags(ARGV[3] == '1', 4)
if result == nil then
  return redis.error_reply(err)
end
return result
