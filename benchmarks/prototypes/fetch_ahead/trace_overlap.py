"""worker_rate.py (same arguments) with the prototype applied, traced: the
share of the timed run during which a call is out (sent, its reply not yet
read), the dispatcher is blocked reading a reply, and the batch handler
runs (the middle 80% of the run)."""

from __future__ import annotations

import runpy
import threading
import time
from typing import Any

from rqueue.engine import scripts
from rqueue.worker import handlers

spans: list[tuple[float, float, str, float]] = []  # (start, end, kind, read began)
now = time.perf_counter
init, reply, direct, work_batch = (
    scripts.SentScript.__init__,  # type: ignore[attr-defined]
    scripts.SentScript.reply,  # type: ignore[attr-defined]
    scripts.Script._direct,
    handlers.Handlers._work_batch,
)


def traced_init(self: Any, *args: Any) -> None:
    self.sent_at = now()
    init(self, *args)


def traced_reply(self: Any) -> Any:
    began = now()
    got = reply(self)
    spans.append((self.sent_at, now(), "ahead", began))
    return got


def traced_direct(self: Any, keys: Any, args: Any) -> Any:
    began = now()
    got = direct(self, keys, args)
    if threading.current_thread().name == "rqueue-worker":
        spans.append((began, now(), "call", began))
    return got


def traced_batch(self: Any, ds: Any) -> Any:
    began = now()
    got = work_batch(self, ds)
    spans.append((began, now(), "handler", began))
    return got


def covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    total, current = 0.0, None
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi):
        if current is None or a > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = [a, b]
        else:
            current[1] = max(current[1], b)
    if current is not None:
        total += current[1] - current[0]
    return total


scripts.SentScript.__init__ = traced_init  # type: ignore[attr-defined]
scripts.SentScript.reply = traced_reply  # type: ignore[attr-defined]
scripts.Script._direct = traced_direct  # type: ignore[method-assign]
handlers.Handlers._work_batch = traced_batch  # type: ignore[method-assign]
try:
    runpy.run_path("worker_rate.py", run_name="__main__")
finally:
    starts = sorted(s[0] for s in spans)
    lo, hi = starts[len(starts) // 10], starts[-len(starts) // 10]
    out = covered([(a, b) for a, b, kind, _ in spans if kind != "handler"], lo, hi)
    blocked = covered([(r, b) for _, b, kind, r in spans if kind != "handler"], lo, hi)
    ran = covered([(a, b) for a, b, kind, _ in spans if kind == "handler"], lo, hi)
    span = hi - lo
    print(f"a call out {out / span:.0%}, dispatcher blocked reading {blocked / span:.0%}, handler {ran / span:.0%}")
