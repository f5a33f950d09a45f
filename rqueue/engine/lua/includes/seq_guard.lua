--[[
  The guard against reused seqs, for every script that assigns seqs
  (publish, publish_tracked, schedule_fire). A queue whose last seq (meta
  field seq) is missing while it has records, or a group that settled some,
  lost its meta hash: numbering again from 1 would overwrite stored records
  and reuse the seqs, and tags, of messages delivered. Returns the
  RQ_CORRUPT error reply to return (nothing written), or nil.
]]
--@include log

local function reusedSeqsError(metaKey, msgsKey, floorsKey)
  local lost = logAny(msgsKey)
  if not lost then
    for _, f in ipairs(redis.call('HVALS', floorsKey)) do
      if f ~= '0' then
        lost = true
        break
      end
    end
  end
  if not lost then
    return nil
  end
  return redis.error_reply('RQ_CORRUPT ' .. metaKey .. ' is missing (no field seq) while the queue has records '
    .. 'or a group that settled some: a publish would reuse their seqs (see `rqueue doctor`)')
end

-- The RQ_CORRUPT error reply for a last seq that is not a whole number.
local function badSeqError(metaKey, raw)
  return redis.error_reply('RQ_CORRUPT ' .. metaKey .. ' field seq holds ' .. string.sub(raw, 1, 40) .. ', not a seq')
end
