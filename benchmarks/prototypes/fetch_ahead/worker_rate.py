"""A Worker's rate on N queued messages of 100 bytes, no-op handler, until
every ack is confirmed: msg/s, and CPU per message of this process and of
the server (/proc schedstat). With the prototype applied it also counts the
fetches sent ahead.

usage: python worker_rate.py N PREFETCH MODE   (PREFETCH 0: left to the
worker; MODE "batch" for a batch handler of 100 on one thread, or a number
of threads for a handler per message); SRV=<server binary> picks the server.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import rqueue
from rqueue.embedded import EmbeddedServer
from rqueue.worker import dispatcher

N = int(sys.argv[1])
PREFETCH = int(sys.argv[2]) or None
MODE = sys.argv[3]
sent_ahead = [0]

if hasattr(dispatcher.Dispatcher, "_send"):  # the prototype
    send = dispatcher.Dispatcher._send

    def counted(self: Any, *args: Any) -> Any:
        sent = send(self, *args)
        sent_ahead[0] += sent is not None
        return sent

    dispatcher.Dispatcher._send = counted


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def main() -> None:
    with EmbeddedServer(binary=os.environ.get("SRV")) as server, rqueue.connect(server.url) as client:
        assert server.process is not None
        q = client.queue("rate")
        q.consumer("g").close()
        for _ in range(0, N, 1000):
            q.publish_many([b"x" * 100] * 1000)
        done = threading.Event()
        count = [0]
        lock = threading.Lock()

        @rqueue.batch_handler(size=100)
        def batch(ds: list[rqueue.Delivery]) -> list[bool]:
            count[0] += len(ds)
            if count[0] >= N:
                done.set()
            return [True] * len(ds)

        def one(d: rqueue.Delivery) -> None:
            with lock:
                count[0] += 1
                if count[0] >= N:
                    done.set()

        handler: Any = batch if MODE == "batch" else one
        threads = 1 if MODE == "batch" else int(MODE)
        w = rqueue.Worker(q, "g", handler, concurrency=threads, scheduler=False, prefetch=PREFETCH)
        redis0, client0, t0 = cpu_s(server.process.pid), time.process_time(), time.perf_counter()
        w.start()
        done.wait(300)
        while w.stats.acked < N:
            time.sleep(0.001)
        t1, client1, redis1 = time.perf_counter(), time.process_time(), cpu_s(server.process.pid)
        w.stop()
        w.join(30)
        print(
            f"rate {N / (t1 - t0):,.0f} msg/s client {1e6 * (client1 - client0) / N:.2f} "
            f"redis {1e6 * (redis1 - redis0) / N:.2f} us/msg ahead={sent_ahead[0]} fetched={w.stats.fetched}"
        )


main()
