--[[
  The trim step of retention mode (includes/retain_mark.lua): deletes, from
  the oldest stored up, records that every group settled (at or below the
  lowest ack floor of all groups) and that retention no longer keeps:
  published more than max_age ago, or more than max_length seqs below the
  last. With neither set, every record every group settled goes. A record
  a replay pinned stays (includes/settle_shared.lua). The trim point (meta
  field "trimmed") moves up with it: a new group starts there, at the
  oldest record still stored. A queue without groups keeps everything.
  Work: at most limit seqs per call.
]]
--@include log
--@include log_one
--@include record
--@include lowest_floor

-- Returns the new trim point and how many seqs it passed. spec is the
-- stored "<max_age_ms> <max_length>".
local function trimRetained(spec, nowMs, limit)
  local ageText, lenText = string.match(spec, '^(%S+) (%S+)$')
  local maxAge, maxLen = tonumber(ageText or ''), tonumber(lenText or '')
  local fields = rcall('HMGET', metaKey, 'trimmed', 'seq')
  local trimmed, last = tonumber(fields[1] or '0') or 0, tonumber(fields[2] or '0') or 0
  local minFloor = lowestFloor(floorsKey)
  if minFloor == nil or minFloor <= trimmed then
    return trimmed, 0
  end
  local upto = math.min(minFloor, trimmed + limit)
  local s = trimmed
  while s < upto do
    local nxt = s + 1
    local drop = (maxAge == nil and maxLen == nil) or (maxLen ~= nil and nxt <= last - maxLen)
    if not drop and maxAge ~= nil then
      local rec = logRead(msgsKey, sideKey, nxt, pinnedKey)
      -- Publish times rise with seqs: the first record young enough ends
      -- the step. A seq without a record (deleted before retention mode)
      -- or whose time does not parse holds nothing back.
      local published = rec and tonumber(recordPublished(rec) or '')
      drop = not published or published <= nowMs - maxAge
    end
    if not drop then
      break
    end
    s = nxt
  end
  if s == trimmed then
    return trimmed, 0
  end
  if logIsStream(msgsKey) then
    -- A reopened seq's record is in side (includes/log.lua): the trim may pass it.
    -- While deleting what the trim point passed lags (meta field "swept",
    -- includes/settle_shared.lua), the lag's next steps take these too: an
    -- exact trim here would delete the whole lag at once.
    if rcall('HEXISTS', metaKey, 'swept') == 0 then
      logTrim(msgsKey, s)
    end
    rcall('HSET', metaKey, 'trimmed', s)
    return s, s - trimmed
  end
  local gone = {}
  local anyPinned = rcall('HLEN', pinnedKey) > 0
  for q = trimmed + 1, s do
    if not anyPinned or rcall('HEXISTS', pinnedKey, q) == 0 then
      gone[#gone + 1] = q
    end
  end
  logDelete(msgsKey, gone)
  bulk('HDEL', settledKey, gone)
  rcall('HSET', metaKey, 'trimmed', s)
  return s, s - trimmed
end
