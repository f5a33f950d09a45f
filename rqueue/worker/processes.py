"""Hard time limits: a handler run in a process of its own, which is killed
when its time limit passes (docs/worker.md, "Time limits").

``InProcess("module.path:function")`` is a handler for :class:`rqueue.Worker`
that runs the named function in a child process, one per handler thread,
taken from children started ahead: the worker starts one per thread and a
spare before it fetches, and each child taken is replaced by a new spare
in the background. A thread whose child was killed (its time limit) or
died takes the spare, so a child's start (the interpreter, the handler's
imports) does not count against a message's limit while spares keep up.
The child gets a copy of the delivery's data (seq, payload, headers,
delivery count), not the delivery itself: the worker settles it from the
outcome.
Requests and replies cross the pipe as length-prefixed JSON and bytes, with
the return value encoded as rqueue.stored_results encodes results: nothing
is pickled.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from typing import IO, TYPE_CHECKING, Any

from ..errors import InvalidInput, Reject, TimeLimitExceeded
from ..stored_results import BYTES, JSON, encode_value
from ..timelimits import cancellation
from .loading import load_handler

if TYPE_CHECKING:
    from ..delivery import Delivery

# How often a thread waiting for its child looks at its cancellation, seconds.
LOOK_INTERVAL = 0.05
# Reply kinds of the child, and what it writes once it has loaded its handler.
OK, REJECTED, FAILED, READY = b"o", b"r", b"x", b"!"


class ChildFailed(Exception):
    """The handler raised in its process (its type and text are this
    exception's text), or the process ended without a reply."""


class InProcess:
    """A handler that runs ``spec`` (``module.path:function``) in a child
    process per handler thread, killed (SIGKILL) once the run's time limit
    passes. The function is imported here first, so a bad name fails at
    once; the child imports it again."""

    def __init__(self, spec: str) -> None:
        load_handler(spec)  # a bad spec is refused here, not in every child
        self.spec = spec
        self._local = threading.local()
        self._lock = threading.Lock()
        self._children: list[subprocess.Popen[bytes]] = []
        self._spares: list[subprocess.Popen[bytes]] = []  # started and ready, no thread's yet
        self._closed = False
        self._warming = 0  # spares being started in the background

    def start(self, n: int) -> None:
        """Starts ``n`` children and a spare, and waits until each has loaded
        the handler (the worker calls it before it fetches, ``n`` its
        handler threads)."""
        started = [self._spawn() for _ in range(n + 1)]
        ready = [child for child in started if self._ready(child)]
        with self._lock:
            self._spares += ready

    def __call__(self, d: Delivery) -> Any:
        child = self._child()
        assert child.stdin is not None and child.stdout is not None
        head = json.dumps(
            {"seq": d.seq, "delivery_count": d.delivery_count, "headers": d.headers, "published_ms": d.published_ms}
        ).encode()
        try:
            _write(child.stdin, head)
            _write(child.stdin, d.data)
        except OSError:
            self._kill(child)
            raise ChildFailed(f"the handler's process ended (exit code {child.poll()})") from None
        c = cancellation()
        fd = child.stdout.fileno()
        while True:
            if c.cancelled:
                self._kill(child)  # the hard limit: whatever it was doing ends here
                raise TimeLimitExceeded(c.limit)
            ready, _, _ = select.select([fd], [], [], LOOK_INTERVAL)
            if ready:
                break
        kind = child.stdout.read(1)
        body = _read(child.stdout) if kind else None
        if body is None:
            self._kill(child)
            raise ChildFailed(f"the handler's process ended (exit code {child.wait()})")
        if kind == REJECTED:
            raise Reject(body.decode(errors="replace"))
        if kind == FAILED:
            raise ChildFailed(body.decode(errors="replace"))
        return _decode(body)

    def close(self) -> None:
        """Ends every child (the worker calls it when it stops)."""
        with self._lock:
            self._closed = True
            children, self._children, self._spares = self._children, [], []
        for child in children:
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(2)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def _child(self) -> subprocess.Popen[bytes]:
        """This thread's child: a spare started ahead (replaced in the
        background), or one started now where none is left (a handler
        called outside a worker, or spares that could not keep up)."""
        child: subprocess.Popen[bytes] | None = getattr(self._local, "child", None)
        while child is None or child.poll() is not None:
            with self._lock:
                child = self._spares.pop() if self._spares else None
                # One spare at most, ready or starting: a thread that takes
                # the last one starts the next.
                warm = child is not None and not self._spares and not self._warming and not self._closed
                self._warming += warm
            if warm:
                threading.Thread(target=self._add_spare, name="rqueue-inprocess-spare", daemon=True).start()
            if child is None:
                child = self._spawn()
                if not self._ready(child):
                    raise ChildFailed(f"the handler's process ended as it started (exit code {child.wait()})")
            self._local.child = child
        return child

    def _add_spare(self) -> None:
        """Starts a spare in the background (a thread of its own): it is
        ready for the next thread that needs a child."""
        child = self._spawn()
        ready = self._ready(child)
        with self._lock:
            self._warming -= 1
            if ready and not self._closed:
                self._spares.append(child)
                return
            if child in self._children:  # closed meanwhile: not left to the worker's stop
                self._children.remove(child)
        child.kill()
        child.wait()

    def _spawn(self) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            [sys.executable, "-m", "rqueue.worker.child", self.spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)},
        )
        with self._lock:
            self._children = [c for c in self._children if c.poll() is None] + [child]
        return child

    @staticmethod
    def _ready(child: subprocess.Popen[bytes]) -> bool:
        """Waits until ``child`` has loaded its handler; False when it ended
        instead (its import failed: its error is on the worker's stderr)."""
        assert child.stdout is not None
        return child.stdout.read(1) == READY

    def _kill(self, child: subprocess.Popen[bytes]) -> None:
        child.kill()
        child.wait()
        self._local.child = None


def _write(out: IO[bytes], data: bytes) -> None:
    out.write(len(data).to_bytes(4, "big") + data)
    out.flush()


def _read(src: IO[bytes]) -> bytes | None:
    size = src.read(4)
    if len(size) < 4:
        return None
    n = int.from_bytes(size, "big")
    data = src.read(n)
    return data if len(data) == n else None


def _decode(body: bytes) -> Any:
    if body[:1] == BYTES:
        return body[1:]
    if body[:1] == JSON:
        return json.loads(body[1:])
    raise ChildFailed(f"the handler's process sent a reply that does not parse: {body[:40]!r}")


class ChildDelivery:
    """What a handler in a child process gets: the delivery's data, without
    the means to settle it (the worker settles it from the outcome)."""

    def __init__(self, head: dict[str, Any], data: bytes) -> None:
        self.seq: int = head["seq"]
        self.delivery_count: int = head["delivery_count"]
        self.headers: dict[str, str] = head["headers"]
        self.published_ms: int = head["published_ms"]
        self.data = data

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1


def serve(spec: str, src: IO[bytes], out: IO[bytes]) -> None:
    """The child's loop: one request in, one reply out, until stdin ends."""
    handler = load_handler(spec)
    out.write(READY)
    out.flush()
    while True:
        head = _read(src)
        data = _read(src) if head is not None else None
        if head is None or data is None:
            return
        try:
            value = handler(ChildDelivery(json.loads(head), data))
            reply = OK, encode_value(value)
        except Reject as exc:
            reply = REJECTED, exc.reason.encode()
        except InvalidInput as exc:
            reply = FAILED, f"InvalidInput: {exc}".encode()
        except Exception as exc:
            reply = FAILED, f"{type(exc).__name__}: {exc}".encode()
        out.write(reply[0])
        _write(out, reply[1])
