--[[
  Local names for the ARGV block shared by every group-scoped script. The
  Python side builds it in one place, rqueue/settings.py (Settings.argv).
    ARGV[1]  group name
    ARGV[2]  consumer name
    ARGV[3]  now in ms since the epoch, or "" to use the server's TIME
    ARGV[4]  ack_wait, ms
    ARGV[5]  max_inflight, deliveries per group
    ARGV[6]  prefetch, deliveries per consumer
    ARGV[7]  max_deliveries, count; -1 = unlimited
    ARGV[8]  redelivery_delay, ms
    ARGV[9]  redelivery_multiplier, factor >= 1
    ARGV[10] max_redelivery_delay, ms
    ARGV[11] redelivery_jitter, factor 0..1
    ARGV[12] a random number in [0, 1) from the client's one random source
    ARGV[13] dead_letter mode: "dlq" keeps, "drop" counts and discards
    ARGV[14] queue name, written into dead-letter headers
  Script-specific arguments start at ARGV[15].
  Needs read_now included before it.
]]
--@include group_names
local now, nowText = readNow(ARGV[3])
local ackWait = tonumber(ARGV[4])
local maxInflight = tonumber(ARGV[5])
local prefetch = tonumber(ARGV[6])
local deadLetterMode = ARGV[13]
local queueName = ARGV[14]

-- ARGV[7..12] matter only once a delivery fails (expiry, nack, a dead
-- holder): read then, once per call, rather than by every call (each
-- tonumber is a strtod).
local failurePolicy = nil
local function redeliveryPolicy()
  if failurePolicy == nil then
    failurePolicy = {
      maxDeliveries = tonumber(ARGV[7]),
      delay = tonumber(ARGV[8]),
      multiplier = tonumber(ARGV[9]),
      maxDelay = tonumber(ARGV[10]),
      jitter = tonumber(ARGV[11]),
      random = tonumber(ARGV[12]),
    }
  end
  return failurePolicy
end
