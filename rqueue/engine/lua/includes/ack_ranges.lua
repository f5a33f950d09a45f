--[[
  Range acks (a stream log's call records, includes/call_state.lua; step 5
  of docs/layout-d-plan.md). An ack's tags may open with ranges, each
  three ARGV like a tag:
    <first seq>, "r<in>[,<gap>,<in>...]", <token>
  naming the seqs from the first seq on in runs: <in> seqs taken, <gap>
  passed, and so on (the client packs so the count-1 deliveries of a call
  that fetch.lua's call field named: rqueue/engine/commands.py,
  pack_acks). Runs and gaps are 1 or more, a range ends with a run and
  spans RANGE_MAX seqs at most; any other is RQ_BAD_ARGUMENT before any
  write. Every seq of a range is
  a tag (seq, 1, token). Each run is checked against the call record of
  the token in one pass: the part whose bytes are 1, held by this
  consumer, is settled by the record (spans of bytes, not seq by seq);
  every other seq of it goes back to the per-seq path as its own tag (a
  fallback), judged as a triple would be. A second range of one token in
  one call falls back whole.
  Reply: one element per range, "ok" when every seq of it is ok, else a
  list of one status per seq in seq order; then the tags' statuses.
  Uses call_state's helpers (callRead), made by the caller's --@make
  callPaths; included by ack_tags.lua in its stream text.
]]

-- The most seqs a range spans, gaps included: a call's bytes are at most
-- CALL_MAX seqs handed out and the seqs its scan passed (fetch.lua).
local RANGE_MAX = 4096

-- Reads the ranges from ARGV[first] on, checking them against their calls
-- (cache: token -> parsed record, as callTag's; a call taken by a range
-- gets c.spans, {from, to, ...} byte indexes, ascending). Returns the
-- ranges (each a list {kind, a, b, ...}: kind true for a span of the
-- call, seqs a..b; false for fallbacks a..b, indexes into the fallbacks),
-- the fallbacks' seq strings and tokens, the seqs settled by spans, in
-- order, and the ARGV index of the first tag after the ranges. Raises
-- RQ_BAD_ARGUMENT for a range that does not parse or is too wide. Writes
-- nothing.

local function ackRangesRead(first, cache)
  local ranges, fbFields, fbTokens, spanSeqs = {}, {}, {}, {}
  local i = first
  while i + 2 <= #ARGV and string.byte(ARGV[i + 1], 1) == 114 do -- 114: 'r'
    local seqText, spec, token = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local s = tonumber(seqText)
    if not s or s < 1 or string.format('%d', s) ~= seqText or not string.find(spec, '^r%d+[,%d]*$')
      or #token > 32 or not string.find(token, '^%l[%l%d]*$') then
      error('RQ_BAD_ARGUMENT a range is <first seq>, "r<in>[,<gap>,<in>...]", <token>: ' .. seqText .. ' '
        .. string.sub(spec, 1, 40) .. ' ' .. string.sub(token, 1, 40))
    end
    -- Runs and gaps alike are 1 or more, and a range ends with a run: an
    -- odd count of numbers, one comma between two.
    local width, runs = 0, 0
    for num in string.gmatch(spec, '%d+') do
      if num + 0 < 1 then
        error('RQ_BAD_ARGUMENT a range\'s runs and gaps are 1 or more: ' .. string.sub(spec, 1, 40))
      end
      width, runs = width + num, runs + 1
      if width > RANGE_MAX then
        break -- refused below: no walk of the rest of a long one
      end
    end
    if width > RANGE_MAX then
      error('RQ_BAD_ARGUMENT a range spans ' .. RANGE_MAX .. ' seqs at most: ' .. string.sub(spec, 1, 40))
    end
    if runs % 2 == 0 or string.find(spec, ',,', 1, true) or string.byte(spec, -1) == 44 then -- 44: ','
      error('RQ_BAD_ARGUMENT a range is "r<in>[,<gap>,<in>...]": ' .. string.sub(spec, 1, 40))
    end
    local c = cache[token]
    if c == nil then
      c = callRead(token) or false
      if c then
        c.taken, c.n = {}, 0
      end
      cache[token] = c
    end
    local mine = c and c.holder == consumerName and not c.spans
    local spans = mine and {} or nil
    local pieces = {}
    local taking = true
    for num in string.gmatch(spec, '%d+') do
      local k = num + 0
      if taking then
        local a, b = s, s + k - 1
        local p = a -- the first seq of the run not placed yet
        local function fallBack(to)
          if to >= p then
            pieces[#pieces + 1] = false
            pieces[#pieces + 1] = #fbFields + 1
            pieces[#pieces + 1] = #fbFields + (to - p + 1)
            for t = p, to do
              fbFields[#fbFields + 1] = string.format('%d', t)
              fbTokens[#fbTokens + 1] = token
            end
            p = to + 1
          end
        end
        if mine then
          -- Below the call's bytes, fallbacks; within them, spans of 1s
          -- (settled by the record) and of 0s (fallbacks); above, fallbacks.
          local bytes, base = c.bytes, c.first - 1
          fallBack(math.min(b, base))
          local q, ib = p - base, math.min(b - base, #bytes)
          while q <= ib do
            local z = string.find(bytes, '0', q, true)
            if not z or z > ib then
              z = ib + 1
            end
            if z > q then
              spans[#spans + 1] = q
              spans[#spans + 1] = z - 1
              pieces[#pieces + 1] = true
              pieces[#pieces + 1] = base + q
              pieces[#pieces + 1] = base + z - 1
              local ns = #spanSeqs
              for t = base + q, base + z - 1 do
                ns = ns + 1
                spanSeqs[ns] = t
              end
              c.n = c.n + (z - q)
              p = base + z
            end
            if z > ib then
              break
            end
            local o = string.find(bytes, '1', z, true)
            if not o or o > ib then
              o = ib + 1
            end
            fallBack(base + o - 1)
            q = o
          end
        end
        fallBack(b)
      end
      s = s + k
      taking = not taking
    end
    if spans and #spans > 0 then
      c.spans = spans
    end
    ranges[#ranges + 1] = pieces
    i = i + 3
  end
  return ranges, fbFields, fbTokens, spanSeqs, i
end

-- The reply's statuses: one per range ("ok", or a list per seq of it),
-- then those of the tags (result[1..tags]); result[tags + j] is the status
-- of fallback j.
local function ackRangesResult(ranges, result, tags)
  local out = {}
  for _, pieces in ipairs(ranges) do
    local all = true
    for p = 1, #pieces, 3 do
      if not pieces[p] then
        for j = pieces[p + 1], pieces[p + 2] do
          if result[tags + j] ~= 'ok' then
            all = false
          end
        end
      end
    end
    if all then
      out[#out + 1] = 'ok'
    else
      -- in seq order: the pieces are, but for fallbacks below the call first
      local statuses = {}
      for p = 1, #pieces, 3 do
        for j = pieces[p + 1], pieces[p + 2] do
          statuses[#statuses + 1] = pieces[p] and 'ok' or result[tags + j]
        end
      end
      out[#out + 1] = statuses
    end
  end
  for j = 1, tags do
    out[#out + 1] = result[j]
  end
  return out
end
