"""The threads an asyncio worker runs plain (non-coroutine) handlers on."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreads(Executor):
    """Runs calls on ``size`` daemon threads of its own, made at the first
    call. concurrent.futures' ThreadPoolExecutor joins its threads when the
    interpreter exits, so one handler hung past its time limit or the stop
    would keep the process from ever exiting after ``run()`` returned; the
    threaded worker's handler threads are daemon threads for the same reason."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot run a call on threads shut down")
            if not self._threads:
                for i in range(self._size):
                    t = threading.Thread(target=self._serve, name=f"{self._name}_{i}", daemon=True)
                    t.start()
                    self._threads.append(t)
            done: Future[T] = Future()
            self._work.put((done, fn, args, kwargs))
        return done

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            done, fn, args, kwargs = item
            if not done.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the awaiting task, as ThreadPoolExecutor does
                done.set_exception(exc)
            else:
                done.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Takes no more calls; each thread ends once the calls before it
        are done (``wait``: this waits for that)."""
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for t in threads:
                t.join()
