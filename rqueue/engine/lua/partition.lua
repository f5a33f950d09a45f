--[[
  Records in a queue's own slot that it is partitioned, or that its
  partitions grew: the meta field "partitioned" of the plain queue holds
  the layout, and publish and join of the plain queue refuse from then on
  (RQ_PARTITIONED), so that a process that still takes the name for a
  plain queue cannot store messages no partitioned consumer reads. The
  prefix's <prefix>:partitions hash, which processes read, is written by
  the client after this call (a copy; this field decides).

  Input:
    KEYS[1] meta    hash  the plain queue's: field "partitioned" = layout
    KEYS[2] msgs    hash  the plain queue's records (read: any?)
    KEYS[3] floors  hash  the plain queue's groups (read: any?)
    ARGV[1] the layout to store: "<n>" or "<n>:<salt0>,<salt1>,..."
    ARGV[2] "" to create: stored only when no layout is stored and the
            plain queue has no messages, no seq and no group; else the
            layout the caller read (a grow): stored only when the stored
            one is that, or none is stored (a queue partitioned before
            this field existed, whose layout the caller read from the
            prefix's hash)
  Output:
    { status, layout }: status "stored" (ARGV[1] is stored now), "kept"
    (another layout is stored: it is returned, nothing changed), "in-use"
    (create: the plain queue has messages or groups; nothing stored)
]]

--@include log

local rcall = redis.call
local metaKey, msgsKey, floorsKey = KEYS[1], KEYS[2], KEYS[3]
local wanted, expected = ARGV[1], ARGV[2]

local stored = rcall('HGET', metaKey, 'partitioned')
if expected == '' then
  if stored then
    return {'kept', stored}
  end
  local seq = rcall('HGET', metaKey, 'seq')
  if (seq and seq ~= '0') or logAny(msgsKey) or rcall('EXISTS', floorsKey) == 1 then
    return {'in-use', ''}
  end
elseif stored and stored ~= expected then
  return {'kept', stored}
end
rcall('HSET', metaKey, 'partitioned', wanted)
return {'stored', wanted}
