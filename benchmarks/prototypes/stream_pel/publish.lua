--[[
  Prototype (b), stream + PEL: appends messages to the queue's stream. The
  stream entry id is the message's position (ms-seq) and carries the
  publish time, so an entry is the record: one field "p", the payload
  (the field name is shared by the listpack's master entry, so it costs
  no bytes per entry).

  KEYS[1] the stream; KEYS[2..] id keys (string -> stream id, PX = window)
  ARGV[1] de-duplication window, ms; ARGV[2] wake-up channel or ""
  ARGV[3], ARGV[4], ... per message: index of its id key in KEYS (0: no
    id), payload
  Reply: { id1, dup1, id2, dup2, ... }, dup 1 when the id was seen inside
    the window (id is then the first publish's)
]]
local rcall = redis.call
local s = KEYS[1]
local out = {}
local last = nil
for i = 3, #ARGV, 2 do
  local idKey, body = ARGV[i], ARGV[i + 1]
  local seen = nil
  if idKey ~= '0' then
    seen = rcall('GET', KEYS[idKey + 0])
  end
  if seen then
    out[#out + 1] = seen
    out[#out + 1] = 1
  else
    last = rcall('XADD', s, '*', 'p', body)
    if idKey ~= '0' then
      rcall('SET', KEYS[idKey + 0], last, 'PX', ARGV[1])
    end
    out[#out + 1] = last
    out[#out + 1] = 0
  end
end
if last and ARGV[2] ~= '' then
  redis.pcall('PUBLISH', ARGV[2], last)
end
return out
