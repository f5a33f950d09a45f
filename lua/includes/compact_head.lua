--[[
  The head of a compact record (includes/record.lua has both forms), apart
  from the readers so that publish creates one closure, not six: each local
  function is made again on every script call.
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
