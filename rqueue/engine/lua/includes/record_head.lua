--[[
  The head of a record (includes/record.lua has both forms): what publish
  writes and fetch reads for every message. Apart from the rest of record.lua
  so that fetch can leave that rest to its rare paths (--@lazy, see
  rqueue/engine/loader.py): each local function is made again on every call.
]]
local COMPACT_BYTE = 126 -- string.byte('~')
local COMPACT_HEAD = 7 -- bytes before the payload: the tag and 6 of published_ms
local COMPACT_LIMIT = 281474976710656 -- 2^48: published_ms must be below it

-- The head of a compact record published at ms (a whole number), or nil
-- when ms does not fit in 6 bytes (the text form is used then). Arithmetic
-- only (% and /), no math.floor: a C function call costs more than the rest.
local function compactHead(ms)
  if ms < 0 or ms >= COMPACT_LIMIT or ms % 1 ~= 0 then
    return nil
  end
  local lo = ms % 16777216
  local hi = (ms - lo) / 16777216
  local b6, b3 = lo % 256, hi % 256
  lo, hi = (lo - b6) / 256, (hi - b3) / 256
  local b5, b2 = lo % 256, hi % 256
  return string.char(COMPACT_BYTE, (hi - b2) / 256, b2, b3, (lo - b5) / 256, b5, b6)
end

-- Returns not_before (0 when none) or nil for a record that does not parse.
-- Most records are compact or not delayed (both checked without a pattern);
-- the client checks the rest of a text record's prefix when it decodes it.
local function recordNotBefore(rec)
  local first = string.byte(rec, 1)
  if first == COMPACT_BYTE then
    if #rec < COMPACT_HEAD then
      return nil
    end
    return 0
  end
  if first == 58 then
    return 0
  end
  local nbf = string.match(rec, '^(%d*):%d+:%d+:')
  if nbf == nil then
    return nil
  end
  return tonumber(nbf) or 0
end
