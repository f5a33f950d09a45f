--[[
  Prototype (c), wider structures: settles deliveries of one consumer, each
  on its own. A tag <seq>.<count>.<token> is accepted when the delivery
  state is "<count>:<token>" (the current delivery, made by that fetch
  call) and the call's holder is this consumer. Then the state goes, the
  call's count of deliveries out goes down (the call's records go with
  the last), and the seqs are settled as the current layout settles them:
  the ack floor moves over contiguous seqs, the rest is kept as runs
  (first -> last) in the acked zset, and the records are deleted (one
  group: the current layout's settled counts for several are left out).

  KEYS[1] msgs  KEYS[2] group hash  KEYS[3] dlv hash  KEYS[4] exp zset
  KEYS[5] calls hash  KEYS[6] acked runs zset
  ARGV[1] group  ARGV[2] consumer  ARGV[3..] seq, count, token per tag
  Reply: { status1, ... } "ok", RQ_STALE <tag>, RQ_NOT_HELD <tag>
]]
local rcall = redis.call
local msgs, g, dlv, exp, calls, acked = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local consumer = ARGV[2]
local heldField = 'h:' .. consumer
local f = rcall('HMGET', g, heldField, 'inflight', 'floor')
local held, inflight, floor = (f[1] or 0) + 0, (f[2] or 0) + 0, (f[3] or 0) + 0
local fields = {}
for i = 3, #ARGV, 3 do
  fields[#fields + 1] = ARGV[i]
end
local sts = rcall('HMGET', dlv, unpack(fields))
local tokens, tokenList = {}, {}
for i = 5, #ARGV, 3 do
  local tok = ARGV[i]
  if tokens[tok] == nil then
    tokens[tok] = 0
    tokenList[#tokenList + 1] = tok
  end
end
local holderFields = {}
for k, tok in ipairs(tokenList) do
  holderFields[2 * k - 1] = 'h:' .. tok
  holderFields[2 * k] = 'n:' .. tok
end
local hs = rcall('HMGET', calls, unpack(holderFields))
local out, done, seen = {}, {}, {}
for k = 1, #fields do
  local i = 3 * k
  local seq, count, tok = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local st = sts[k]
  if not st or seen[seq] then
    out[#out + 1] = 'RQ_NOT_HELD ' .. seq
  elseif st ~= count .. ':' .. tok then
    out[#out + 1] = 'RQ_STALE ' .. seq
  else
    local at = 0
    for j, name in ipairs(tokenList) do
      if name == tok then
        at = j
        break
      end
    end
    if hs[2 * at - 1] ~= consumer then
      out[#out + 1] = 'RQ_STALE ' .. seq
    else
      seen[seq] = true
      tokens[tok] = tokens[tok] + 1
      done[#done + 1] = seq
      out[#out + 1] = 'ok'
    end
  end
end
if #done == 0 then
  return out
end
rcall('HDEL', dlv, unpack(done))
for j, tok in ipairs(tokenList) do
  local k = tokens[tok]
  if k > 0 then
    if hs[2 * j] - k <= 0 then
      rcall('HDEL', calls, tok, 'h:' .. tok, 'n:' .. tok)
      rcall('ZREM', exp, tok)
    else
      rcall('HINCRBY', calls, 'n:' .. tok, -k)
    end
  end
end
-- Settle: the floor passes contiguous seqs; other runs are kept apart.
local nums = {}
for k, seq in ipairs(done) do
  nums[k] = seq + 0
end
table.sort(nums)
local runsExist = rcall('EXISTS', acked) == 1
local i = 1
while i <= #nums do
  local j = i
  while j < #nums and nums[j + 1] - nums[j] <= 1 do
    j = j + 1
  end
  if nums[i] <= floor + 1 then
    floor = nums[j]
    if runsExist then
      local runLast = rcall('ZSCORE', acked, string.format('%d', floor + 1))
      if runLast then
        rcall('ZREM', acked, string.format('%d', floor + 1))
        floor = runLast + 0
      end
    end
  else
    rcall('ZADD', acked, nums[j], nums[i]) -- merging with a neighbour run is left out
  end
  i = j + 1
end
rcall('HSET', g, heldField, held - #done, 'inflight', inflight - #done, 'floor', string.format('%d', floor))
rcall('HDEL', msgs, unpack(done))
return out
