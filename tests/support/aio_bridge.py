"""The asyncio client driven through the sync client's API, so that a test
written for rqueue.connect runs unchanged against rqueue.aio.connect: each
call runs (and is awaited) on an event loop in a thread of its own, and
every rqueue.aio object it returns is wrapped again.

What differs by design is mapped here, and only this: ``client.queue(name,
partitions=)`` is ``await client.open_queue(...)`` (the asyncio client's
``queue()`` sends nothing), ``q.consumer(...)`` joins at once (the asyncio
consumer joins on ``async with``), ``dead_letter_queue`` is awaited (a
property of the sync queue), and ``client.redis`` is a sync Redis client of
the same server, for the tests' own reads and writes.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from typing import Any

import rqueue
import rqueue.aio

CALLED_AS_PROPERTY = {"dead_letter_queue"}  # a property of the sync class, a coroutine method of the asyncio one


class Loop:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.sync: rqueue.Client | None = None  # a sync client of the same server, for the tests' own reads
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="aio-bridge")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _is_aio(value: object) -> bool:
    return type(value).__module__.startswith("rqueue.aio")


def wrap(value: Any, loop: Loop) -> Any:
    if isinstance(value, rqueue.aio.Client) and loop.sync is not None:
        return BridgedClient(value, loop, loop.sync)
    if _is_aio(value):
        return Bridge(value, loop)
    if isinstance(value, list):
        return [wrap(v, loop) for v in value]
    if isinstance(value, tuple):
        items = [wrap(v, loop) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def unwrap(value: Any) -> Any:
    if isinstance(value, Bridge):
        return object.__getattribute__(value, "_target")
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(unwrap(v) for v in value)  # also (delivery, value) pairs
    return value


def _twins() -> dict[type, type]:
    return {
        rqueue.aio.Client: rqueue.Client,
        rqueue.aio.Queue: rqueue.Queue,
        rqueue.aio.PartitionedQueue: rqueue.PartitionedQueue,
        rqueue.aio.Consumer: rqueue.Consumer,
        rqueue.aio.PartitionedConsumer: rqueue.PartitionedConsumer,
        rqueue.aio.Delivery: rqueue.Delivery,
    }


class Bridge:
    """One rqueue.aio object, called as its sync twin (``isinstance`` says
    it is one)."""

    @property  # type: ignore[misc]  # isinstance() reads __class__
    def __class__(self) -> type:
        target = type(object.__getattribute__(self, "_target"))
        return _twins().get(target, target)

    def __init__(self, target: Any, loop: Loop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def __getattr__(self, name: str) -> Any:
        target, loop = object.__getattribute__(self, "_target"), object.__getattribute__(self, "_loop")
        attr = getattr(target, name)
        if name in CALLED_AS_PROPERTY:
            return wrap(loop.run(attr()), loop)
        if not callable(attr) or isinstance(attr, type):
            return wrap(attr, loop)

        def call(*args: Any, **kwargs: Any) -> Any:
            async def run() -> Any:
                result = attr(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in kwargs.items()})
                if inspect.isawaitable(result):
                    result = await result
                if name == "consumer":
                    result = await result.join()
                return result

            return wrap(loop.run(run()), loop)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_target"), name, unwrap(value))

    def __eq__(self, other: object) -> bool:
        return object.__getattribute__(self, "_target") == unwrap(other)

    def __hash__(self) -> int:
        return hash(object.__getattribute__(self, "_target"))

    def __repr__(self) -> str:
        return repr(object.__getattribute__(self, "_target"))

    def __enter__(self) -> Bridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BridgedClient(Bridge):
    """An rqueue.aio.Client called as an rqueue.Client."""

    def __init__(self, target: rqueue.aio.Client, loop: Loop, sync: rqueue.Client) -> None:
        super().__init__(target, loop)
        object.__setattr__(self, "_sync", sync)

    @property
    def redis(self) -> Any:
        return object.__getattribute__(self, "_sync").redis

    def queue(self, name: str, partitions: int | None = None) -> Any:
        target, loop = object.__getattribute__(self, "_target"), object.__getattribute__(self, "_loop")
        return wrap(loop.run(target.open_queue(name, partitions)), loop)

    def close(self) -> None:
        target, loop = object.__getattribute__(self, "_target"), object.__getattribute__(self, "_loop")
        loop.run(target.close())
        object.__getattribute__(self, "_sync").close()
        loop.close()


def connect(url: str, **options: Any) -> BridgedClient:
    """rqueue.aio.connect(url, **options), called as rqueue.connect."""
    loop = Loop()
    target = loop.run(rqueue.aio.connect(url, **options))
    loop.sync = rqueue.connect(url, prefix=options.get("prefix", "rq"))
    return BridgedClient(target, loop, loop.sync)


API = ["sync", "async"]


def connect_as(api: str, url: str, **options: Any) -> Any:
    """rqueue.connect, or the asyncio client behind the same API."""
    return rqueue.connect(url, **options) if api == "sync" else connect(url, **options)


def parametrize_api(metafunc: Any) -> None:
    """For a test module's pytest_generate_tests: every test that takes
    ``api`` (the ``client`` fixture does) runs against both clients, but for
    those marked ``@pytest.mark.sync_only(reason)`` (a thing the asyncio
    client does not have: the threaded Worker, the CLI, the sync client's
    internals)."""
    if "api" in metafunc.fixturenames:
        only_sync = metafunc.definition.get_closest_marker("sync_only") is not None
        metafunc.parametrize("api", ["sync"] if only_sync else API)


def redundant(item: Any) -> bool:
    """Whether a collected test runs the asyncio client on Valkey: its code
    path in rqueue.aio is Redis's (a single server), so conftest leaves it
    out to keep the suite short."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return bool(params.get("api") == "async" and params.get("backend") == "valkey")
