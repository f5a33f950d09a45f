"""The consumer processes of the e2e and latency figures: started by
:class:`Child`, run by :func:`child_main`, reporting one JSON object per
line on stdout."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import redis

import rqueue
from rqueue.cli.bench.spec import BATCH, GROUP, STREAM_FIELD, WARMUP, BenchError, sent_at

CHILD_ENV = "RQUEUE_BENCH_CHILD"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, interpolated between the
    two nearest; NaN when there is none."""
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


class Child:
    """A consumer process: ``python -c 'from rqueue.cli.bench.child import child_main'``,
    configured by one JSON document in the environment (the URL never shows in
    ``ps``), answering with one JSON object per line on stdout."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env[CHILD_ENV] = json.dumps(spec)
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the child's life, closed by stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from rqueue.cli.bench.child import child_main; child_main()"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env=env,
        )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._buf = b""

    def _stderr_tail(self) -> str:
        try:
            self._err.seek(0)
            return self._err.read()[-1500:].decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def read(self, event: str, timeout: float) -> dict[str, Any]:
        """Waits for the line with ``"event": event``; raises BenchError on an
        error line, on the child's exit or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if not line.strip():
                    continue
                msg = json.loads(line)
                if msg.get("event") == "error":
                    raise BenchError(f"consumer process failed: {msg.get('error')}")
                if msg.get("event") == event:
                    return msg
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(
                    f"consumer process sent no {event!r} within {timeout:.0f} s; stderr: {self._stderr_tail()}"
                )
            if not self._selector.select(min(remaining, 1.0)):
                continue
            chunk = os.read(self._fd, 65536)
            if not chunk:
                rc = self.proc.wait()
                raise BenchError(f"consumer process exited (rc={rc}) before {event!r}; stderr: {self._stderr_tail()}")
            self._buf += chunk

    def stop(self) -> None:
        """Ends the process (by its own handle) and frees its pipes."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._selector.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


def _say(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


class _Tally:
    """Handler-side bookkeeping of a consumer process."""

    def __init__(self, expect: int, latency: bool) -> None:
        self.expect = expect
        self.latency = latency
        self.count = 0
        self.first: float | None = None
        self.lat: list[float] = []

    def hit(self, data: bytes, now: float) -> bool:
        """Counts one message; True for the warm-up message."""
        if data.startswith(WARMUP):
            return True
        if self.first is None:
            self.first = now
        self.count += 1
        if self.latency:
            self.lat.append(now - sent_at(data))
        return False

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


def child_main() -> None:
    """Entry point of a consumer process (see :class:`Child`)."""
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
    tally = _Tally(spec["expect"], spec["latency"])
    idle_limit = float(spec["idle_timeout"])
    with rqueue.connect(spec["url"], prefix=spec["prefix"]) as client:
        consumer = client.queue(spec["queue"]).consumer(GROUP, name="bench-child")
        consumer.fetch(BATCH, timeout=0.05)  # subscribes to the wake-up channel; the queue is empty
        _say(event="ready")
        idle_since = time.monotonic()
        while tally.count < tally.expect:
            deliveries = consumer.fetch(BATCH, timeout=1.0)
            if not deliveries:
                if time.monotonic() - idle_since > idle_limit:
                    raise BenchError(f"no message for {idle_limit:.0f} s after {tally.count} of {tally.expect}")
                continue
            warm = False
            for d in deliveries:
                warm |= tally.hit(d.data, time.time())
            consumer.ack(deliveries)
            if warm:
                _say(event="warm")
            idle_since = time.monotonic()
        _say(event="done", **tally.result(time.time()))
        consumer.close()


def _child_streams(spec: dict[str, Any]) -> None:
    tally = _Tally(spec["expect"], spec["latency"])
    idle_limit = float(spec["idle_timeout"])
    r = redis.Redis.from_url(spec["url"])
    stream = spec["stream"]
    _say(event="ready")
    idle_since = time.monotonic()
    while tally.count < tally.expect:
        resp: Any = r.xreadgroup(GROUP, "bench-child", {stream: ">"}, count=BATCH, block=1000)
        if not resp or not resp[0][1]:
            if time.monotonic() - idle_since > idle_limit:
                raise BenchError(f"no message for {idle_limit:.0f} s after {tally.count} of {tally.expect}")
            continue
        warm = False
        ids = []
        for eid, fields in resp[0][1]:
            warm |= tally.hit(fields[STREAM_FIELD.encode()], time.time())
            ids.append(eid)
        r.xack(stream, GROUP, *ids)
        if warm:
            _say(event="warm")
        idle_since = time.monotonic()
    _say(event="done", **tally.result(time.time()))
    r.close()
