--[[
  Local names for the ARGV block shared by every group-scoped script. The
  Python side builds it in one place, rqueue/engine/commands.py (GroupCall,
  failure_policy).
    ARGV[1]  group name
    ARGV[2]  consumer name
    ARGV[3]  now in ms since the epoch, or "" to use the server's TIME
    ARGV[4]  ack_wait, ms
    ARGV[5]  max_inflight, deliveries per group
    ARGV[6]  prefetch, deliveries per consumer
    ARGV[7]  the failure policy: eight words split by one space each,
               max_deliveries (count; -1 = unlimited)
               redelivery_delay (ms)
               redelivery_multiplier (factor >= 1)
               max_redelivery_delay (ms)
               redelivery_jitter (factor 0..1)
               a random number in [0, 1) from the client's one random source
               dead_letter mode ("dlq" keeps, "drop" counts and discards)
               queue name, written into dead-letter headers (it holds no
                 whitespace: names never do)
             e.g. "10 0 1.0 0 0.0 0.25 dlq orders"
  Script-specific arguments start at ARGV[8].
]]
--@include read_now
--@include group_names
local now, nowText = readNow(ARGV[3])
-- "x + 0" rather than tonumber(x) for a number the client or Redis wrote:
-- arithmetic converts a numeric string with one strtod, tonumber() is a C
-- function call that parses it twice.
local ackWait = ARGV[4] + 0
local maxInflight = ARGV[5] + 0
local prefetch = ARGV[6] + 0

-- ARGV[7] matters only once a delivery fails (expiry, nack, a dead holder,
-- a dead letter) or a dead letter is replayed: parsed then, once per call,
-- rather than by every call. One argument, not eight: each argument costs
-- every call about as much as a small command's parsing of it.
local failureArgs = nil
local function failurePolicy()
  if failureArgs == nil then
    -- Eight words, or nine with the retry deadline (ms of a message's age
    -- after which a failed attempt dead-letters it) after the jitter.
    local policyText = ARGV[7] or ''
    local maxDeliveries, delay, multiplier, maxDelay, jitter, deadline, random, mode, queue =
      string.match(policyText, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
    if maxDeliveries == nil then
      deadline = '0'
      maxDeliveries, delay, multiplier, maxDelay, jitter, random, mode, queue =
        string.match(policyText, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
    end
    failureArgs = {
      deadline = tonumber(deadline),
      maxDeliveries = tonumber(maxDeliveries),
      delay = tonumber(delay),
      multiplier = tonumber(multiplier),
      maxDelay = tonumber(maxDelay),
      jitter = tonumber(jitter),
      random = tonumber(random),
      deadLetterMode = mode,
      queueName = queue,
    }
    for _, name in ipairs({'maxDeliveries', 'delay', 'multiplier', 'maxDelay', 'jitter', 'deadline', 'random'}) do
      if failureArgs[name] == nil then
        error('RQ_BAD_ARGUMENT the failure policy (ARGV[7]) does not parse: ' .. string.sub(ARGV[7] or '', 1, 200))
      end
    end
  end
  return failureArgs
end
