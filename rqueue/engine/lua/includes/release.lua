--[[
  Takes a message away from its holder: its lease goes, the holder's count
  of deliveries drops and the holder joins the delivery's history. The
  delivery count stays; the caller writes the state or deletes it.
]]
--@include group_keys
--@include group_names
--@include delivery_state
local function release(seq, d)
  rcall('ZREM', leaseKey, seq)
  if d.holder ~= '' then
    rcall('HINCRBY', consumersKey, d.holder, -1)
    rememberHolder(d)
    d.holder = ''
  end
end
