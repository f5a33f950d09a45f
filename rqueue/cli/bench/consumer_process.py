"""A consumer process of the e2e and latency figures, started by
rqueue.cli.bench.child.Child (whose docstring has the protocol): it reads its
configuration from the environment and writes one JSON object per line on
stdout. Run as a script, it imports only the standard library, redis-py and,
for an rqueue queue, rqueue: not the command line, whose import would be
most of its start-up."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import redis

CHILD_ENV = "RQUEUE_BENCH_CHILD"


class ProcessError(Exception):
    """The measurement cannot go on; reported to the benchmark process."""


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, interpolated between the
    two nearest; NaN when there is none."""
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def sent_at(data: bytes) -> float:
    """The publish time that rqueue.cli.bench.spec.payload puts first."""
    return float(data.split(b"|", 1)[0])


def _say(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


class _Tally:
    """The measured messages of one phase."""

    def __init__(self, expect: int, latency: bool) -> None:
        self.expect = expect
        self.latency = latency
        self.count = 0
        self.first: float | None = None
        self.lat: list[float] = []
        self.reported = False

    def hit(self, data: bytes, now: float) -> None:
        if self.first is None:
            self.first = now
        self.count += 1
        if self.latency:
            self.lat.append(now - sent_at(data))

    def result(self, last: float) -> dict[str, Any]:
        out: dict[str, Any] = {"first": self.first, "last": last, "count": self.count}
        if self.latency:
            s = sorted(self.lat)
            out.update(
                p50_ms=percentile(s, 0.50) * 1000,
                p90_ms=percentile(s, 0.90) * 1000,
                p99_ms=percentile(s, 0.99) * 1000,
                max_ms=s[-1] * 1000 if s else float("nan"),
            )
        return out


class _Phases:
    """Handler-side bookkeeping of a consumer process: the open phase, the
    control messages of the batch in hand, and how long it has been idle."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.idle_limit = float(spec["idle_timeout"])
        self.control = str(spec["control"]).encode()
        self.parent = int(spec["parent_pid"])
        self.tally: _Tally | None = None
        self.armed = False
        self.switch_to: str | None = None
        self.idle_since = time.monotonic()

    def hit(self, data: bytes, now: float) -> None:
        """One message of the batch in hand, ``now`` being its handler start."""
        if data.startswith(self.control):
            msg = json.loads(data[len(self.control) :])
            if "phase" in msg:
                self.tally = _Tally(int(msg["phase"]["expect"]), bool(msg["phase"]["latency"]))
                self.armed = True
            elif "switch" in msg:
                self.switch_to = str(msg["switch"])
            else:
                raise ProcessError(f"unknown control message {msg!r}")
            return
        if self.tally is None or self.tally.reported:
            raise ProcessError("a measured message came outside a phase")
        self.tally.hit(data, now)

    def settled(self) -> str | None:
        """After the batch's ack: tells the benchmark process what the batch
        did; returns the queue (or stream) to move to, if one was named."""
        self.idle_since = time.monotonic()
        if self.armed:
            self.armed = False
            _say(event="armed")
        t = self.tally
        if t is not None and not t.reported and t.count >= t.expect:
            t.reported = True
            _say(event="done", **t.result(time.time()))
        switch_to, self.switch_to = self.switch_to, None
        return switch_to

    def idle(self) -> bool:
        """After an empty fetch: False when the process should end (the
        benchmark process is gone); raises when a phase is open and its
        messages stopped coming. With no phase open, waiting has no limit:
        the other system's figures may run for a long time meanwhile."""
        if os.getppid() != self.parent:
            return False
        t = self.tally
        if t is not None and not t.reported and time.monotonic() - self.idle_since > self.idle_limit:
            raise ProcessError(f"no message for {self.idle_limit:.0f} s after {t.count} of {t.expect}")
        return True


def main() -> None:
    """Entry point of a consumer process."""
    spec = json.loads(os.environ[CHILD_ENV])
    try:
        if spec["kind"] == "rqueue":
            _child_rqueue(spec)
        else:
            _child_streams(spec)
    except BaseException as exc:  # reported to the parent, which decides
        _say(event="error", error=f"{type(exc).__name__}: {exc}")
        sys.exit(1)


def _child_rqueue(spec: dict[str, Any]) -> None:
    import rqueue  # here: a stream's process does without it

    phases = _Phases(spec)
    group, batch = spec["group"], int(spec["batch"])
    with rqueue.connect(spec["url"], prefix=spec["prefix"]) as client:
        consumer = client.queue(spec["queue"]).consumer(group, name="bench-child")
        consumer.fetch(batch, timeout=0.05)  # subscribes to the wake-up channel; the queue is empty
        _say(event="ready")
        while True:
            deliveries = consumer.fetch(batch, timeout=1.0)
            if not deliveries:
                if not phases.idle():
                    break
                continue
            for d in deliveries:
                phases.hit(d.data, time.time())
            consumer.ack(deliveries)
            switch_to = phases.settled()
            if switch_to is not None:
                consumer.close()
                consumer = client.queue(switch_to).consumer(group, name="bench-child")
                consumer.fetch(batch, timeout=0.05)
                _say(event="switched")
        consumer.close()


def _child_streams(spec: dict[str, Any]) -> None:
    phases = _Phases(spec)
    group, batch = spec["group"], int(spec["batch"])
    r = redis.Redis.from_url(spec["url"])
    stream = spec["stream"]
    field_name = str(spec["field"]).encode()
    _say(event="ready")
    while True:
        resp: Any = r.xreadgroup(group, "bench-child", {stream: ">"}, count=batch, block=1000)
        if not resp or not resp[0][1]:
            if not phases.idle():
                break
            continue
        ids = []
        for eid, fields in resp[0][1]:
            phases.hit(fields[field_name], time.time())
            ids.append(eid)
        r.xack(stream, group, *ids)
        switch_to = phases.settled()
        if switch_to is not None:
            stream = switch_to
            _say(event="switched")
    r.close()


if __name__ == "__main__":
    main()
