"""Redis CPU per record of reading 100 consecutive records inside a script:
HMGET from a hash of today's records, XRANGE from a stream of ids
<seq>-<ms> (the command alone, with the payloads collected, and with
today's compact record rebuilt from the id's ms, as the step-3 probe's
log.lua does); then each with the records returned in the reply (the
entries as they are, or rebuilt), as fetch returns them. NOTES.md beside
it says where the figures went.

usage: PYTHONPATH=$PWD:$PWD/benchmarks/prototypes python benchmarks/prototypes/stream_log/xrange_vs_hmget.py

Starts a private redis-server (bench.Server: a free port, its own dir, no
persistence); medians of 5 rounds of 500 calls each.
"""

from __future__ import annotations

import random
import statistics

from bench import PAYLOAD, Server

from rqueue.engine.loader import lua_dir

N = 100_000
CALLS = 500
# compactHead() as the scripts have it: the include is self-contained.
COMPACT_HEAD = (lua_dir() / "includes" / "record_head.lua").read_text() + "\n"
XRANGE = "local r = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1] + 99, 'COUNT', 100)\n"
SCRIPTS = {
    "hmget": "local f = {} for i = 0, 99 do f[#f + 1] = ARGV[1] + i end\n"
    "return #redis.call('HMGET', KEYS[2], unpack(f))",
    "xrange_only": XRANGE + "return #r",
    "xrange_payloads": XRANGE + "local o = {} for k, e in ipairs(r) do o[k] = e[2][2] end return #o",
    "xrange_rebuild": COMPACT_HEAD
    + XRANGE
    + "local heads, o = {}, {}\n"
    + "for k, e in ipairs(r) do\n"
    + "  local m = string.match(e[1], '%-(%d+)$')\n"
    + "  local h = heads[m]\n"
    + "  if not h then h = compactHead(tonumber(m)) heads[m] = h end\n"
    + "  o[k] = h .. e[2][2]\n"
    + "end\n"
    + "return #o",
    # The same, with the records returned in the reply, as fetch returns
    # them: the reply's conversion to RESP counts too.
    "hmget_reply": "local f = {} for i = 0, 99 do f[#f + 1] = ARGV[1] + i end\n"
    "return redis.call('HMGET', KEYS[2], unpack(f))",
    "xrange_entries_reply": XRANGE + "local o = {} for k, e in ipairs(r) do o[k] = e end return o",
    "xrange_rebuild_reply": COMPACT_HEAD
    + XRANGE
    + "local heads, o = {}, {}\n"
    + "for k, e in ipairs(r) do\n"
    + "  local id = e[1]\n"
    + "  local m = string.sub(id, string.find(id, '-', 1, true) + 1)\n"
    + "  local h = heads[m]\n"
    + "  if not h then h = compactHead(tonumber(m)) heads[m] = h end\n"
    + "  o[k] = h .. e[2][2]\n"
    + "end\n"
    + "return o",
}


def main() -> None:
    server = Server()
    try:
        r = server.r
        pipe = r.pipeline(transaction=False)
        for i in range(1, N + 1):
            pipe.xadd("s", {"p": b"x" * PAYLOAD}, id=f"{i}-1700000000000")
            pipe.hset("h", str(i), b"~" + (1_700_000_000_000).to_bytes(6, "big") + b"x" * PAYLOAD)
            if i % 5000 == 0:
                pipe.execute()
        pipe.execute()
        shas = {name: r.script_load(text) for name, text in SCRIPTS.items()}
        found: dict[str, list[float]] = {name: [] for name in SCRIPTS}
        pick = random.Random(1).randint
        for _ in range(5):
            for name, sha in shas.items():
                r.config_resetstat()
                for _ in range(CALLS):
                    r.evalsha(sha, 2, "s", "h", pick(1, N - 100))
                usec = int(r.info("commandstats")["cmdstat_evalsha"]["usec"])
                found[name].append(usec / (CALLS * 100))
        print(f"redis-server {server.version}, {N:,} records of {PAYLOAD} bytes")
        for name, values in found.items():
            print(f"{name:16s} {statistics.median(values):.3f} us/record (median of 5 x {CALLS} calls of 100)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
