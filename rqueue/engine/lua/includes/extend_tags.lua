--[[
  Extends the leases of the tags in ARGV[first], ARGV[first+1], ... (seq,
  count, token triples) to deadline when this consumer holds them. Returns
  one status per tag: "ok" or the code from checkTag.
]]
--@include group_keys
--@include group_names
--@include delivery_state
--@include check_tag
local function extendTags(first, deadline)
  local statuses = {}
  for i = first, #ARGV, 3 do
    local seq, count = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    local code = checkTag(seq, count, ARGV[i + 2], seq and readDelivery(dlvKey, seq), false)
    if code == 'ok' then
      rcall('ZADD', leaseKey, 'XX', deadline, seq)
    end
    statuses[#statuses + 1] = code
  end
  return statuses
end
