"""Instructions Redis spends per message, counted by callgrind.

Timings on a small shared machine vary by more than a change to a script;
an instruction count inside a private redis-server run under valgrind is
the same on every run. This starts such a server on a free port, does a
warm-up, zeroes the counters, runs N messages of one scenario, dumps the
counters and prints instructions per message. The count covers all of
Redis's work for the calls (reading the request, the script, the reply).

usage: .venv/bin/python benchmarks/icount.py SCENARIO [N]
  scenarios: publish1 publish100 fetch1 ack1 fetch100 ack100 fetch100ack
             fetch100ack-prio fetch100ack-prioseen fetch100ack-hold
             fetch100ack-rate (fetch100ack with a flow-control feature on),
             fetch100ack-prio10 (every 10th message with a priority),
             fetch100ack-delayed<k> (k publishes delayed by an hour,
             which the consumer has passed, ahead of the messages),
             publish100-prio (priorities 1-9 in turn),
             fetch100ack-keys100k (every message with its own ordering
             key, 100,000 keys waiting behind them), fetch100ack-fewkeys
             (4 ordering keys, key_concurrency 100),
             inflight100ack (rqueue; the last with 20,000 held below),
             fetchack1 (rqueue: fetch(1) then its ack, one at a time, as
             the bench's fetch(1)+ack figure),
             fetch1next (rqueue: one at a time, each ack sent with the
             next fetch, as the Worker does),
             fetch<k>ack, fetch<k>next (rqueue: as fetch100ack and
             fetch1next, k at a time: N a multiple of k),
             ack1reverse (rqueue: ack(1) of held messages newest first, so
             each is settled above the ack floor),
             floorpublish1 floorfetchack1 (the bench's floor probes: the
             least a scripted publish, and a scripted claim + ack, do),
             ack100calls (rqueue: ack(list) of each fetch(100)'s
             deliveries, the fetches not counted),
             xadd1 xrg1 xrg100 (redis-py Streams, for comparison),
             xadd100 (XADD, 100 pipelined per round trip),
             xreadgroup100 and xack100 (XREADGROUP COUNT 100 alone, and
             XACK of each one's 100 ids alone: the Streams side of
             fetch100 and ack100calls)
  To compare two trees, run it with PYTHONPATH=<other checkout>; the
  stream log with RQUEUE_EXPERIMENTAL_LAYOUT=stream. Also printed: the
  Redis commands the counted calls ran (scripts' included), per 100
  messages, from INFO commandstats.
Needs valgrind and redis-server on PATH. Takes 10-30 s per scenario.
"""

from __future__ import annotations

import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import redis
from consume_loops import fill_stream

import rqueue
from rqueue.cli.bench.floor import FLOOR_ACK_LUA, FLOOR_FETCH_LUA, FLOOR_PUBLISH_LUA
from rqueue.connection.cluster import no_retry
from rqueue.engine.scripts import Script

PAYLOAD = b"x" * 100
# Messages run before the counters are zeroed: two calls of the batch
# scenarios too, so that no script is loaded (compiled) while counting.
WARMUP = 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    scenario = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="rqueue-icount-")
    out = os.path.join(workdir, "callgrind.out")
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            # The timer's work grows with wall time, which a loaded machine
            # stretches: at 1 Hz it does not blur the counts.
            "--hz",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def ctl(flag: str) -> None:
        if flag == "-z":
            r.config_resetstat()  # before the zero: not counted
        subprocess.run(
            ["callgrind_control", flag, str(server.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )

    try:
        r = redis.Redis(port=port)
        deadline = time.monotonic() + 60
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        client = rqueue.connect(f"redis://127.0.0.1:{port}", prefix="icount")
        client.configure("q", ack_wait=3600, prefetch=10**6, max_inflight=10**6)
        if scenario == "fetch100ack-rate":
            client.configure("q", rate_limit=10**9, rate_period=1)
        if scenario == "fetch100ack-fewkeys":
            client.configure("q", key_concurrency=100)
        queue = client.queue("q")
        consumer = queue.consumer("g", "c1")
        runs = [0]

        def published_and_held(k: int) -> list[rqueue.Delivery]:
            """k new messages, fetched (untimed) by the measured consumer."""
            queue.publish_many([PAYLOAD] * k)
            held: list[rqueue.Delivery] = []
            while len(held) < k:
                held += consumer.fetch(min(1000, k - len(held)))
            return held

        def stream_of(k: int) -> str:
            """A new stream of k entries with group "g" on it (untimed)."""
            key = f"st{runs[0]}"
            fill_stream(r, key, k, PAYLOAD)
            return key

        def run(k: int) -> None:
            """k messages of the scenario; zeroes the counters itself when it
            has untimed set-up to do first."""
            runs[0] += 1
            if scenario == "publish1":
                ctl("-z")
                for _ in range(k):
                    queue.publish(PAYLOAD)
            elif scenario in ("publish100", "publish100-prio"):
                prios = [1 + i % 9 for i in range(100)] if scenario == "publish100-prio" else None
                ctl("-z")
                for _ in range(k // 100):
                    queue.publish_many([PAYLOAD] * 100, priority=prios)
            elif scenario == "fetch1":
                queue.publish_many([PAYLOAD] * k)
                ctl("-z")
                for _ in range(k):
                    consumer.fetch(1)
            elif scenario == "ack1":
                held = published_and_held(k)
                ctl("-z")
                for d in held:
                    consumer.ack(d)
            elif scenario == "ack1reverse":
                # One at a time, the newest first: every ack but the last
                # lands above the floor, next to the run the previous one made.
                held = published_and_held(k)
                ctl("-z")
                for d in reversed(held):
                    consumer.ack(d)
            elif scenario == "fetchack1":
                queue.publish_many([PAYLOAD] * k)
                ctl("-z")
                for _ in range(k):
                    consumer.fetch(1)[0].ack()
            elif scenario == "fetch100":
                queue.publish_many([PAYLOAD] * k)
                ctl("-z")
                for _ in range(k // 100):
                    consumer.fetch(100)
            elif scenario == "ack100calls":
                # Each ack names one fetch(100)'s deliveries, as a
                # fetch(100) + ack loop sends them.
                queue.publish_many([PAYLOAD] * k)
                batches = [consumer.fetch(100) for _ in range(k // 100)]
                ctl("-z")
                for batch in batches:
                    consumer.ack(batch)
            elif scenario == "ack100":
                held = published_and_held(k)
                ctl("-z")
                for i in range(0, k, 100):
                    consumer.ack(held[i : i + 100])
            elif scenario == "inflight100ack":
                # As fetch100ack, with 20,000 deliveries held by another
                # consumer of the group below them (the bench's in-flight
                # sweep case, smaller): every ack is settled above the floor.
                if runs[0] == 1:
                    holder = queue.consumer("g", "holder")
                    queue.publish_many([PAYLOAD] * 20_000)
                    taken = 0
                    while taken < 20_000:
                        taken += len(holder.fetch(1000))
                queue.publish_many([PAYLOAD] * k)
                ctl("-z")
                for _ in range(k // 100):
                    consumer.ack(consumer.fetch(100))
            elif scenario == "fetch100ack":
                queue.publish_many([PAYLOAD] * k)
                ctl("-z")
                for _ in range(k // 100):
                    consumer.ack(consumer.fetch(100))
            elif scenario.startswith("fetch100ack-"):
                # As fetch100ack with one flow-control feature on
                # (docs/flow-control.md): every message with a priority
                # (1-9 in turn); a queue that had one priority message once;
                # the queue on hold with as many held behind; a rate limit
                # that never binds.
                feature = scenario.split("-", 1)[1]
                if runs[0] == 1 and feature == "prioseen":
                    queue.publish(PAYLOAD, priority=5)
                    consumer.ack(consumer.fetch(1))
                if feature.startswith("delayed") and runs[0] == 1:
                    # that many publishes delayed by an hour, which an
                    # untimed fetch passes into the group's delay set
                    queue.publish_many([PAYLOAD] * int(feature[7:]), delay=3600)
                    assert consumer.fetch(100) == []
                if feature == "hold" and runs[0] > 1:
                    queue.resume()  # what the last run held goes, uncounted
                    queue.purge()
                prios = [1 + i % 9 for i in range(k)] if feature == "prio" else None
                if feature == "prio10":
                    prios = [5 if i % 10 == 9 else 0 for i in range(k)]
                keys = None
                if feature == "keys100k":
                    if runs[0] == 1:
                        # 100,000 keys waiting, pulled into the group's key
                        # queue by untimed fetches (1,000 log entries a call)
                        for start in range(0, 100_000, 1000):
                            queue.publish_many([PAYLOAD] * 1000, key=[f"b{i}" for i in range(start, start + 1000)])
                        for _ in range(100):
                            consumer.ack(consumer.fetch(1))
                    keys = [f"n{runs[0]}.{i}" for i in range(k)]
                elif feature == "fewkeys":
                    keys = [f"f{i % 4}" for i in range(k)]
                flow = {"priority": prios} if keys is None else {"key": keys}  # (an older tree has no key=)
                queue.publish_many([PAYLOAD] * k, **flow)
                if feature == "hold":
                    queue.pause(mode="hold")
                    queue.publish_many([PAYLOAD] * k)
                ctl("-z")
                for _ in range(k // 100):
                    consumer.ack(consumer.fetch(100))
            elif scenario == "fetch1next":
                queue.publish_many([PAYLOAD] * k)
                ctl("-z")
                held = []
                for _ in range(k):
                    _, held, _ = consumer.ack_and_fetch(held, 1)
                consumer.ack(held)  # the last one, inside the count as every other ack
            elif scenario == "floorpublish1":
                probe = Script(client.redis, "floor-publish", FLOOR_PUBLISH_LUA, no_retry, client.scripts.connections)
                ctl("-z")
                for _ in range(k):
                    probe(["{f}:meta", "{f}:msgs"], [PAYLOAD])
            elif scenario == "floorfetchack1":
                fetch = Script(client.redis, "floor-fetch", FLOOR_FETCH_LUA, no_retry, client.scripts.connections)
                ack = Script(client.redis, "floor-ack", FLOOR_ACK_LUA, no_retry, client.scripts.connections)
                keys = [f"{{f{runs[0]}}}:meta", f"{{f{runs[0]}}}:msgs", f"{{f{runs[0]}}}:lease"]
                r.hset(keys[1], mapping={str(i + 1): PAYLOAD for i in range(k)})
                ctl("-z")
                for _ in range(k):
                    seq, _ = fetch(keys, [])
                    ack([keys[2]], [seq])
            elif scenario == "xadd100":
                pipe = r.pipeline(transaction=False)
                ctl("-z")
                for _ in range(k // 100):
                    for _ in range(100):
                        pipe.xadd("st", {"d": PAYLOAD})
                    pipe.execute()
            elif scenario in ("xreadgroup100", "xack100"):
                key = stream_of(k)
                if scenario == "xreadgroup100":
                    ctl("-z")
                    for _ in range(k // 100):
                        r.xreadgroup("g", "c", {key: ">"}, count=100)
                else:
                    batches = [r.xreadgroup("g", "c", {key: ">"}, count=100) for _ in range(k // 100)]
                    ctl("-z")
                    for got in batches:
                        r.xack(key, "g", *[entry[0] for entry in got[0][1]])
            elif scenario == "xadd1":
                ctl("-z")
                for _ in range(k):
                    r.xadd("st", {"d": PAYLOAD})
            elif scenario in ("xrg1", "xrg100"):
                per = 1 if scenario == "xrg1" else 100
                key = stream_of(k)
                ctl("-z")
                for _ in range(k // per):
                    got = r.xreadgroup("g", "c", {key: ">"}, count=per)
                    r.xack(key, "g", *[entry[0] for entry in got[0][1]])
            elif re.fullmatch(r"fetch\d+(ack|next)", scenario):
                # fetch(per) then the ack of all it took (ack), or each
                # batch's ack sent with the next fetch (next), as a Worker
                # with prefetch per does.
                per = int(re.findall(r"\d+", scenario)[0])
                queue.publish_many([PAYLOAD] * k)
                ctl("-z")
                if scenario.endswith("ack"):
                    for _ in range(k // per):
                        consumer.ack(consumer.fetch(per))
                else:
                    held = []
                    for _ in range(k // per):
                        _, held, _ = consumer.ack_and_fetch(held, per)
                    consumer.ack(held)
            else:
                raise SystemExit(f"unknown scenario {scenario!r}; see --help")

        run(WARMUP)
        run(n)
        stats = r.info("commandstats")
        ctl("-d")
        time.sleep(0.5)
        dumps = sorted(glob.glob(out + "*"), key=os.path.getmtime)
        total = None
        with open(dumps[-1]) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
                    break
        if total is None:
            raise SystemExit(f"no totals in {dumps[-1]}")
        print(f"{scenario}: {total / n:,.0f} Redis instructions per message (N={n}, rqueue from {rqueue.__file__})")
        calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items() if k != "cmdstat_config"}
        print("  commands per 100 messages: " + ", ".join(f"{k} {c * 100 / n:g}" for k, c in sorted(calls.items())))
        return 0
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
