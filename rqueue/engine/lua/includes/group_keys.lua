--[[
  Local names for the KEYS layout shared by every group-scoped script
  (fetch, ack, nack, reject, extend, join, leave, stats). The Python side
  builds this list in one place: rqueue/engine/keys.py (GroupKeys.as_list).
    KEYS[1]  meta       hash  seq (last assigned), trimmed (lowest ack floor)
    KEYS[2]  msgs       hash  seq -> record
    KEYS[3]  floors     hash  group -> ack floor; also the group registry
    KEYS[4]  settled    hash  seq -> groups that settled it above their floor
    KEYS[5]  group      hash  cursor and counters of this group; ACKED_ABOVE
                              (below): how many seqs the acked runs hold;
                              since: the last seq when the group was
                              created (join.lua); cursor_checked (fetch.lua)
    KEYS[6]  lease      zset  seq -> lease deadline (ms): the in-flight set;
                              and SKIPLIST_PIN at +inf (below)
    KEYS[7]  ready      zset  seq -> seq: redeliveries due now
    KEYS[8]  delay      zset  seq -> due time (ms): waiting messages
    KEYS[9]  dlv        hash  seq -> "count:consumer:first_ms:last_ms"; and
                              "pin" (includes/delivery_state.lua)
    KEYS[10] acked      zset  first seq -> last seq of each run of seqs
                              settled above the ack floor
                              (includes/acked_runs.lua)
    KEYS[11] consumers  hash  consumer -> deliveries it holds
    KEYS[12] pinned     hash  seq -> groups that reopened it by replay
    KEYS[13] reopen     zset  seq -> seq: this group's reopened seqs
    KEYS[14] beats      zset  consumer -> when it counts as dead (ms): its
                              last sign of life + its liveness timeout
    KEYS[15] dlq_meta   hash  meta of this queue's dead-letter queue
    KEYS[16] dlq_msgs   hash  records of this queue's dead-letter queue
    KEYS[17] events     stream  dead-letters, drops and replays (capped)
    KEYS[18] prio       zset  seq -> "<seq>:<priority>": the queue's log of
                              messages published with a priority (1-9)
    KEYS[19] pq         zset  seq -> seq - priority x PRIORITY_SPAN: what
                              this group read from the log and has not
                              handed out, highest priority first, then
                              lowest seq (fetch.lua)
    KEYS[20] rate       zset  "<seq>:<token>" -> when it was handed out (ms):
                              the deliveries inside the rate limit's window
                              (fetch.lua; settings rate_limit, rate_period)
    KEYS[21] kq         zset  "<key> <seq, 16 digits>" at score 0: the
                              messages of an ordering key this group pulled
                              from the log and has not handed out, in key
                              then seq order (ZRANGE BYLEX per key)
    KEYS[22] kready     zset  key -> turn: keys that may hand out (pending
                              messages, room under key_concurrency), least
                              recently served first
    KEYS[23] kbusy      zset  key -> turn: keys with deliveries handed out
                              and not yet seen settled, or a rate window
                              that still counts, oldest check first
    KEYS[24] kflight    hash  key -> "<seq> <seq> ..." those deliveries;
                              "~<key>" -> "<ms> <ms> ..." the key's rate
                              window (settings key_rate_limit, key_rate_period)
    KEYS[25] side       hash  a stream log's seq -> record of the messages
                              published with a priority or a key (stubs in
                              the stream, includes/log.lua); sent after the
                              24 for a stream log only
  KEYS[1..13] are every key an ack can touch, and ack.lua is sent those
  alone (every key sent adds to the cost of a call); the others are nil
  there. The scripts sent the first 17 (SETTLE_KEYS in keys.py) are sent
  the side hash after them, and set_aside after its result keys: in a
  stream log's call the side hash is always the last of KEYS, and sideKey
  names it (nil for a hash log, or when the last key is another: the ack's
  13, fetch's plain 17). A script that can meet a stub refuses a stream
  call without it before any write (includes/layout.lua, sideKeyError).
]]
--@include log

local metaKey = KEYS[1]
local msgsKey = KEYS[2]
local floorsKey = KEYS[3]
local settledKey = KEYS[4]
local groupKey = KEYS[5]
local leaseKey = KEYS[6]
local readyKey = KEYS[7]
local delayKey = KEYS[8]
local dlvKey = KEYS[9]
local ackedKey = KEYS[10]
local consumersKey = KEYS[11]
local pinnedKey = KEYS[12]
local reopenKey = KEYS[13]
local beatsKey = KEYS[14]
local dlqMetaKey = KEYS[15]
local dlqMsgsKey = KEYS[16]
local eventsKey = KEYS[17]
local prioKey = KEYS[18]
local prioSetKey = KEYS[19]
local rateKey = KEYS[20]
local keyQueueKey = KEYS[21]
local keyReadyKey = KEYS[22]
local keyBusyKey = KEYS[23]
local keyFlightKey = KEYS[24]
--@layout stream
-- The last key, when it is the side hash of a stream log (above): as
-- sentSideKey (includes/log.lua) finds it, written out here because
-- fetch's main chunk is near Lua's limit of 200 locals.
local sideKey = KEYS[#KEYS]
if string.byte(msgsKey, -1) ~= 103 or sideKey ~= string.sub(msgsKey, 1, -4) .. 'side' then -- 103: 'g' of ":log"
  sideKey = nil
end
-- The call keys of a stream log (includes/call_state.lua): calls (token ->
-- call record), cexp (token -> deadline) and cseq (token -> first seq),
-- sent in the stream layout right after the first 13 (ack), 17 (the
-- scripts sent SETTLE_KEYS, fetch's plain call) or 24 of the group layout
-- (keys.py, GroupKeys.call_keys). Found by name, compared with the group's
-- calls key; nil for a call sent none. The flow-control names the call
-- keys stand in after the first 17 are nil then (ack.lua names none of
-- those after its 13). The hash layout's text has none of these names.
local callsKey, callExpKey, callSeqKey = nil, nil, nil
if string.byte(msgsKey, -1) == 103 and groupKey then -- 103: 'g' of ":log"
  local base = string.sub(msgsKey, 1, -5)
  local name = base .. ':calls:' .. string.sub(groupKey, #base + 6)
  local at = KEYS[25] == name and 25 or KEYS[18] == name and 18 or KEYS[14] == name and 14 or nil
  if at then
    callsKey, callExpKey, callSeqKey = KEYS[at], KEYS[at + 1], KEYS[at + 2]
    if at <= 18 then
      prioKey, prioSetKey, rateKey, keyQueueKey, keyReadyKey, keyBusyKey, keyFlightKey = nil, nil, nil, nil, nil, nil,
        nil
    end
  end
end
--@end
--@layout hash
local sideKey = nil -- a hash log has no side hash (includes/log.lua)
--@end
-- One member of the lease set, and of a stream log's call sets cexp and
-- cseq, that is no delivery or call, at score +inf: fetch adds it with
-- every batch of leases and every call. It is longer than
-- zset-max-listpack-value (64 bytes by default), so the set is a skiplist
-- from then on, and stays one (the member keeps the key from being emptied
-- and deleted). As a listpack, every ZADD and ZREM scans the set: with a
-- hundred calls out, 6 % of a fetch and ack's work. Readers of the whole
-- set skip it; the in-flight count is ZCOUNT -inf (+inf (deliveriesOut).
local SKIPLIST_PIN = 'pin: keeps this sorted set a skiplist, as a listpack every ZADD moves the whole set'

-- The group's deliveries in flight: one lease each, the pin left out.
--@layout hash
local function deliveriesOut()
  return redis.call('ZCOUNT', leaseKey, '-inf', '(+inf')
end
--@end
--@layout stream
-- In a stream log's call sent the call keys, the seqs out on calls too
-- (group field "callout", includes/call_state.lua): callout, when given,
-- as the caller knows it, else read.
local function deliveriesOut(callout)
  local leased = redis.call('ZCOUNT', leaseKey, '-inf', '(+inf')
  if callsKey then
    return leased + (callout or tonumber(redis.call('HGET', groupKey, 'callout') or '0') or 0)
  end
  return leased
end
--@end
-- The group hash's field counting the seqs in the acked runs (stats reads it).
local ACKED_ABOVE = 'acked_above'
