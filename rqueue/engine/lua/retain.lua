--[[
  Applies a queue's retention settings and runs one bounded trim step
  (includes/retention.lua). Publishers call it at most every
  RETAIN_INTERVAL (rqueue/constants.py) per queue; Queue.trim() by hand.
  Retention keeps records every group settled until they are older than
  max_age or more than max_length seqs below the last; it never deletes a
  record some group has not settled.

  Input:
    KEYS[1] meta     hash  seq, trimmed, retain (includes/retain_mark.lua)
    KEYS[2] msgs     hash  seq -> record
    KEYS[3] floors   hash  group -> ack floor
    KEYS[4] settled  hash  seq -> groups that settled it above their floor
    KEYS[5] pinned   hash  seq -> groups that reopened it by replay
    KEYS[6] prio     zset  a stream log's only: the priority log
    KEYS[7] side     hash  a stream log's only: the records of the messages
                           published with a priority or a key (includes/
                           log.lua), up to 1,000 of which at or below the
                           trim point go per call (includes/side_sweep.lua)
    ARGV[1] now in ms, or "" for the server's TIME
    ARGV[2] max_age, ms, or "-" (unset)
    ARGV[3] max_length, seqs, or "-" (unset)
    ARGV[4] "1": store ARGV[2..3] as the queue's retention; "0": trim with
      the stored one (a client that does not know the settings)
    ARGV[5] the most seqs to trim in this call
  Output:
    { retained (1 while the queue is in retention mode), trimmed (the trim
      point), passed (seqs the trim point moved over in this call) }
  Errors (nothing is changed):
    RQ_BAD_ARGUMENT  a limit that is not "-" or a whole number >= 0, or a
                     step limit below 1
  Writes nothing to a queue without a meta hash and without retention.
]]
--@flags allow-oom
--@include read_now
--@include bulk
--@include retain_mark
local rcall = redis.call
local metaKey = KEYS[1]
local msgsKey = KEYS[2]
local floorsKey = KEYS[3]
local settledKey = KEYS[4]
local pinnedKey = KEYS[5]
-- A stream log's side hash, KEYS[7] when sent (the priority log KEYS[6]): its name is
-- compared, to tell it from the last key of a call sent none.
local sideKey = KEYS[#KEYS]
if #KEYS ~= 7 or string.byte(msgsKey, -1) ~= 103 or sideKey ~= string.sub(msgsKey, 1, -4) .. 'side' then -- 103: 'g' of ":log"
  sideKey = nil
end
--@include retention
--@include layout
--@include side_sweep

local wrongLayout = checkLayout(metaKey, msgsKey) or sideKeyError(msgsKey, sideKey)
if wrongLayout then
  return wrongLayout
end


local now = readNow(ARGV[1])
for i = 2, 3 do
  if ARGV[i] ~= '-' and not string.find(ARGV[i] or '', '^%d+$') then
    return redis.error_reply('RQ_BAD_ARGUMENT ARGV[' .. i .. '] must be "-" or a whole number, not ' .. tostring(ARGV[i]))
  end
end
local limit = tonumber(ARGV[5] or '')
if not (limit and limit >= 1 and limit % 1 == 0) then
  return redis.error_reply('RQ_BAD_ARGUMENT ARGV[5] (seqs per step) must be a whole number >= 1')
end

if sideKey then
  -- Before the step, which may move the trim point: what it passes goes
  -- at the next call, as at a fetch.
  sweepSide(metaKey, KEYS[6], sideKey)
end
local spec = rcall('HGET', metaKey, RETAIN)
if ARGV[4] == '1' then
  local want = ARGV[2] .. ' ' .. ARGV[3]
  if want == '- -' then
    -- Leaving retention mode: the trim step deletes what was kept until
    -- nothing is stored (below), since records kept above a floor are in
    -- no count that settling could finish.
    if spec and spec ~= want then
      spec = want
      rcall('HSET', metaKey, RETAIN, spec)
    end
  elseif spec ~= want then
    spec = want
    rcall('HSET', metaKey, RETAIN, spec)
  end
end
if not spec then
  return {0, tonumber(rcall('HGET', metaKey, 'trimmed') or '0') or 0, 0}
end
local trimmed, passed = trimRetained(spec, now, limit)
if spec == '- -' and trimmed >= (tonumber(rcall('HGET', metaKey, 'seq') or '0') or 0) then
  -- Nothing stored, nothing counted: settling deletes records again.
  rcall('HDEL', metaKey, RETAIN)
  return {0, trimmed, passed}
end
return {1, trimmed, passed}
