"""Instructions the Python client spends per message, counted by callgrind.

icount.py counts Redis's side of a call; this counts the client's: the
consume loop of the bench's consume_batch figure (fetch(100), read each
payload, ack the list) and its Streams reference (XREADGROUP COUNT 100,
read each entry's field, XACK the ids), each in a Python process of its
own under valgrind, instrumented only while the loop runs (callgrind's
--instr-atstart=no, switched on and off by callgrind_control at a
handshake), against a private redis-server on a free port
(rqueue.embedded.EmbeddedServer). User-space instructions only: the
kernel's share of a socket call is not counted. The counts repeat to a
few in 10^4 from run to run (PYTHONHASHSEED=0).

usage: .venv/bin/python benchmarks/client_icount.py [N] [BATCH]
  N messages (default 5000) consumed BATCH at a time (default 100);
  prints instructions per message for rqueue and for redis-py Streams.
  To compare two trees, run it with PYTHONPATH=<other checkout>.
Needs valgrind and redis-server on PATH. Takes about a minute.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import redis
from consume_loops import PAYLOAD, drain_rqueue, drain_streams, fill_stream

import rqueue
from rqueue.embedded import EmbeddedServer

WARMUP = 2000  # consumed before the count starts: scripts loaded, caches warm


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


def child(kind: str, url: str, n: int, batch: int, handshake: Path) -> None:
    """The measured process: fills its queue or stream, warms up, then
    runs the loop between the handshake's files."""
    drain: Callable[[int], None]
    if kind == "rqueue":
        client = rqueue.connect(url, prefix="client-icount")
        queue = client.queue("q")
        consumer = queue.consumer("g", "c1")
        for _ in range(0, n + WARMUP, 1000):
            queue.publish_many([PAYLOAD] * 1000)
        drain = partial(drain_rqueue, consumer, batch=batch)
    else:
        r = redis.Redis.from_url(url)
        fill_stream(r, "st", n + WARMUP)
        drain = partial(drain_streams, r, "st", batch=batch)

    drain(WARMUP)
    (handshake / "ready").touch()
    wait_for(handshake / "go")
    drain(n)
    (handshake / "done").touch()
    wait_for(handshake / "stop")


def count(kind: str, url: str, n: int, batch: int) -> int:
    """Instructions of ``kind``'s loop of n messages."""
    with tempfile.TemporaryDirectory(prefix="rqueue-client-icount-") as tmp:
        handshake = Path(tmp)
        log = handshake / "valgrind.log"
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={handshake / 'callgrind.out'}",
                f"--log-file={log}",
                sys.executable,
                __file__,
                "--child",
                kind,
                url,
                str(n),
                str(batch),
                tmp,
            ],
            env=env,
        )

        def ctl(switch: str) -> None:
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            subprocess.run(["callgrind_control", "-i", switch, str(proc.pid)], check=True, **quiet)

        for step, switch, then in (("ready", "on", "go"), ("done", "off", "stop")):
            while not (handshake / step).exists():
                if proc.poll() is not None:
                    raise SystemExit(f"the {kind} process ended early; see its output above")
                time.sleep(0.1)
            ctl(switch)
            (handshake / then).touch()
        if proc.wait() != 0:
            raise SystemExit(f"the {kind} process failed")
        found = re.search(r"Collected : ([\d,]+)", log.read_text())
        if found is None:
            raise SystemExit(f"no count in {log}")
        return int(found.group(1).replace(",", ""))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, url, n, batch, handshake = sys.argv[2:7]
        child(kind, url, int(n), int(batch), Path(handshake))
        return 0
    if len(sys.argv) > 1 and not sys.argv[1].isdigit():
        print(__doc__)
        return 2
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    # Redis's own binary (not valkey's), as icount.py and the bench use.
    with EmbeddedServer(binary="redis-server") as server:
        print(f"client instructions per message, fetch({batch}) + ack, N={n} (rqueue from {rqueue.__file__})")
        counts = {kind: count(kind, server.url, n, batch) / n for kind in ("rqueue", "streams")}
        print(f"  rqueue:  {counts['rqueue']:,.0f}")
        print(f"  streams: {counts['streams']:,.0f} (XREADGROUP COUNT {batch} + XACK, redis-py)")
        print(f"  ratio:   {counts['rqueue'] / counts['streams']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
