"""Redis CPU per seq of deleting side-hash records as the prototype does
(side_hash.patch, fetch.lua): 1,000 a call, found in the priority log,
which lists by seq every message with a priority or a key:

  ZRANGEBYSCORE prio -inf <trim point> WITHSCORES LIMIT 0 1000
  HDEL side <their seqs>
  ZREMRANGEBYSCORE prio -inf <the last one>

against the same without the HDEL, and against today's trim of the
priority log (ZREMRANGEBYSCORE alone). 100,000 seqs with records of 107
bytes, INFO commandstats around the calls, medians of 3 runs, on a private
redis-server (PATH) on a free port.

usage: .venv/bin/python side_delete.py
"""

from __future__ import annotations

import statistics

import redis

from rqueue.embedded import EmbeddedServer

N, BATCH = 100_000, 1000
LUA = """
if ARGV[3] == '2' then
  return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
end
local passed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', '0', ARGV[2])
if #passed > 0 then
  if ARGV[3] == '1' then
    local fields = {}
    for i = 2, #passed, 2 do fields[#fields + 1] = passed[i] end
    redis.call('HDEL', KEYS[2], unpack(fields))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', passed[#passed])
end
return #passed / 2
"""
CASES = (("with HDEL", "1"), ("priority log read and trimmed", "0"), ("ZREMRANGEBYSCORE alone (today)", "2"))


def main() -> None:
    srv = EmbeddedServer(binary="redis-server").start()
    try:
        r = redis.Redis.from_url(srv.url)
        print("redis", r.info("server")["redis_version"])
        script = r.register_script(LUA)
        res: dict[str, list[float]] = {label: [] for label, _ in CASES}
        for _ in range(3):
            for label, mode in CASES:
                r.flushall()
                p = r.pipeline(transaction=False)
                for s in range(1, N + 1):
                    p.zadd("{q}:prio", {f"{s}:{1 + s % 9}": s})
                    p.hset("{q}:side", str(s), b"\x01" + b"t" * 6 + b"x" * 100)
                    if s % 5000 == 0:
                        p.execute()
                p.execute()
                r.config_resetstat()
                for k in range(N // BATCH):
                    assert script(keys=["{q}:prio", "{q}:side"], args=[(k + 1) * BATCH, BATCH, mode]) == BATCH
                st = r.info("commandstats")
                usec = sum(v["usec"] for k, v in st.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
                res[label].append(usec / N)
                assert r.hlen("{q}:side") == (0 if mode == "1" else N) and r.zcard("{q}:prio") == 0
        for label, v in res.items():
            print(f"{label}: {statistics.median(v):.3f} us per seq (runs {', '.join(f'{x:.3f}' for x in v)})")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
