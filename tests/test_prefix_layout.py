"""The layout marker of a prefix (rqueue.engine.keys.prefix_layout,
docs/layout-d-plan.md step 8): every client of a prefix uses the layout its
marker names, whatever its own default; a prefix whose queues were listed
before markers existed is of the hash layout; a new prefix takes the
default of the client that lists its first queue. Sync and asyncio
clients, every backend."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.aio_bridge import connect_as

from rqueue.engine.keys import LAYOUT_ENV, LogLayout, layout_key, registry_key
from rqueue.engine.prefix_layout import AsyncPrefixLayout, PrefixLayout
from rqueue.errors import CorruptRecord, LayoutMismatch


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def client_of(api: str, backend: str, prefix: str, default: str) -> Any:
    """A client of ``api`` whose default layout (for a new prefix) is ``default``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LAYOUT_ENV, default)
        return connect_as(api, backend, prefix=prefix, settings_ttl=0)


@pytest.mark.parametrize("first, later", [("stream", "hash"), ("hash", "stream")])
def test_a_client_of_another_default_follows_the_prefixs_marker(api, backend, prefix, first, later):
    # given a new prefix whose first queue a client of one default made
    maker = client_of(api, backend, prefix, first)
    maker.queue("orders").publish_many([b"a", b"b"])
    # when a client whose default is the other layout connects
    other = client_of(api, backend, prefix, later)
    try:
        # then the marker names the first client's layout, and the other client uses it:
        # it publishes, consumes and reads the queue as the first client made it
        assert maker.redis.get(layout_key(prefix)) == first.encode()
        assert other.log_layout is LogLayout(first)
        q = other.queue("orders")
        q.publish(b"c")
        c = q.consumer("g")
        got = c.fetch(10)
        assert [d.data for d in got] == [b"a", b"b", b"c"]
        c.ack(got)
        assert q.stats().depth == 0
        assert maker.redis.hget(q.keys.meta, "layout") == (b"stream" if first == "stream" else None)
    finally:
        other.close()
        maker.close()


@pytest.mark.parametrize("written, other", [("hash", "stream"), ("stream", "hash")])
def test_a_prefix_without_a_marker_takes_the_layout_its_queues_say(api, backend, prefix, written, other):
    # given a prefix with a listed queue holding a message and no marker: written before markers
    # existed (the hash layout), or its marker deleted by hand
    maker = client_of("sync", backend, prefix, written)
    maker.queue("orders").publish(b"a")
    maker.redis.delete(layout_key(prefix))
    assert maker.redis.exists(registry_key(prefix)) == 1
    # when a client whose default is the other layout connects and uses the queue
    reader = client_of(api, backend, prefix, other)
    try:
        q = reader.queue("orders")
        c = q.consumer("g")
        (d,) = c.fetch(1)
        # then it took the layout from the queue's meta: it reads the message, its first
        # listing writes the marker as it found it, and it publishes to the queue
        assert reader.log_layout is LogLayout(written)
        assert d.data == b"a"
        assert maker.redis.get(layout_key(prefix)) == written.encode()
        q.publish(b"b")
        assert [m.data for m in q.peek()] == [b"a", b"b"]
    finally:
        reader.close()
        maker.close()


def test_a_new_prefix_is_marked_when_its_first_queue_is_listed_not_at_connect(api, backend, prefix):
    # given a client of a new prefix
    client = client_of(api, backend, prefix, "stream")
    try:
        # when it only connects and makes a handle, then nothing is written
        client.queue("orders")
        assert client.log_layout is LogLayout.STREAM
        assert client.redis.exists(layout_key(prefix), registry_key(prefix)) == 0
        # when it publishes, then the marker is written with the queue's listing
        client.queue("orders").publish(b"a")
        assert client.redis.get(layout_key(prefix)) == b"stream"
        assert client.redis.smembers(registry_key(prefix)) == {b"orders"}
    finally:
        client.close()


def test_a_marker_that_names_no_layout_is_refused_when_the_prefix_is_read(api, backend, prefix):
    # given a prefix whose marker holds something that is not a layout
    setup = client_of("sync", backend, prefix, "hash")
    setup.redis.set(layout_key(prefix), "btree")
    # when a client reads it (the asyncio client at connect, the sync one at its first handle)
    # then it is refused, naming the key and the value, and nothing changes
    client = None
    with pytest.raises(CorruptRecord, match=rf"{prefix}:layout.*'btree'.*not a layout"):
        client = client_of(api, backend, prefix, "hash")
        client.queue("orders")
    if client is not None:
        client.close()
    assert setup.redis.get(layout_key(prefix)) == b"btree"
    assert setup.redis.exists(registry_key(prefix)) == 0
    setup.close()


def test_a_client_that_loses_the_race_to_mark_a_new_prefix_says_so(backend, prefix, caplog):
    # given two clients of other defaults, both of which read a new prefix before either listed a queue
    hashed = client_of("sync", backend, prefix, "hash")
    streamed = client_of("sync", backend, prefix, "stream")
    try:
        a, b = hashed.queue("a"), streamed.queue("b")  # each reads the prefix: no marker, no queue
        # when the hash client lists its queue first, and the stream client then makes one
        a.publish(b"x")
        with caplog.at_level(logging.ERROR, logger="rqueue"):
            b.publish(b"y")
        # then the marker keeps the first client's layout, and the second one's error names
        # the prefix, both layouts and its queue; each queue is whole in its own layout
        assert hashed.redis.get(layout_key(prefix)) == b"hash"
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("another client marked its queues as of the hash layout" in m and "'b'" in m for m in said)
        assert [m.data for m in streamed.queue("b").peek()] == [b"y"]
        assert [m.data for m in hashed.queue("a").peek()] == [b"x"]
        with pytest.raises(LayoutMismatch):
            hashed.queue("b").peek()
    finally:
        streamed.close()
        hashed.close()


def test_a_marker_found_damaged_after_a_publish_is_said_and_the_publish_stands(api, backend, prefix, caplog):
    # given a client that read a new prefix (no marker), and a marker written
    # with garbage by something else before its first publish lists its queue
    client = client_of(api, backend, prefix, "hash")
    try:
        q = client.queue("orders")
        client.redis.set(layout_key(prefix), "btree")
        # when it publishes
        with caplog.at_level(logging.ERROR, logger="rqueue"):
            q.publish(b"a")
        # then the publish stands (it was applied: no error after it), the
        # damage is said naming the key and the value, and the marker is left
        assert [m.data for m in q.peek()] == [b"a"]
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(f"{prefix}:layout" in m and "'btree'" in m and "'orders'" in m for m in said)
        assert client.redis.get(layout_key(prefix)) == b"btree"
    finally:
        client.close()


def test_a_new_prefix_takes_the_stream_layout_unless_the_environment_names_another(monkeypatch):
    # given no layout in the environment, then a new prefix's default is the stream layout
    from rqueue.engine.keys import OLD_LAYOUT_ENV, default_layout

    monkeypatch.delenv(LAYOUT_ENV, raising=False)
    monkeypatch.delenv(OLD_LAYOUT_ENV, raising=False)
    assert default_layout() is LogLayout.STREAM
    # when the variable, or its earlier name, names the hash layout, then it is the default
    monkeypatch.setenv(OLD_LAYOUT_ENV, "hash")
    assert default_layout() is LogLayout.HASH
    monkeypatch.setenv(LAYOUT_ENV, "stream")
    assert default_layout() is LogLayout.STREAM  # the current name wins
    # and a value that names no layout is refused, naming the variable
    monkeypatch.setenv(LAYOUT_ENV, "tree")
    with pytest.raises(ValueError, match="RQUEUE_LAYOUT is 'tree'; it must be one of hash, stream"):
        default_layout()


class _MarkerReadEarly:
    """A client whose first read of the marker comes before another client's
    write of it (the value is taken as missing), and whose later reads see
    the server as it is."""

    def __init__(self, r: Any, key: str) -> None:
        self._r, self._key, self._first = r, key, True

    def get(self, key: str) -> Any:
        if key == self._key and self._first:
            self._first = False
            return None
        return self._r.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._r, name)


class _AsyncMarkerReadEarly(_MarkerReadEarly):
    async def get(self, key: str) -> Any:  # type: ignore[override]
        if key == self._key and self._first:
            self._first = False
            return None
        return await self._r.get(key)


def test_a_client_that_read_no_marker_just_before_another_listed_a_partitioned_queue_takes_the_marker(
    api, backend, prefix
):
    # given a prefix whose first queue, partitioned (its plain meta names no layout), a
    # stream-default client made and listed after writing the marker
    maker = client_of("sync", backend, prefix, "stream")
    try:
        pq = maker.queue("orders", partitions=2)
        pq.publish(b"a", key="k")
        assert maker.redis.get(layout_key(prefix)) == b"stream"
        # when a hash-default client read the marker as missing just before that write, and the
        # listing just after it
        if api == "sync":
            view = PrefixLayout(_MarkerReadEarly(maker.redis, layout_key(prefix)), prefix, LogLayout.HASH)
            found = view.layout
        else:
            import asyncio

            import rqueue.aio

            async def read() -> LogLayout:
                c = await rqueue.aio.connect(backend, prefix=prefix)
                try:
                    view = AsyncPrefixLayout(_AsyncMarkerReadEarly(c.redis, layout_key(prefix)), prefix, LogLayout.HASH)
                    await view.read()
                    return view.layout
                finally:
                    await c.close()

            found = asyncio.run(read())
        # then it reads the marker again rather than take the plain queue's meta for the layout
        assert found is LogLayout.STREAM
    finally:
        maker.close()
