--[[
  Texts kept in records and events (an error, a reason) are cut to a number
  of bytes; a cut inside a UTF-8 character would leave bytes no client
  decodes, and a record that holds them reads as corrupt.
]]

-- The longest prefix of s of at most n bytes that ends between two UTF-8
-- characters (s itself when it is no longer). Bytes that are not UTF-8 are
-- cut at n.
local function textPrefix(s, n)
  if #s <= n then
    return s
  end
  -- The byte after the cut is the first of a character (below 0x80, or a
  -- lead byte from 0xC0), or the cut is inside one: it goes back to that
  -- character's lead byte, at most 3 bytes (a character is 4 at most).
  local i = n + 1
  while i >= n - 2 and i > 1 do
    local b = string.byte(s, i)
    if b < 128 or b >= 192 then
      return string.sub(s, 1, i - 1)
    end
    i = i - 1
  end
  return string.sub(s, 1, n)
end
