--[[
  Results kept by a call that settles (ack_result.lua, set_aside.lua): each
  message's outcome for one group under its own key,
  <base>:result:<seq>:<group> (rqueue/engine/keys.py), stored after the
  queue's incarnation and a newline, so that a queue made anew under the
  same name never answers with an old result (rqueue/stored_results.py
  reads them). The keys are checked by name before any write, so that a
  call built against another layout writes nothing.
]]
--@include group_keys
--@include group_names

-- The longest time to live of a result, ms: 10 years (rqueue/constants.py,
-- MAX_DURATION), far inside what SET PX takes.
local MAX_RESULT_TTL_MS = 315360000000

-- The error text when ttl (named by where) is neither "" (keep no result)
-- nor a whole number of ms from 1 to MAX_RESULT_TTL_MS; nil when it is one
-- of them.
local function resultTtlError(ttl, where)
  if ttl ~= '' and not (string.find(ttl, '^[1-9]%d*$') and tonumber(ttl) <= MAX_RESULT_TTL_MS) then
    return 'RQ_BAD_ARGUMENT the result time to live (' .. where .. ') is not a whole number of ms from 1 to '
      .. MAX_RESULT_TTL_MS .. ': ' .. ttl
  end
  return nil
end

-- The error text of the first tag i whose result values[i] is empty (when
-- the caller sends the results), whose seqs[i] is not written as a seq, or
-- whose key KEYS[first + i] is not its seq's result key for this group; nil
-- when every one is right.
local function resultKeysError(first, seqs, values)
  local base = string.sub(metaKey, 1, -5) .. 'result:'
  for i, seq in ipairs(seqs) do
    -- A result starts with its kind (rqueue/stored_results.py): an empty one
    -- would read as a result lost.
    if values and values[i] == '' then
      return 'RQ_BAD_ARGUMENT the result of tag ' .. i .. ' is empty: a result is at least its kind byte'
    end
    -- A seq written another way ("07") is settled as its canonical one,
    -- while its result would go under a key no reader asks for.
    if not string.find(seq, '^[1-9]%d*$') then
      return 'RQ_BAD_ARGUMENT the seq of tag ' .. i .. ' is not written as one (digits, no leading zero), so its '
        .. 'result key would not be the one read: ' .. seq
    end
    local key = KEYS[first + i]
    if key ~= base .. seq .. ':' .. groupName then
      return 'RQ_BAD_ARGUMENT key ' .. (first + i) .. ' is not the result key of seq ' .. seq .. ' and group '
        .. groupName .. ': ' .. tostring(key)
    end
  end
  return nil
end

-- rqueue/stored_results.py's kind byte of a failure (FAILURE).
local FAILURE_KIND = 'e'

-- A failure kept as a result, as rqueue/stored_results.py encodes it.
local function failureResult(reason, text)
  return FAILURE_KIND .. cjson.encode({reason = reason, error = text})
end

-- The queue's incarnation, read at the first result this call keeps.
local resultIncarnation = nil

-- Keeps value (a result as rqueue/stored_results.py encodes it, its kind
-- byte first) under key for ttl ms.
local function keepResult(key, value, ttl)
  resultIncarnation = resultIncarnation or rcall('HGET', metaKey, 'inc') or ''
  rcall('SET', key, resultIncarnation .. '\n' .. value, 'PX', ttl)
end
