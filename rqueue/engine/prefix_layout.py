"""The layout marker of a prefix: which LogLayout every queue of the
prefix has, so that every client of it uses one, whatever its default.

The marker (keys.layout_key) is written by the first client that lists a
queue of the prefix, before it lists it. A prefix with listed queues and no
marker was written before markers existed, or lost its marker (deleted by
hand): it has the layout its queues' meta hashes say (field ``layout``,
read from up to SAMPLE of them; none says one for the hash layout). A
prefix with neither is new and takes the default of the client that lists
its first queue. A client that lost the race to another of another default
says so (layout_race): each queue's scripts still refuse the other
layout's calls before any write (lua/includes/layout.lua).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from ..connection.cluster import Retrier, no_retry
from ..errors import CorruptRecord
from .async_commands import guarded as aguarded
from .commands import guarded
from .keys import LogLayout, QueueKeys, layout_key, queue_base, registry_key

log = logging.getLogger("rqueue")

# Listed queues whose meta is read when the marker is missing.
SAMPLE = 16


def prefix_layout(
    marker: bytes | str | None, listed: Sequence[bytes | str | None], default: LogLayout
) -> tuple[LogLayout, bool]:
    """The layout of a prefix's queues, from its marker as read and, when
    it is missing, the meta field ``layout`` of the sampled listed queues
    (none listed: a new prefix), and whether the marker is still to be
    written. Raises ValueError naming the value for a marker that names no
    layout."""
    if marker is not None:
        value = marker.decode("utf-8", "replace") if isinstance(marker, bytes) else marker
        try:
            return LogLayout(value), False
        except ValueError:
            names = ", ".join(layout.value for layout in LogLayout)
            raise ValueError(f"holds {value[:100]!r}, which is not a layout ({names})") from None
    if not listed:
        return default, True
    # A queue cut off mid-migration ("migrating") is bound for the stream.
    stream = any(field in (b"stream", "stream", b"migrating", "migrating") for field in listed)
    return (LogLayout.STREAM if stream else LogLayout.HASH), True


def _metas(prefix: str, names: Iterable[bytes | str]) -> list[str]:
    """The meta keys of SAMPLE of the listed queues ``names`` (SMEMBERS's:
    SRANDMEMBER is not in the ACL rule of docs/ACL.md)."""
    taken = sorted(n.decode() if isinstance(n, bytes) else n for n in names)[:SAMPLE]
    return [QueueKeys(queue_base(prefix, name, 0)).meta for name in taken]


def layout_race(prefix: str, marked: LogLayout, name: str, used: LogLayout) -> str:
    """What a client logs when another wrote the prefix's marker first,
    naming another layout than the one it made queue ``name`` with."""
    return (
        f"prefix {prefix!r}: another client marked its queues as of the {marked.value} layout just before this "
        f"one made queue {name!r} with the {used.value} layout; the scripts of each refuse the other's calls "
        f"(LayoutMismatch); this client keeps the {used.value} layout until it connects again"
    )


def _parsed(
    prefix: str, marker: bytes | str | None, listed: Sequence[bytes | str | None], default: LogLayout
) -> tuple[LogLayout, bool]:
    try:
        return prefix_layout(marker, listed, default)
    except ValueError as exc:
        raise CorruptRecord(layout_key(prefix), str(exc)) from None


def _after_claim(prefix: str, name: str, used: LogLayout, marker: bytes | str | None) -> None:
    """Says what a client that lost the race to write the marker (it reads
    ``marker``) made queue ``name`` with: called after a publish or join was
    applied, so it logs, never raises (the call's result stands)."""
    try:
        marked = _parsed(prefix, marker, [], used)[0]
    except CorruptRecord as exc:
        log.error("queue %r was made with the %s layout, and %s", name, used.value, exc)
        return
    if marked is not used:
        log.error(layout_race(prefix, marked, name, used))


class PrefixLayout:
    """A sync client's view of its prefix's marker: read at the first use
    of :attr:`layout` (a user refused the prefix's keys, the one that loads
    the scripts, reads nothing), written by :meth:`mark`."""

    def __init__(self, r: Any, prefix: str, default: LogLayout, retry: Retrier[Any] = no_retry) -> None:
        self._redis = r
        self._prefix = prefix
        self._default = default
        self._retry = retry
        self._layout: LogLayout | None = None
        self._unmarked = False

    @property
    def layout(self) -> LogLayout:
        """The layout of the prefix's queues. Raises CorruptRecord for a
        marker that names none."""
        if self._layout is None:
            r, key, retry, where = self._redis, layout_key(self._prefix), self._retry, f"prefix {self._prefix!r}"
            marker = guarded(lambda: retry(lambda: r.get(key)), where=where)
            listed: list[bytes | None] = []
            if marker is None:
                names = guarded(lambda: retry(lambda: r.smembers(registry_key(self._prefix))), where=where)
                if names:
                    # A lister writes the marker before its listing: one seen
                    # here (a client that listed the first queue meanwhile) is
                    # read again, not derived.
                    marker = guarded(lambda: retry(lambda: r.get(key)), where=where)

                def field(meta: str) -> bytes | None:
                    value: bytes | None = guarded(lambda: retry(lambda: r.hget(meta, "layout")), where=where)
                    return value

                if marker is None:
                    listed = [field(meta) for meta in _metas(self._prefix, names)]
            self._layout, self._unmarked = _parsed(self._prefix, marker, listed, self._default)
        return self._layout

    def use(self, layout: LogLayout) -> None:
        """Takes ``layout`` whatever the marker says (a client of a version
        before markers, in tests)."""
        self._layout, self._unmarked = layout, False

    def mark(self, name: str) -> None:
        """Writes the marker, once, before queue ``name`` is listed (the
        prefix's first, as far as this client knows)."""
        if not self._unmarked:
            return
        r, key, retry, where = self._redis, layout_key(self._prefix), self._retry, f"prefix {self._prefix!r}"
        used = self.layout
        claimed = guarded(lambda: retry(lambda: r.set(key, used.value, nx=True)), where=where)
        self._unmarked = False
        if not claimed:
            _after_claim(self._prefix, name, used, guarded(lambda: retry(lambda: r.get(key)), where=where))


class AsyncPrefixLayout:
    """An asyncio client's view of its prefix's marker: :meth:`read` at
    connect (the asyncio client reads the prefix there), :meth:`mark` as
    PrefixLayout's."""

    def __init__(self, r: Any, prefix: str, default: LogLayout) -> None:
        self._redis = r
        self._prefix = prefix
        #: The layout of the prefix's queues: the default until :meth:`read`.
        self.layout = default
        self._unmarked = False

    async def read(self) -> None:
        """Reads the marker. Raises CorruptRecord for one that names no layout."""
        r, key, where = self._redis, layout_key(self._prefix), f"prefix {self._prefix!r}"
        marker = await aguarded(lambda: r.get(key), where=where)
        listed: list[bytes | None] = []
        if marker is None:
            names = await aguarded(lambda: r.smembers(registry_key(self._prefix)), where=where)
            if names:  # as PrefixLayout.layout: a listing seen is read with its marker
                marker = await aguarded(lambda: r.get(key), where=where)
            if marker is None:
                for meta in _metas(self._prefix, names):
                    listed.append(await aguarded(partial(r.hget, meta, "layout"), where=where))
        self.layout, self._unmarked = _parsed(self._prefix, marker, listed, self.layout)

    async def mark(self, name: str) -> None:
        """As PrefixLayout.mark, awaited."""
        if not self._unmarked:
            return
        r, key, where, used = self._redis, layout_key(self._prefix), f"prefix {self._prefix!r}", self.layout
        claimed = await aguarded(lambda: r.set(key, used.value, nx=True), where=where)
        self._unmarked = False
        if not claimed:
            _after_claim(self._prefix, name, used, await aguarded(lambda: r.get(key), where=where))
