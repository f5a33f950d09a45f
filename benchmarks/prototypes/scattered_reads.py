"""Redis CPU per record read by seq from scattered places in the log, from
a stream (one XRANGE per seq: a stream has no read of several ids) and from
a hash (one HMGET of all of them), inside a script as fetch.lua reads them
(docs/layout-d-plan.md, "Scattered reads").

usage: PYTHONPATH=. python benchmarks/prototypes/scattered_reads.py [--entries 100000] [--runs 5]

Starts a private redis-server (bench.Server: a free port, its own dir, no
persistence), fills a stream with ids <seq>-<ms> and a hash seq -> record
(100-byte payloads), then per run: 200 script calls each reading 100 random
seqs, CONFIG RESETSTAT before, EVALSHA usec after.
"""

from __future__ import annotations

import argparse
import random
import statistics

from bench import PAYLOAD, Server

READ_STREAM = """
local n = 0
for i = 1, #ARGV do
  local e = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  if e[1] then n = n + #e[1][2][2] end
end
return n
"""
READ_HASH = """
local n = 0
for _, v in ipairs(redis.call('HMGET', KEYS[1], unpack(ARGV))) do
  if v then n = n + #v end
end
return n
"""
CALLS = 200
PER_CALL = 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    server = Server()
    try:
        r = server.r
        pipe = r.pipeline(transaction=False)
        for seq in range(1, args.entries + 1):
            pipe.xadd("log", {"p": b"x" * PAYLOAD}, id=f"{seq}-1700000000000")
            pipe.hset("msgs", str(seq), b"~" + b"\0" * 6 + b"x" * PAYLOAD)
            if seq % 1000 == 0:
                pipe.execute()
        pipe.execute()
        scripts = {"stream (XRANGE each)": (r.register_script(READ_STREAM), "log")}
        scripts["hash (one HMGET)"] = (r.register_script(READ_HASH), "msgs")
        pick = random.Random(1).randint
        found: dict[str, list[float]] = {name: [] for name in scripts}
        for _ in range(args.runs):
            for name, (script, key) in scripts.items():
                r.config_resetstat()
                for _ in range(CALLS):
                    seqs = [str(pick(1, args.entries)) for _ in range(PER_CALL)]
                    assert script(keys=[key], args=seqs) > 0
                usec = int(r.info("commandstats")["cmdstat_evalsha"]["usec"])
                found[name].append(usec / (CALLS * PER_CALL))
        print(f"redis-server {server.version}, {args.entries:,} entries, {PER_CALL} random seqs per script call")
        for name, values in found.items():
            cells = ", ".join(f"{v:.2f}" for v in values)
            print(f"{name}: {statistics.median(values):.2f} us per record (runs: {cells})")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
