"""The consumer processes of the e2e and latency figures: :class:`Child`
starts one (rqueue/cli/bench/consumer_process.py) and reads its reports, one
JSON object per line on its stdout.

A consumer process consumes one queue (or stream) at a time and measures in
phases. The benchmark process steers it with control messages, published to
the queue it consumes (:func:`control`): ``{"phase": {"expect": n,
"latency": bool}}`` opens a phase (the process answers ``armed`` once it has
handled and acked that message, so it is idle in its fetch when the measured
messages come) and ``done`` follows when n messages of the phase were handled
and acked; ``{"switch": name}`` moves it to another queue (or stream, whose
group the benchmark process has created), answered by ``switched`` once it
fetches from there. One process serves several figures of a run, and it
imports neither the command line nor (for a stream) rqueue: starting the
processes is most of what these figures cost a quick run."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rqueue.cli.bench import consumer_process
from rqueue.cli.bench.consumer_process import CHILD_ENV
from rqueue.cli.bench.spec import BATCH, CONTROL, GROUP, STREAM_FIELD, BenchError

PROCESS_FILE = Path(consumer_process.__file__)
# Runs PROCESS_FILE as a script, so that Python does not import the packages
# above it (rqueue.cli imports every command).
BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


def control(**msg: Any) -> bytes:
    """A control message for a consumer process (see the module's docstring)."""
    return CONTROL + json.dumps(msg).encode()


class Child:
    """A consumer process (consumer_process.py), configured by one JSON
    document in the environment (the URL never shows in ``ps``), answering
    with one JSON object per line on stdout. ``spec`` gets the bench's
    constants added (the process does not import them)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env[CHILD_ENV] = json.dumps(
            {
                **spec,
                "batch": BATCH,
                "group": GROUP,
                "field": STREAM_FIELD,
                "control": CONTROL.decode(),
                "parent_pid": os.getpid(),
            }
        )
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the child's life, closed by stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, str(PROCESS_FILE)],
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
