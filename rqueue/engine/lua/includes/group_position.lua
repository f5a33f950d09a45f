--[[
  Where a group created at a position, or reset to one, starts: the seq it
  counts as its ack floor (it is handed the seqs above it). The position is
  mode and value (group_create.lua, group_reset.lua ARGV[8], ARGV[9]):
    "first"  the oldest message stored (the trim point)
    "last"   after the last published: only messages published from now on
    "seq" N  from seq N on: N in (trim point, last seq + 1]
    "time" T from the first message published at or after T (ms since the
             epoch); refused when T is before the oldest message stored and
             older messages were deleted
  A refusal is RQ_POSITION naming what was asked and what is stored.
  Work: a binary search over the stored seqs, reading at most PROBE_SPAN
  records per step.
]]
--@include log_one
--@include record
local PROBE_SPAN = 100 -- records read per step of the search past deleted seqs

-- The first stored record at or after seq s (at most hi, PROBE_SPAN reads):
-- its seq and publish time, or nil.
local function probeFrom(s, hi)
  local stop = math.min(hi, s + PROBE_SPAN - 1)
  for q = s, stop do
    local rec = logRead(msgsKey, sideKey, q, pinnedKey)
    if rec then
      return q, tonumber(recordPublished(rec) or '')
    end
  end
  return nil, nil
end

local function positionFloor(mode, value)
  local fields = rcall('HMGET', metaKey, 'trimmed', 'seq')
  local trimmed, last = tonumber(fields[1] or '0') or 0, tonumber(fields[2] or '0') or 0
  if mode == 'first' then
    return trimmed
  elseif mode == 'last' then
    return last
  elseif mode == 'seq' then
    local n = tonumber(value or '')
    if not (n and n >= 1 and n % 1 == 0) then
      error('RQ_POSITION seq ' .. tostring(value) .. ' is not a seq (a whole number >= 1)')
    end
    if n > last + 1 then
      error('RQ_POSITION seq ' .. value .. ' is beyond the last published seq, ' .. last)
    end
    if n <= trimmed then
      error('RQ_POSITION seq ' .. value .. ' is no longer stored: the oldest seq stored is ' .. (trimmed + 1)
        .. ' (set max_age or max_length to keep settled messages)')
    end
    return n - 1
  elseif mode == 'time' then
    local t = tonumber(value or '')
    if not (t and t >= 0) then
      error('RQ_POSITION time ' .. tostring(value) .. ' is not a time (ms since the epoch)')
    end
    if last <= trimmed then
      return last
    end
    local firstSeq, firstAt = probeFrom(trimmed + 1, last)
    if firstSeq ~= nil and firstAt ~= nil and t < firstAt then
      if trimmed > 0 then
        error('RQ_POSITION time ' .. value .. ' is before the oldest message stored (seq ' .. firstSeq
          .. ', published at ' .. string.format('%.0f', firstAt) .. ' ms): older messages are no longer stored')
      end
      return trimmed
    end
    -- The first seq published at or after t; a stretch without records is
    -- taken as later than t, so that nothing published at or after t is
    -- skipped.
    local lo, hi, found = trimmed + 1, last, last + 1
    while lo <= hi do
      local mid = math.floor((lo + hi) / 2)
      local s, at = probeFrom(mid, hi)
      if s == nil or at == nil or at >= t then
        found = math.min(found, s or mid)
        hi = mid - 1
      else
        lo = s + 1
      end
    end
    return found - 1
  end
  error('RQ_POSITION ' .. tostring(mode) .. ' is not a position: first, last, seq or time')
end
