"""Which stream entry shape step 3 of docs/layout-d-plan.md needs: ids
<seq>-<publish ms> with the payload alone (the plan), or ids <seq>-0 with
today's record (its compact head holds the publish ms) in one field. The
second keeps deletion by seq (XDEL <seq>-0), so a record could still go at
its ack, as today; the first can only trim.

usage: PYTHONPATH=. python benchmarks/prototypes/stream_ids.py [--entries 100000] [--runs 5]

Starts a private redis-server (bench.Server: a free port, its own dir, no
persistence) and prints, per shape:
- B per stored message: the used_memory delta over --entries messages of
  100-byte payloads, published in batches of 100 by one script call each;
- B per message left after deleting every second message (a worker's
  out-of-order acks): a stream frees a node only when all its entries go;
- Redis CPU per message (µs, EVALSHA usec over the calls) to publish, to
  read 100 consecutive messages by seq (XRANGE per call, HMGET for the
  hash), and to delete them by seq (XDEL, HDEL); medians of --runs.
The reference is Redis Streams itself: XADD * with one field p.
"""

from __future__ import annotations

import argparse
import statistics

import redis
from bench import PAYLOAD, Server

MS0 = 1_700_000_000_000
BATCH = 100
# KEYS[1] the log; ARGV[1] the first seq, ARGV[2] the publish ms, ARGV[3] the shape.
PUBLISH = """
local seq, ms, shape = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local payload = string.rep('x', 100)
local head = '~' .. string.rep('\\0', 6)
for i = 0, 99 do
  local s = string.format('%d', seq + i)
  if shape == 'auto' then
    redis.call('XADD', KEYS[1], '*', 'p', payload)
  elseif shape == 'seq-ms' then
    redis.call('XADD', KEYS[1], s .. '-' .. ms, 'p', payload)
  elseif shape == 'seq-0' then
    redis.call('XADD', KEYS[1], s .. '-0', 'r', head .. payload)
  else
    redis.call('HSET', KEYS[1], s, head .. payload)
  end
end
return 100
"""
# KEYS[1] the log; ARGV[1] the first seq, ARGV[2] the shape. Reads 100 records.
READ = """
local first, shape = tonumber(ARGV[1]), ARGV[2]
local n = 0
if shape == 'hash' then
  local seqs = {}
  for i = 0, 99 do seqs[#seqs + 1] = first + i end
  for _, v in ipairs(redis.call('HMGET', KEYS[1], unpack(seqs))) do n = n + #v end
else
  for _, e in ipairs(redis.call('XRANGE', KEYS[1], first, first + 99)) do n = n + #e[2][2] end
end
return n
"""
# KEYS[1] the log; ARGV[1] the first seq, ARGV[2] the shape, ARGV[3] the step.
DELETE = """
local first, shape, step = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local ids = {}
for i = 0, 99, step do
  ids[#ids + 1] = shape == 'hash' and (first + i) or ((first + i) .. '-0')
end
return redis.call(shape == 'hash' and 'HDEL' or 'XDEL', KEYS[1], unpack(ids))
"""


def usec(r: redis.Redis) -> int:
    return int(r.info("commandstats")["cmdstat_evalsha"]["usec"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    n = args.entries - args.entries % BATCH
    server = Server()
    try:
        r = server.r
        publish, read, delete = (r.register_script(s) for s in (PUBLISH, READ, DELETE))
        shapes = ("auto", "seq-ms", "seq-0", "hash")
        found: dict[str, dict[str, list[float]]] = {s: {} for s in shapes}
        for _ in range(args.runs):
            for shape in shapes:
                figures = found[shape]
                r.delete("log")
                before = int(r.info("memory")["used_memory"])
                r.config_resetstat()
                for first in range(1, n + 1, BATCH):
                    publish(keys=["log"], args=[first, MS0 + first // 200, shape])
                figures.setdefault("publish", []).append(usec(r) / n)
                figures.setdefault("stored", []).append((int(r.info("memory")["used_memory"]) - before) / n)
                if shape == "auto":
                    continue
                r.config_resetstat()
                for first in range(1, n + 1, BATCH):
                    assert read(keys=["log"], args=[first, shape]) >= PAYLOAD * BATCH
                figures.setdefault("read", []).append(usec(r) / n)
                if shape == "seq-ms":
                    continue  # deletion by seq needs the ms: none
                r.config_resetstat()
                for first in range(1, n + 1, BATCH):
                    delete(keys=["log"], args=[first, shape, 2])
                figures.setdefault("delete", []).append(usec(r) / (n // 2))
                figures.setdefault("half left", []).append((int(r.info("memory")["used_memory"]) - before) / (n // 2))
        r.delete("log")
        print(f"redis-server {server.version}, {n:,} messages of {PAYLOAD} bytes, medians of {args.runs} runs")
        ref = statistics.median(found["auto"]["stored"])
        for shape in shapes:
            cells = []
            for what, values in found[shape].items():
                unit = "B" if what in ("stored", "half left") else "us"
                cells.append(f"{what} {statistics.median(values):.2f} {unit}")
            ratio = statistics.median(found[shape]["stored"]) / ref
            print(f"{shape:7} {ratio:.2f}x a stream entry; " + ", ".join(cells))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
