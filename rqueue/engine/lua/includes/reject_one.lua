--[[
  Dead-letters one delivery held by consumerName (or drops it, with
  dead_letter "drop"), shared by reject.lua (one tag) and set_aside.lua
  (the tags a fetch's client set aside). seqText, countText and token are
  the tag as sent; reason and text go into the dead letter; event is
  "failed", "expired" or "" (the caller checked it).
  Returns the dead letter's seq (0 when dropped), or nil and the error text
  "<code> <seq>.<count>.<token>[: why]" of a tag that may not settle the
  message (checkTag's codes), having changed nothing.
]]
--@include group_keys
--@include delivery_state
--@include check_tag
--@include dead_letter
--@include text_prefix
local function rejectOne(seqText, countText, token, reason, text, event)
  local seq, count = tonumber(seqText), tonumber(countText)
  local d = seq and readDelivery(dlvKey, seq)
  local code = checkTag(seq, count, token, d, false)
  if code ~= 'ok' then
    local why = code == 'RQ_CORRUPT' and (': its delivery state in ' .. dlvKey .. ' is missing') or ''
    return nil, code .. ' ' .. tostring(seqText) .. '.' .. tostring(countText) .. '.' .. tostring(token) .. why
  end
  local dseq = deadLetter(seq, d, reason, text)
  if event ~= '' then
    recordEvent(event, seqText, textPrefix(text, 1024), dseq)
  end
  return dseq
end
