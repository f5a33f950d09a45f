--[[
  Takes a message away from its holder: its lease goes, the holder's count
  of deliveries drops and the holder joins the delivery's history (settled:
  the holder settled it itself, so no later settle of that delivery counts).
  The delivery count stays; the caller writes the state or deletes it.
]]
--@include group_keys
--@include group_names
--@include delivery_state
local function release(seq, d, settled)
  rcall('ZREM', leaseKey, seq)
  if d.holder ~= '' then
    rcall('HINCRBY', consumersKey, d.holder, -1)
    rememberHolder(d, settled)
    d.holder = ''
  end
end
