--[[
  A message record has one of two forms:
    compact  "~" then published_ms as 6 bytes, big-endian, then the payload:
             a message without headers and without delay (most of them).
             10 bytes shorter than the text form, so a 100-byte payload's
             record (107 bytes) takes jemalloc's 112-byte class, not 128.
    text     "<not_before_ms>:<published_ms>:<headers_len>:<headers><payload>":
             not_before is empty unless the publish was delayed, headers are
             a JSON object of strings.
  The first byte tells them apart (a text record starts with ":" or a digit).
  Only the head is read on the hot path. rqueue/engine/record.py decodes both.
]]
--@include record_head
local RECORD_PREFIX = '^(%d*):(%d+):(%d+):()'

-- A record in the compact form when it has no headers and no delay (and
-- published, ms, fits), else in the text form.
local function makeRecord(notBefore, published, headersJson, payload)
  if notBefore == '' and headersJson == '' then
    local head = compactHead(tonumber(published) or -1)
    if head then
      return head .. payload
    end
  end
  return notBefore .. ':' .. published .. ':' .. #headersJson .. ':' .. headersJson .. payload
end

-- published_ms of a record as a decimal string, or nil when it does not parse.
local function recordPublished(rec)
  if string.byte(rec, 1) == COMPACT_BYTE then
    if #rec < COMPACT_HEAD then
      return nil
    end
    local ms = 0
    for i = 2, COMPACT_HEAD do
      ms = ms * 256 + string.byte(rec, i)
    end
    return string.format('%.0f', ms)
  end
  return string.match(rec, '^%d*:(%d+):')
end

-- Splits a record into headers (a table) and payload; nil for a corrupted one.
local function splitRecord(rec)
  if string.byte(rec, 1) == COMPACT_BYTE then
    if #rec < COMPACT_HEAD then
      return nil, nil
    end
    return {}, string.sub(rec, COMPACT_HEAD + 1)
  end
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
