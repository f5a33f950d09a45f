--[[
  Dead-letters one delivery held by consumerName (or drops it, with
  dead_letter "drop"), shared by reject.lua (one tag) and set_aside.lua
  (the tags a fetch's client set aside). heldTag, its check of the tag,
  also serves set_aside's deferral of a delivery handed out before its
  time. seqText, countText and token are
  the tag as sent; reason and text go into the dead letter; event is
  "failed", "expired" or "" (the caller checked it).
  Returns the dead letter's seq (0 when dropped), its reason and its error
  text as deadLetter kept them; or nil and the error text
  "<code> <seq>.<count>.<token>[: why]" of a tag that may not settle the
  message (checkTag's codes), having changed nothing.
]]
--@include group_keys
--@include group_names
--@include delivery_state
--@include check_tag
--@include dead_letter
--@include text_prefix
-- The delivery of the tag (seqText, countText, token as sent) when
-- consumerName holds it: its seq (a number) and parsed state; else nil and
-- the error text "<code> <seq>.<count>.<token>[: why]" (checkTag's codes),
-- having changed nothing but a call delivery split out (its own tag).
local function heldTag(seqText, countText, token)
  local seq, count = tonumber(seqText), tonumber(countText)
  local raw = seq and rcall('HGET', dlvKey, seq)
  --@layout stream
  if not raw and seq and callsKey then
    -- A call delivery: split out when the tag is its own, else judged by
    -- the state a split would give it (includes/call_state.lua).
    --@make callPaths
    local split, state = splitTag(seq, countText, token)
    raw = split and rcall('HGET', dlvKey, seq) or state or false
  end
  --@end
  -- A state that does not parse is this tag's refusal, not the call's: the
  -- tags before it are settled already (set_aside).
  local d, corrupt = nil, false
  if seq then
    d, corrupt = parseDelivery(seq, raw)
  end
  local code = corrupt and 'RQ_CORRUPT' or checkTag(seq, count, token, d, false)
  if code ~= 'ok' then
    local why = ''
    if corrupt then
      why = ': its delivery state in ' .. dlvKey .. ' does not parse: ' .. string.sub(raw, 1, 100)
    elseif code == 'RQ_CORRUPT' then
      why = ': its delivery state in ' .. dlvKey .. ' is missing'
    end
    return nil, code .. ' ' .. tostring(seqText) .. '.' .. tostring(countText) .. '.' .. tostring(token) .. why
  end
  return seq, d
end

local function rejectOne(seqText, countText, token, reason, text, event)
  local seq, d = heldTag(seqText, countText, token)
  if not seq then
    return nil, d
  end
  local dseq, kept, keptText = deadLetter(seq, d, reason, text)
  if event ~= '' then
    recordEvent(event, string.format('%d', seq), textPrefix(text, 1024), dseq) -- the seq as the events name it
  end
  return dseq, kept, keptText
end
