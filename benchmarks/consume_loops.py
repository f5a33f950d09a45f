"""The consume loops the benchmarks share, as the bench's consume_batch
figure runs them: rqueue's (fetch a batch, read each payload, ack the
list) and its Streams reference (XREADGROUP COUNT, read each entry's field,
XACK the ids), and the stream with group "g" that the reference reads."""

from __future__ import annotations

from typing import Any

import redis

PAYLOAD = b"x" * 100
CHUNK = 1000  # XADDs per pipeline


def fill_stream(r: redis.Redis, key: str, n: int, payload: bytes = PAYLOAD) -> None:
    """Makes stream ``key`` with group "g" at its start, and n entries."""
    r.xgroup_create(key, "g", id="0", mkstream=True)
    for done in range(0, n, CHUNK):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(CHUNK, n - done)):
            pipe.xadd(key, {"d": payload})
        pipe.execute()


def drain_rqueue(consumer: Any, k: int, batch: int) -> None:
    """Consumes k messages with ``consumer`` (an rqueue.Consumer)."""
    done = 0
    while done < k:
        ds = consumer.fetch(batch)
        for d in ds:
            d.data  # noqa: B018  # read as a handler would
        consumer.ack(ds)
        done += len(ds)


def drain_streams(r: redis.Redis, key: str, k: int, batch: int) -> None:
    """Consumes k entries of ``key`` as consumer "c1" of group "g"."""
    done = 0
    while done < k:
        resp = r.xreadgroup("g", "c1", {key: ">"}, count=batch)
        ids = []
        for eid, fields in resp[0][1]:
            fields[b"d"]  # noqa: B018
            ids.append(eid)
        r.xack(key, "g", *ids)
        done += len(ids)
