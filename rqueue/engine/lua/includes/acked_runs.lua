--[[
  The seqs a group settled above its ack floor, kept as runs of contiguous
  seqs: the acked key (KEYS[10]) is a sorted set whose members are the
  first seq of each run and whose scores are the last. Runs never touch: at
  least one unsettled seq lies between two of them, and between the floor
  and the first. A consumer that acks in order while another holds an old
  message adds to one run, so the set stays small however many seqs it
  holds, and the floor passes a whole run in one step when that message is
  settled. How many seqs the runs hold is the group hash's ACKED_ABOVE
  field (includes/group_keys.lua), kept by whoever changes the runs.
]]
--@include group_keys
--@include group_names
--@include bulk

-- Adds the run first..last (numbers; firstText and lastText the same as
-- strings, or nil) above the floor, merged with a run that ends right below
-- it or starts right above it. With mayMerge false the set is known to be
-- empty, and nothing is looked up. The caller adds last - first + 1 to
-- ACKED_ABOVE.
local function addAckedRun(first, last, firstText, lastText, mayMerge)
  local member = firstText or string.format('%d', first)
  local score = lastText or string.format('%d', last)
  if mayMerge then
    -- No run holds a seq of first..last, so the first two runs that end at
    -- or above first - 1 are the only ones that can touch it: one that ends
    -- at first - 1, and one that starts at last + 1.
    local near = rcall('ZRANGEBYSCORE', ackedKey, string.format('%d', first - 1), '+inf', 'WITHSCORES', 'LIMIT', '0', '2')
    local i = 1
    if near[2] and near[2] + 0 == first - 1 then
      member = near[1] -- that run now ends at last, or further
      i = 3
    end
    if near[i] and near[i] + 0 == last + 1 then
      rcall('ZREM', ackedKey, near[i])
      score = near[i + 1]
    end
  end
  rcall('ZADD', ackedKey, score, member)
end

-- Takes out the run that starts at start (a string), the one right above
-- a floor that just moved, and returns its last seq; nil when there is none.
-- The caller takes its seqs out of ACKED_ABOVE.
local function takeRunAt(start)
  local last = rcall('ZSCORE', ackedKey, start)
  if last then
    rcall('ZREM', ackedKey, start)
    return last + 0
  end
  return nil
end

-- Takes seq out of the run that holds it, if one does (a replay reopens
-- it), splitting the run around it, and counts it out of ACKED_ABOVE.
local function removeAckedSeq(seq)
  local run = rcall('ZRANGEBYSCORE', ackedKey, string.format('%d', seq), '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
  if run[1] == nil or run[1] + 0 > seq then
    return
  end
  rcall('ZREM', ackedKey, run[1])
  if run[1] + 0 < seq then
    rcall('ZADD', ackedKey, string.format('%d', seq - 1), run[1])
  end
  if run[2] + 0 > seq then
    rcall('ZADD', ackedKey, run[2], string.format('%d', seq + 1))
  end
  rcall('HINCRBY', groupKey, ACKED_ABOVE, '-1')
end

-- Turns a set of seqs at the acked key, one member per seq (the form older
-- versions keep, docs/upgrading.md), into runs and counts them into
-- ACKED_ABOVE. join.lua calls it when it meets such a set; the set's size
-- is the work.
local function runsFromSet()
  local seqs = rcall('SMEMBERS', ackedKey)
  for k, s in ipairs(seqs) do
    seqs[k] = s + 0
  end
  table.sort(seqs)
  local runs = {} -- last, first of each run: ZADD's score, member
  local first = 1
  while first <= #seqs do
    local last = first
    while last < #seqs and seqs[last + 1] == seqs[last] + 1 do
      last = last + 1
    end
    runs[#runs + 1] = string.format('%d', seqs[last])
    runs[#runs + 1] = string.format('%d', seqs[first])
    first = last + 1
  end
  rcall('DEL', ackedKey)
  bulk('ZADD', ackedKey, runs)
  rcall('HSET', groupKey, ACKED_ABOVE, string.format('%d', #seqs))
end
