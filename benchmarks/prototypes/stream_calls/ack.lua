--[[
  Prototype (d), stream log + per-call in-flight records: settles
  deliveries of one consumer. The client sends, per fetch call (token),
  the seqs of its first deliveries as ranges of contiguous seqs (a whole
  call is one range) and its redeliveries one by one, so that the common
  ack does no work per message: a range is accepted when the call is
  held by this consumer and every byte of the range in its record is
  "1" (out), or "0" for a seq the same call's per-message list names and
  that is accepted (a range spans the seqs of the call's record that went
  by the per-message path, so that they do not split it); a range with
  any other settled or unknown seq is refused whole, "RQ_PARTIAL", and
  changes nothing: the client sends those tags again one range each,
  which names each. A delivery of the per-message path (a redelivery, a
  parked seq) is accepted when its dlv state is "<count>:<token>".
  Settling moves the
  ack floor over contiguous seqs, keeps the rest as runs (first seq ->
  last seq), and trims the stream below the lowest floor of all groups
  (XTRIM MINID <floor + 1>: ids start with the seq, so that is exact).

  KEYS[1] stream  KEYS[2] group hash  KEYS[3] exp zset  KEYS[4] calls hash
  KEYS[5] dlv hash  KEYS[6] acked runs zset  KEYS[7] floors hash
  ARGV[1] group  ARGV[2] consumer  ARGV[3..] per call: token, ranges
    "<first seq>-<last seq>,..." (or ""), redeliveries "<seq>=<count>,..."
    (or "")
  Reply: { status per range, then per redelivery, of each call in order }
    "ok", RQ_PARTIAL <range>, RQ_STALE <range or seq>
]]
local rcall = redis.call
local s, g, exp, calls, dlv, acked, floors = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local group, consumer = ARGV[1], ARGV[2]
local heldField = 'h:' .. consumer
local f = rcall('HMGET', g, heldField, 'inflight', 'floor')
local held, inflight = (f[1] or 0) + 0, (f[2] or 0) + 0
local floor = (f[3] or 0) + 0
local out = {}
local runs = {} -- first, last: what this call settles
local settled = 0
local settledNow = {} -- seqs of the per-message path settled by this call
local unordered = false -- runs is out of seq order: sorted before settling
for a = 3, #ARGV, 3 do
  local tok, ranges, again = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local c = rcall('HMGET', calls, tok, 'h:' .. tok, 'n:' .. tok)
  local first, bits = string.match(c[1] or '', '^(%d+) (%d+)$')
  local mine = c[2] == consumer
  local n = 0
  -- This call's settled runs: its ranges, then its per-message seqs,
  -- merged in seq order below when both are there. The per-message
  -- seqs go first: a range may span those of them that lie in the
  -- call's record (their byte is "0": they went by the per-message
  -- path), once they are accepted here.
  local byRange, bySeq = {}, {}
  local seqOut = {}
  local accepted = {} -- this call's per-message seqs accepted here (numbers)
  if again ~= '' then
    -- The per-message path: the states read in one HMGET, the settled
    -- ones deleted in one HDEL.
    local seqs, counts = {}, {}
    for seq, count in string.gmatch(again, '(%d+)=(%d+)') do
      seqs[#seqs + 1] = seq
      counts[#counts + 1] = count
    end
    local states = mine and #seqs > 0 and rcall('HMGET', dlv, unpack(seqs)) or {}
    local done = {}
    for i, seq in ipairs(seqs) do
      if mine and not settledNow[seq] and states[i] == counts[i] .. ':' .. tok then
        settledNow[seq] = true -- a second ack of it in this call is refused
        local v = seq + 0
        accepted[v] = true
        bySeq[#bySeq + 1] = {v, v}
        done[#done + 1] = seq
        n = n + 1
        seqOut[#seqOut + 1] = 'ok'
      else
        seqOut[#seqOut + 1] = 'RQ_STALE ' .. seq
      end
    end
    if #done > 0 then
      rcall('HDEL', dlv, unpack(done))
    end
  end
  if ranges ~= '' then
    first = (first or 0) + 0
    -- The call's record is rebuilt once: the pieces up to each accepted
    -- range, then the rest. A range that starts before the end of the
    -- last accepted one (out of order, or overlapping it) is checked
    -- against the record rebuilt so far.
    local pieces, at = {}, 1
    for r in string.gmatch(ranges, '[^,]+') do
      local lo, hi = string.match(r, '^(%d+)-(%d+)$')
      lo, hi = (lo or -1) + 0, (hi or -2) + 0
      if not (mine and bits) then
        out[#out + 1] = 'RQ_STALE ' .. r
      else
        local i, j = lo - first + 1, hi - first + 1
        if i < at and #pieces > 0 then
          pieces[#pieces + 1] = string.sub(bits, at)
          bits = table.concat(pieces)
          pieces, at = {}, 1
        end
        -- Every "0" in the range must be a per-message seq accepted above.
        local ok = i >= 1 and j <= #bits and i <= j
        local spanned = 0
        local zero = ok and string.find(bits, '0', i, true)
        while zero and zero <= j do
          if not accepted[first + zero - 1] then
            ok = false
            break
          end
          spanned = spanned + 1
          zero = string.find(bits, '0', zero + 1, true)
        end
        if not ok then
          out[#out + 1] = 'RQ_PARTIAL ' .. r
        else
          pieces[#pieces + 1] = string.sub(bits, at, i - 1)
          pieces[#pieces + 1] = string.rep('0', j - i + 1)
          at = j + 1
          byRange[#byRange + 1] = {lo, hi}
          n = n + (j - i + 1) - spanned
          out[#out + 1] = 'ok'
        end
      end
    end
    if #pieces > 0 then
      pieces[#pieces + 1] = string.sub(bits, at)
      bits = table.concat(pieces)
    end
  end
  for _, status in ipairs(seqOut) do
    out[#out + 1] = status
  end
  -- Both lists come in seq order from the client (checked as they merge:
  -- any step back marks the runs for a sort).
  local x, y = 1, 1
  while x <= #byRange or y <= #bySeq do
    local run
    if y > #bySeq or (x <= #byRange and byRange[x][1] < bySeq[y][1]) then
      run, x = byRange[x], x + 1
    else
      run, y = bySeq[y], y + 1
    end
    if #runs > 0 and run[1] < runs[#runs][1] then
      unordered = true
    end
    runs[#runs + 1] = run
  end
  if n > 0 then
    if c[3] - n <= 0 then
      rcall('HDEL', calls, tok, 'h:' .. tok, 'n:' .. tok, 'x:' .. tok)
      rcall('ZREM', exp, tok)
    elseif bits then
      rcall('HSET', calls, tok, string.format('%d', first) .. ' ' .. bits, 'n:' .. tok, c[3] - n)
    else -- a call that handed out nothing by range (all of it by the per-message path)
      rcall('HSET', calls, 'n:' .. tok, c[3] - n)
    end
    settled = settled + n
  end
end
if settled == 0 then
  return out
end
-- Settle: the runs in seq order, then the floor and the acked runs.
if unordered then
  table.sort(runs, function(x, y)
    return x[1] < y[1]
  end)
end
local oldFloor = floor
local runsExist = nil
local k = 1
while k <= #runs do
  local lo, hi = runs[k][1], runs[k][2]
  -- (a per-message seq's run may lie inside a range's that spans it)
  while k < #runs and runs[k + 1][1] <= hi + 1 do
    k = k + 1
    if runs[k][2] > hi then
      hi = runs[k][2]
    end
  end
  if lo <= floor + 1 then
    floor = hi
    if runsExist == nil then
      runsExist = rcall('EXISTS', acked) == 1
    end
    -- Stored runs are not merged with their neighbours, so the floor
    -- takes every one that starts where it ends, in turn.
    while runsExist do
      local start = string.format('%d', floor + 1)
      local runLast = rcall('ZSCORE', acked, start)
      if not runLast then
        break
      end
      floor = runLast + 0
      rcall('ZREM', acked, start)
    end
  else
    -- merging with a neighbouring run is left out of the prototype
    rcall('ZADD', acked, hi, lo)
    runsExist = true
  end
  k = k + 1
end
if floor ~= oldFloor then
  local floorText = string.format('%d', floor)
  rcall('HSET', g, heldField, held - settled, 'inflight', inflight - settled, 'floor', floorText)
  local low = floor
  rcall('HSET', floors, group, floorText)
  if rcall('HLEN', floors) > 1 then
    for _, v in ipairs(rcall('HVALS', floors)) do
      if v + 0 < low then
        low = v + 0
      end
    end
  end
  rcall('XTRIM', s, 'MINID', string.format('%d', low + 1))
else
  rcall('HSET', g, heldField, held - settled, 'inflight', inflight - settled)
end
return out
