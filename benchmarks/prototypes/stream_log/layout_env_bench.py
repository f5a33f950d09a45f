"""RQUEUE_EXPERIMENTAL_LAYOUT=hash vs =stream vs a raw Redis
stream, in one session on one already running private redis-server.

usage: PYTHONPATH=. .venv/bin/python benchmarks/prototypes/stream_log/layout_env_bench.py \
           --port P [--runs 3] [--messages 100000] [--json FILE]

Per run, each layout in turn (the order rotates every run), on a flushed server:
  1. one group created, then N messages of 100 bytes by publish_many(100)
     (raw: XADD field d, pipelined 100 at a time): msg/s, used_memory delta / N,
     Redis CPU per message (script usec from INFO commandstats; INFO cpu
     used_cpu_user+sys delta);
  2. fetch(100)+ack(list) of those N, no-op, one consumer, timed (raw:
     XREADGROUP COUNT 100 + XACK): msg/s, script usec and INFO cpu per message;
     then checks the log is empty (HLEN msgs / XLEN log == 0);
  3. N more published (untimed) and drained with INFO commandstats read
     between fetch and ack: script usec per message of fetch and of ack.
Never flushes a server on 6379.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import redis

import rqueue

BATCH = 100
PAYLOAD = 100
GROUP = "g"
BIG = 10**9
SCRIPTS = ("evalsha", "eval", "fcall")
RAW_CMDS = ("xadd", "xreadgroup", "xack")
LAYOUTS = ("hash", "stream", "raw")


def payloads(start: int, n: int) -> list[bytes]:
    return [(b"%010d" % i).ljust(PAYLOAD, b"x") for i in range(start, start + n)]


def cmdstats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    return {k[8:]: (int(v["calls"]), int(v["usec"])) for k, v in r.info("commandstats").items()}


def usec(r: redis.Redis, cmds: tuple[str, ...]) -> int:
    s = r.info("commandstats")
    return sum(int(s.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in cmds)


def cpu(r: redis.Redis) -> float:
    c = r.info("cpu")
    return float(c["used_cpu_user"]) + float(c["used_cpu_sys"])


def mem(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


class Rq:
    cmds = SCRIPTS

    def __init__(self, url: str, layout: str, queue: str) -> None:
        old = os.environ.get("RQUEUE_EXPERIMENTAL_LAYOUT")
        os.environ["RQUEUE_EXPERIMENTAL_LAYOUT"] = layout
        try:
            self.client = rqueue.connect(url, prefix="rq")
        finally:
            if old is None:
                del os.environ["RQUEUE_EXPERIMENTAL_LAYOUT"]
            else:
                os.environ["RQUEUE_EXPERIMENTAL_LAYOUT"] = old
        assert self.client.log_layout.value == layout, self.client.log_layout
        self.q = self.client.queue(queue)
        self.layout = layout

    def setup(self) -> None:
        self.q.create_group(GROUP)
        self.c = self.q.consumer(GROUP, name="c1", prefetch=BIG, max_inflight=BIG, ack_wait=3600)

    def publish_many(self, p: list[bytes]) -> None:
        self.q.publish_many(p)

    def fetch(self, n: int) -> list[Any]:
        ds = self.c.fetch(n)
        for d in ds:
            d.data  # noqa: B018
        return ds

    def ack(self, ds: list[Any]) -> None:
        self.c.ack(ds)

    def log_len(self, r: redis.Redis) -> tuple[str, int, str]:
        keys = [k.decode() for k in r.scan_iter(match=f"rq:{{{self.q.name}}}:*", count=1000)]
        msgs = [k for k in keys if k.endswith(":msgs")]
        logs = [k for k in keys if k.endswith(":log")]
        want = logs if self.layout == "stream" else msgs
        other = msgs if self.layout == "stream" else logs
        assert len(want) <= 1, (self.layout, keys)
        if not want:
            return "(no log key)", 0, f"key absent; other-layout keys={other}"
        k = want[0]
        t = r.type(k).decode()
        n = r.xlen(k) if t == "stream" else r.hlen(k)
        return k, n, f"type={t} other-layout keys={other}"

    def close(self) -> None:
        self.c.close()
        self.client.close()


class Raw:
    cmds = RAW_CMDS

    def __init__(self, r: redis.Redis, queue: str) -> None:
        self.r = r
        self.key = f"raw:{queue}"

    def setup(self) -> None:
        self.r.xgroup_create(self.key, GROUP, id="0", mkstream=True)

    def publish_many(self, p: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for x in p:
            pipe.xadd(self.key, {"d": x})
        pipe.execute()

    def fetch(self, n: int) -> list[Any]:
        reply = self.r.xreadgroup(GROUP, "c1", {self.key: ">"}, count=n)
        return [(i, f[b"d"]) for i, f in reply[0][1]] if reply else []

    def ack(self, ds: list[Any]) -> None:
        self.r.xack(self.key, GROUP, *[d[0] for d in ds])

    def log_len(self, r: redis.Redis) -> tuple[str, int, str]:
        return self.key, r.xlen(self.key), "raw: XACK keeps entries"

    def close(self) -> None:
        pass


def make(kind: str, r: redis.Redis, url: str, queue: str) -> Any:
    return Raw(r, queue) if kind == "raw" else Rq(url, kind, queue)


def one(r: redis.Redis, url: str, kind: str, n: int, run: int) -> dict[str, Any]:
    r.flushall()
    # warm-up on another queue: script loading and client setup outside the deltas
    w = make(kind, r, url, f"warm-{run}")
    w.setup()
    w.publish_many(payloads(0, BATCH))
    w.ack(w.fetch(BATCH))
    w.close()
    L = make(kind, r, url, f"q-{run}-{kind}")
    L.setup()
    out: dict[str, Any] = {}
    # 1. publish + memory
    m0, u0, c0 = mem(r), usec(r, L.cmds), cpu(r)
    t0 = time.perf_counter()
    for s in range(0, n, BATCH):
        L.publish_many(payloads(s, BATCH))
    t1 = time.perf_counter()
    m1, u1, c1 = mem(r), usec(r, L.cmds), cpu(r)
    out["publish_rate"] = n / (t1 - t0)
    out["mem_per_msg"] = (m1 - m0) / n
    out["publish_us"] = (u1 - u0) / n
    out["publish_cpu_us"] = (c1 - c0) / n * 1e6
    key, length, note = L.log_len(r)
    out["log_after_publish"] = length
    # 2. timed fetch(100)+ack
    s0 = cmdstats(r)
    u0, c0 = usec(r, L.cmds), cpu(r)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        ds = L.fetch(BATCH)
        if not ds:
            raise RuntimeError(f"{kind}: fetch empty after {done} of {n}")
        L.ack(ds)
        done += len(ds)
    t1 = time.perf_counter()
    u1, c1 = usec(r, L.cmds), cpu(r)
    s1 = cmdstats(r)
    out["consume_rate"] = n / (t1 - t0)
    out["consume_us"] = (u1 - u0) / n
    out["consume_cpu_us"] = (c1 - c0) / n * 1e6
    out["breakdown"] = {
        c: ((s1[c][0] - s0.get(c, (0, 0))[0]), (s1[c][1] - s0.get(c, (0, 0))[1]) / n)
        for c in s1
        if c != "info" and s1[c] != s0.get(c)
    }
    key, length, note = L.log_len(r)
    out["log_after_acks"] = length
    out["mem_left_after_acks_B"] = mem(r) - m0  # raw: its entries stay (XACK deletes none)
    out["log_key"] = f"{key} ({note})"
    # 3. split fetch / ack script usec
    for s in range(n, 2 * n, BATCH * 10):
        L.publish_many(payloads(s, BATCH * 10))
    f_us = a_us = 0
    fc0 = cpu(r)
    f_cpu = a_cpu = 0.0
    done = 0
    while done < n:
        a, ca = usec(r, L.cmds), cpu(r)
        ds = L.fetch(BATCH)
        b, cb = usec(r, L.cmds), cpu(r)
        L.ack(ds)
        c, cc = usec(r, L.cmds), cpu(r)
        f_us += b - a
        a_us += c - b
        f_cpu += cb - ca
        a_cpu += cc - cb
        done += len(ds)
    del fc0
    out["fetch_us"] = f_us / n
    out["ack_us"] = a_us / n
    out["fetch_cpu_us"] = f_cpu / n * 1e6  # includes the INFO calls' own cost; coarse (10 ms ticks)
    out["ack_cpu_us"] = a_cpu / n * 1e6
    out["log_after_acks2"] = L.log_len(r)[1]
    L.close()
    r.flushall()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--json")
    a = ap.parse_args()
    assert a.port != 6379
    url = f"redis://127.0.0.1:{a.port}/0"
    r = redis.Redis(port=a.port)
    print("redis", r.info("server")["redis_version"], "port", a.port, "messages", a.messages)
    res: dict[str, list[dict[str, Any]]] = {k: [] for k in LAYOUTS}
    for run in range(a.runs):
        order = LAYOUTS[run % 3 :] + LAYOUTS[: run % 3]
        for k in order:
            t = time.perf_counter()
            o = one(r, url, k, a.messages, run)
            res[k].append(o)
            brief = {x: (round(v, 3) if isinstance(v, float) else v) for x, v in o.items() if x != "breakdown"}
            print(f"run {run} {k} ({time.perf_counter() - t:.1f} s): {brief}", flush=True)
            print("   fetch+ack commandstats (calls, usec/msg):",
                  {c: (v[0], round(v[1], 3)) for c, v in sorted(o["breakdown"].items(), key=lambda x: -x[1][1])},
                  flush=True)  # fmt: skip
    figs = [
        ("mem_per_msg", "B per queued msg"),
        ("publish_rate", "publish_many(100) msg/s"),
        ("consume_rate", "fetch(100)+ack msg/s"),
        ("publish_us", "script/cmd usec/msg publish"),
        ("fetch_us", "script/cmd usec/msg fetch"),
        ("ack_us", "script/cmd usec/msg ack"),
        ("consume_us", "script/cmd usec/msg fetch+ack (timed loop)"),
        ("publish_cpu_us", "INFO cpu us/msg publish"),
        ("consume_cpu_us", "INFO cpu us/msg fetch+ack (timed loop)"),
    ]
    print("\n| figure | hash | stream | raw stream | stream/hash | stream/raw | hash/raw |")
    print("|---|---|---|---|---|---|---|")
    med: dict[str, dict[str, float]] = {}
    for f, label in figs:
        m = {k: statistics.median(o[f] for o in res[k]) for k in LAYOUTS}
        lo = {k: min(o[f] for o in res[k]) for k in LAYOUTS}
        hi = {k: max(o[f] for o in res[k]) for k in LAYOUTS}
        med[f] = m

        def cell(k: str, m: dict[str, float] = m, lo: dict[str, float] = lo, hi: dict[str, float] = hi) -> str:
            fmt = "{:,.0f}" if m[k] >= 1000 else "{:.2f}"
            return f"{fmt.format(m[k])} [{fmt.format(lo[k])}–{fmt.format(hi[k])}]"

        def ratio(x: str, y: str, f: str = f) -> str:
            return f"{statistics.median(a[f] / b[f] for a, b in zip(res[x], res[y], strict=True)):.2f}x"

        print(f"| {label} | {cell('hash')} | {cell('stream')} | {cell('raw')} | "
              f"{ratio('stream', 'hash')} | {ratio('stream', 'raw')} | {ratio('hash', 'raw')} |")  # fmt: skip
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"runs": res, "medians": med}, fh, indent=1)


if __name__ == "__main__":
    main()
