"""A chaos run on loopback: producer and worker processes against a private
Redis with AOF (appendfsync always), while workers are killed with SIGKILL,
every client connection is killed (CLIENT KILL) and Redis itself is killed
and restarted. At the end every confirmed publish must be settled by the
group (acked or dead-lettered) and figures are printed.

    python tests/support/chaos.py --seconds 120 --messages 20000   # the long run, by hand

tests/test_chaos.py runs a short one in CI. Every loop is bounded in count and
time and only addresses on 127.0.0.1 are used.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]  # the repository, for `import rqueue` in the child processes
sys.path.insert(0, str(ROOT))

import rqueue  # noqa: E402
from rqueue.embedded import EmbeddedServer, find_binary  # noqa: E402

QUEUE, GROUP = "chaos", "g"
BATCH = 50  # messages per publish_many
MAX_INFLIGHT = 16  # the group's cap, below 3 workers x PREFETCH so that it binds
CONCURRENCY = 4  # handler threads per worker
PREFETCH = 8  # each worker's cap: its handlers' deliveries and those waiting for a thread


@dataclass
class Report:
    messages: int = 0
    confirmed: int = 0
    worker_kills: int = 0
    client_kills: int = 0
    redis_restarts: int = 0
    handler_calls: int = 0
    duplicates_presented: int = 0  # handler calls beyond one per message
    dead_lettered: int = 0
    max_in_flight_seen: int = 0
    max_held_seen: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


# -- child processes ---------------------------------------------------------------


def connect_retrying(url: str, prefix: str, seconds: float = 60) -> rqueue.Client:
    """A child may start while Redis is being restarted: keep trying."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return rqueue.connect(url, prefix=prefix)
        except rqueue.ConnectionFailed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def producer(url: str, prefix: str, first: int, count: int, out: str, seconds: float) -> None:
    """Publishes ids first..first+count-1 spread over ``seconds``, retrying
    each batch (same ids) until Redis confirms it; appends confirmed ids to
    ``out``."""
    with open(out, "a") as f:
        client = connect_retrying(url, prefix)
        q = client.queue(QUEUE)
        pause = seconds / max(1, count // BATCH)
        for start in range(first, first + count, BATCH):
            time.sleep(pause)
            ids = [f"m{i}" for i in range(start, min(start + BATCH, first + count))]
            deadline = time.monotonic() + 120
            while True:
                try:
                    q.publish_many([i.encode() for i in ids], ids=ids)
                    break
                except (redis.RedisError, OSError, rqueue.RQueueError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            f.write("\n".join(ids) + "\n")
            f.flush()


def worker(url: str, prefix: str, out: str) -> None:
    """A Worker whose handler appends "seq count" lines to ``out``."""
    client = connect_retrying(url, prefix)
    with open(out, "a", buffering=1) as log:

        def handler(d: rqueue.Delivery) -> None:
            log.write(f"{d.seq} {d.delivery_count}\n")
            time.sleep(random.uniform(0.005, 0.03))

        w = rqueue.Worker(
            client.queue(QUEUE),
            GROUP,
            handler,
            concurrency=CONCURRENCY,
            prefetch=PREFETCH,
            heartbeat_interval=0.2,
            heartbeat_timeout=1.0,
            grace_period=5,
            reconnect_timeout=120,
        )
        w.run()


# -- the run ------------------------------------------------------------------------


def run(seconds: float, messages: int, workers: int = 3, producers: int = 2, seed: int = 1) -> Report:
    rng = random.Random(seed)
    report = Report(messages=messages)
    work = Path(tempfile.mkdtemp(prefix="rqueue-chaos-"))
    server = EmbeddedServer(binary=find_binary(prefer="redis"), data_dir=work / "data", appendonly=True).start()
    prefix = "chaos"
    me = [sys.executable, str(Path(__file__).resolve())]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    client = rqueue.connect(server.url, prefix=prefix)
    client.configure(QUEUE, ack_wait=5, max_inflight=MAX_INFLIGHT, max_deliveries=-1)
    client.queue(QUEUE).consumer(GROUP, name="setup").close()  # the group exists from the start
    admin = redis.Redis(port=server.port, socket_timeout=2)

    def spawn(*args: str) -> subprocess.Popen[bytes]:
        # stderr kept (appended per role and slot) so that a child's failure names its cause
        slot = Path(args[-2] if args[0] == "producer" else args[-1]).stem  # p0, w1, ...
        with open(work / f"{args[0]}-{slot}.err", "ab") as log:
            return subprocess.Popen([*me, *args], env=env, stdout=subprocess.DEVNULL, stderr=log)

    per = messages // producers
    pace = str(seconds * 0.8)  # the load lasts through the chaos
    prods = [
        spawn("producer", server.url, prefix, str(i * per), str(per), str(work / f"p{i}.txt"), pace)
        for i in range(producers)
    ]
    report.messages = per * producers
    logs = [work / f"w{i}.txt" for i in range(workers)]
    procs = [spawn("worker", server.url, prefix, str(logs[i])) for i in range(workers)]
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            time.sleep(rng.uniform(0.3, 1.0))
            action = rng.choice(["kill-worker", "kill-worker", "client-kill", "restart-redis", "sample"])
            try:
                if action == "kill-worker":
                    i = rng.randrange(workers)
                    procs[i].kill()
                    procs[i].wait()
                    procs[i] = spawn("worker", server.url, prefix, str(logs[i]))
                    report.worker_kills += 1
                elif action == "client-kill":
                    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                    report.client_kills += 1
                elif action == "restart-redis":
                    server.kill()
                    server.start()
                    report.redis_restarts += 1
                else:
                    _sample(client, report)
            except (redis.RedisError, OSError, rqueue.RQueueError):
                pass  # the server was restarting; the next action goes on
        for p in prods:
            p.wait(120)
            if p.returncode != 0:
                tails = [f.read_text(errors="replace").strip().splitlines()[-3:] for f in work.glob("producer-*.err")]
                report.problems.append(f"a producer exited with {p.returncode}: {[t for t in tails if t]}")
        confirmed = set()
        for i in range(producers):
            path = work / f"p{i}.txt"
            confirmed |= set(path.read_text().split()) if path.exists() else set()
        report.confirmed = len(confirmed)
        q = client.queue(QUEUE)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                s = q.stats()
                _sample(client, report)
                g = s.group(GROUP)
                if s.last_seq >= report.confirmed and g.ack_floor == s.last_seq:
                    break
            except (redis.RedisError, OSError, rqueue.RQueueError, KeyError):
                pass
            time.sleep(0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs + prods:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    report.seconds = round(time.monotonic() - started, 1)
    _check(client, report, logs)
    client.close()
    admin.close()
    server.stop()
    return report


def _sample(client: rqueue.Client, report: Report) -> None:
    g = client.queue(QUEUE).stats().group(GROUP)
    report.max_in_flight_seen = max(report.max_in_flight_seen, g.in_flight)
    report.max_held_seen = max([report.max_held_seen] + [c.held for c in g.consumers if c.name != "setup"])


def _check(client: rqueue.Client, report: Report, logs: list[Path]) -> None:
    q = client.queue(QUEUE)
    s = q.stats()
    g = s.group(GROUP)
    calls: Counter[int] = Counter()
    for path in logs:
        for line in path.read_text().splitlines():
            seq, _count = line.split()
            calls[int(seq)] += 1
    report.handler_calls = sum(calls.values())
    report.duplicates_presented = report.handler_calls - len(calls)
    report.dead_lettered = s.dead_letters
    if s.last_seq != report.confirmed:
        report.problems.append(f"{report.confirmed} publishes confirmed but the queue holds seqs up to {s.last_seq}")
    if g.ack_floor != s.last_seq or g.pending != 0:
        report.problems.append(f"group not settled: floor {g.ack_floor}, pending {g.pending}, last seq {s.last_seq}")
    missing = [seq for seq in range(1, s.last_seq + 1) if seq not in calls]
    if len(missing) > s.dead_letters:
        report.problems.append(f"{len(missing)} messages never reached a handler, e.g. {missing[:5]}")
    if s.depth != 0:
        report.problems.append(f"{s.depth} records left after every message was settled")
    if report.max_in_flight_seen > MAX_INFLIGHT:
        report.problems.append(f"max_inflight {MAX_INFLIGHT} exceeded: {report.max_in_flight_seen}")
    if report.max_held_seen > PREFETCH:
        report.problems.append(f"prefetch {PREFETCH} exceeded: {report.max_held_seen}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("producer", "worker"):
        role, *args = sys.argv[1:]
        if role == "producer":
            producer(args[0], args[1], int(args[2]), int(args[3]), args[4], float(args[5]))
        else:
            worker(*args)
        return
    parser = argparse.ArgumentParser(description="rqueue chaos run (loopback only)")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    a = parser.parse_args()
    report = run(a.seconds, a.messages, a.workers, seed=a.seed)
    print(json.dumps(asdict(report), indent=2))
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
