"""The bench: every figure group, run in turn."""

from __future__ import annotations

import contextlib
import time

import redis

from rqueue.cli.bench.endtoend import EndToEndFigures
from rqueue.cli.bench.floor import FloorFigures
from rqueue.cli.bench.resources import ResourceFigures
from rqueue.cli.bench.throughput import ThroughputFigures


class Bench(ThroughputFigures, FloorFigures, EndToEndFigures, ResourceFigures):
    """Runs the groups of its config; one failing group leaves the others'
    figures in place."""

    def run(self) -> None:
        steps = {
            "publish": self.run_publish,
            "consume": self.run_consume,
            "e2e": self.run_e2e,
            "worker": self.run_worker,
            "latency": self.run_latency,
            "sweep": self.run_sweep,
            "floor": self.run_floor,
            "memory": self.run_memory,
            "cpu": self.run_cpu,
        }
        for group in self.config.groups:
            t0 = time.monotonic()
            try:
                steps[group]()
            except Exception as exc:  # one group failing must not lose the others' figures
                self.errors.append(f"{group}: {type(exc).__name__}: {exc}")
                self.progress.done(f"{group}: FAILED: {type(exc).__name__}: {exc}")
            else:
                self.progress.done(f"{group}: done in {time.monotonic() - t0:.1f} s")
            finally:
                with contextlib.suppress(redis.RedisError):
                    self.cleanup()
