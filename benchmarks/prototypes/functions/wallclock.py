"""Redis CPU per message, EVALSHA against FCALL, by INFO commandstats.

One private redis-server (no valgrind); rounds of fetch(1) then its ack,
one message at a time, N messages a run, each run in a fresh process on a
fresh queue, EVALSHA and FCALL runs alternating. Before the counted part a
run publishes its N messages in batches and does a warm-up, then CONFIG
RESETSTAT; after it, INFO commandstats gives the evalsha (or fcall) calls
and microseconds, and INFO cpu the main thread's CPU time. Prints per
mode the median over the rounds of usec per call, usec per message (a
fetch and an ack) and the main thread's CPU microseconds per message
(that one includes reading requests and writing replies).

usage: .venv/bin/python benchmarks/prototypes/functions/wallclock.py [N] [ROUNDS]
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

PAYLOAD = b"x" * 100


def main_thread_cpu(r: Any) -> float:
    """Seconds of CPU Redis's main thread has used (INFO cpu): unlike
    commandstats' usec, which is wall time inside the command, it does not
    count the time the server waits for a core other processes hold."""
    info = r.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def one_run(mode: str, port: int, queue_name: str, n: int) -> None:
    import redis

    import rqueue

    if mode == "fcall":
        import fcall

        fcall.install()
    r = redis.Redis(port=port)
    client = rqueue.connect(f"redis://127.0.0.1:{port}", prefix="wall")
    client.configure(queue_name, ack_wait=3600, prefetch=10**6, max_inflight=10**6)
    queue = client.queue(queue_name)
    consumer = queue.consumer("g", "c1")
    for start in range(0, n + 200, 1000):
        queue.publish_many([PAYLOAD] * min(1000, n + 200 - start))
    for _ in range(200):
        consumer.fetch(1)[0].ack()
    r.config_resetstat()
    before = main_thread_cpu(r)
    for _ in range(n):
        consumer.fetch(1)[0].ack()
    cpu = main_thread_cpu(r) - before
    stats = r.info("commandstats")[f"cmdstat_{mode}"]
    got = {"calls": stats["calls"], "usec": stats["usec"], "usec_per_call": stats["usec_per_call"]}
    got["cpu_usec_per_message"] = round(cpu * 1e6 / n, 2)
    print(json.dumps(got))
    client.close()


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="rqueue-wall-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results: dict[str, list[dict[str, float]]] = {"evalsha": [], "fcall": []}
    try:
        time.sleep(0.5)
        for i in range(rounds):
            for mode in ("evalsha", "fcall"):
                out = subprocess.run(
                    [sys.executable, __file__, "run", mode, str(port), f"q{mode}{i}", str(n)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                got = json.loads(out.strip().splitlines()[-1])
                got["per_message"] = got["usec"] / n
                results[mode].append(got)
                print(mode, i, got, flush=True)
    finally:
        server.terminate()
        server.wait(10)
    for mode, runs in results.items():
        each = ", ".join(f"{r['usec_per_call']:.2f}" for r in runs)
        cpu = ", ".join(f"{r['cpu_usec_per_message']:.2f}" for r in runs)
        print(
            f"{mode}: usec_per_call median {statistics.median(r['usec_per_call'] for r in runs):.2f} "
            f"({each}); usec per fetch(1)+ack median {statistics.median(r['per_message'] for r in runs):.2f}; "
            f"main-thread CPU usec per fetch(1)+ack median "
            f"{statistics.median(r['cpu_usec_per_message'] for r in runs):.2f} ({cpu})"
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        one_run(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(main())
