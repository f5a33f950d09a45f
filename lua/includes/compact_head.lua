--[[
  The head of a compact record (includes/record.lua has both forms), apart
  from the readers so that publish creates one closure, not six: each local
  function is made again on every script call.
]]
local COMPACT_BYTE = 126 -- string.byte('~')
local COMPACT_HEAD = 7 -- bytes before the payload: the tag and 6 of published_ms
local COMPACT_LIMIT = 281474976710656 -- 2^48: published_ms must be below it

-- The head of a compact record published at ms (a whole number), or nil
-- when ms does not fit in 6 bytes (the text form is used then). Two halves
-- of 3 bytes: fewer math.floor calls than a loop over 6 bytes.
local function compactHead(ms)
  if ms < 0 or ms >= COMPACT_LIMIT or ms ~= math.floor(ms) then
    return nil
  end
  local hi = math.floor(ms / 16777216)
  local lo = ms - hi * 16777216
  local h1, l1 = math.floor(hi / 65536), math.floor(lo / 65536)
  local h2, l2 = math.floor(hi / 256), math.floor(lo / 256)
  return string.char(COMPACT_BYTE, h1, h2 - h1 * 256, hi - h2 * 256, l1, l2 - l1 * 256, lo - l2 * 256)
end
