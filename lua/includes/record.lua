--[[
  A message record is "<not_before_ms>:<published_ms>:<headers_len>:<headers><payload>":
  not_before is empty unless the publish was delayed, headers are a JSON object
  of strings. Only the prefix is read on the hot path.
]]
local RECORD_PREFIX = '^(%d*):(%d+):(%d+):()'

-- Returns not_before (0 when none) or nil for a record that does not parse.
-- Most records are not delayed and start with ":" (checked without a
-- pattern); the client checks the rest of their prefix when it decodes them.
local function recordNotBefore(rec)
  if string.byte(rec, 1) == 58 then
    return 0
  end
  local nbf = string.match(rec, '^(%d*):%d+:%d+:')
  if nbf == nil then
    return nil
  end
  return tonumber(nbf) or 0
end

local function makeRecord(notBefore, published, headersJson, payload)
  return notBefore .. ':' .. published .. ':' .. #headersJson .. ':' .. headersJson .. payload
end

-- Splits a record into headers (a table) and payload; nil for a corrupted one.
local function splitRecord(rec)
  local _, _, hlen, pos = string.match(rec, RECORD_PREFIX)
  if pos == nil then
    return nil, nil
  end
  hlen = tonumber(hlen)
  local headers = {}
  if hlen > 0 then
    local ok, decoded = pcall(cjson.decode, string.sub(rec, pos, pos + hlen - 1))
    if not ok or type(decoded) ~= 'table' then
      return nil, nil
    end
    headers = decoded
  end
  return headers, string.sub(rec, pos + hlen)
end
