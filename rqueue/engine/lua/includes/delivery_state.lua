--[[
  A group's delivery state of one message, persisted with the delivery itself
  (guarantee 5 in docs/guarantees.md):
  "count:consumer:first_ms:last_ms:token", then one line per earlier
  delivery n that was taken back from its holder (at most HISTORY_MAX):
  "\n<n>=<name>=<token>" when its lease ran out or its holder left (a late
  ack of it still completes the message), "\n<n>!<name>=<token>" when its
  holder settled it explicitly (nack: any later settle of it is stale);
  "\n<n>^" when a replay of the message as a dead letter restarted its
  count after n deliveries (kept while the history keeps it).
  consumer is empty while the message waits for redelivery. The token is
  the fetch call's (the client's random word, guarantee 11): a tag names
  its delivery only with it, so no tag from another group, queue or server
  incarnation settles a delivery that has the same seq and count. A state
  written without a token (by a version of rqueue before tokens) reads
  with token "". The state exists exactly while the message is delivered
  (or waiting for redelivery) and not yet settled by the group.
]]
local HISTORY_MAX = 10 -- earlier holders remembered per message
local TOKEN_MAX = 32 -- characters of a token: a letter, then letters and digits

-- One field of the dlv hash that is no message: fetch writes it with every
-- batch of states. Its value is longer than hash-max-listpack-value (64
-- bytes by default), so the hash is a hash table from then on, and stays
-- one (the field keeps the key from being emptied and deleted). As a
-- listpack, every HSET, HMGET and HDEL of a batch of states scans the
-- whole hash, which grows with the messages in flight. No seq is "pin",
-- and nothing lists the fields of dlv, so no reader ever meets it.
local DLV_PIN_FIELD = 'pin'
local DLV_PIN_VALUE = 'keeps this hash a hash table: a listpack is scanned whole by every HSET, HMGET, HDEL'

-- Returns the state, nil when there is none, or nil, true when it does not parse.
local function parseDelivery(seq, raw)
  if not raw then
    return nil
  end
  local cut = string.find(raw, '\n', 1, true)
  local head, past = raw, ''
  if cut then
    head, past = string.sub(raw, 1, cut - 1), string.sub(raw, cut)
  end
  -- A token starts with a letter (includes/check_tag.lua), so a state of
  -- the format before tokens, whose last field is digits, never reads as one
  -- with a token, whatever its consumer's name holds.
  local count, holder, first, last, token = string.match(head, '^(%d+):(.*):(%d+):(%d+):(%l[%l%d]*)$')
  if not count then
    count, holder, first, last = string.match(head, '^(%d+):(.*):(%d+):(%d+):$')
    if not count then
      count, holder, first, last = string.match(head, '^(%d+):(.*):(%d+):(%d+)$')
    end
    token = ''
  end
  if not count then
    return nil, true
  end
  return {count = tonumber(count), holder = holder, first = first, last = last, token = token, past = past}
end

-- As parseDelivery, but a state that does not parse is an error (RQ_CORRUPT).
local function readDelivery(dlvKey, seq)
  local raw = redis.call('HGET', dlvKey, seq)
  local d, corrupt = parseDelivery(seq, raw)
  if corrupt then
    error('RQ_CORRUPT delivery state of seq ' .. seq .. ' does not parse: ' .. raw)
  end
  return d
end

local function formatDelivery(d)
  return d.count .. ':' .. d.holder .. ':' .. d.first .. ':' .. d.last .. ':' .. (d.token or '') .. d.past
end

local function writeDelivery(dlvKey, seq, d)
  redis.call('HSET', dlvKey, seq, formatDelivery(d))
end

-- Remembers that delivery d.count was held by d.holder before it is taken
-- back; settled: its holder settled it (nack), so no later settle of it counts.
local function rememberHolder(d, settled)
  if d.holder == '' then
    return
  end
  local past = d.past .. '\n' .. d.count .. (settled and '!' or '=') .. d.holder .. '=' .. (d.token or '')
  local _, entries = string.gsub(past, '\n', '')
  while entries > HISTORY_MAX do
    past = string.sub(past, (string.find(past, '\n', 2, true)))
    entries = entries - 1
  end
  d.past = past
end

-- True when consumer received delivery number count of this message with
-- token, and that delivery was taken back without being settled.
local function receivedBy(d, count, consumer, token)
  return string.find(d.past .. '\n', '\n' .. count .. '=' .. consumer .. '=' .. token .. '\n', 1, true) ~= nil
end

-- True when consumer settled delivery number count of this message (token)
-- explicitly: a nack.
local function settledBy(d, count, consumer, token)
  return string.find(d.past .. '\n', '\n' .. count .. '!' .. consumer .. '=' .. token .. '\n', 1, true) ~= nil
end
