"""A queue's log read and written under the scripts, in either layout
(rqueue/engine/keys.py, LogLayout): the hash ``msgs`` (seq -> record), or
the stream ``log`` (entry ``<seq>-0``, one field ``r``; for a message with a
priority or an ordering key the stub ``<seq>-0`` field ``s``, its record in
the side hash) with the records replayed below its newest id in the pinned
hash as field ``r<seq>``
(rqueue/engine/lua/includes/log.lua). For tests that look at, plant or
remove records directly, damage them (delete, replace) or roll the log back
as a lagging replica holds it, so that they check the same behaviour in
both layouts; the package's own access is rqueue/engine/log.py."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import rqueue
from rqueue.engine.keys import LAYOUT_ENV, LogLayout, QueueKeys
from rqueue.engine.record import compact_record
from support.aio_bridge import connect_as


def _stream(keys: QueueKeys) -> bool:
    return keys.layout is LogLayout.STREAM


def _entry(entry_id: bytes, fields: dict[bytes, bytes], flow: dict[bytes, bytes]) -> tuple[int, bytes | None]:
    """(seq, record) of a stream entry, which must be ``<seq>-0`` {r: record}
    or, for a compact record, ``<seq>-<published ms>`` {p: payload}, or a
    stub ``<seq>-0`` {s: ""} whose record is in ``flow`` (the side hash, by
    seq as bytes; None when it has none)."""
    seq, _, part = entry_id.partition(b"-")
    if list(fields) == [b"p"]:
        return int(seq), compact_record(int(part), fields[b"p"])
    assert part == b"0" and list(fields) in ([b"r"], [b"s"]), (entry_id, fields)
    if list(fields) == [b"s"]:
        return int(seq), flow.get(seq)
    return int(seq), fields[b"r"]


def _side(r: Any, keys: QueueKeys) -> dict[int, bytes]:
    """The replayed records kept in the pinned hash (stream layout)."""
    return {int(f[1:]): v for f, v in r.hgetall(keys.pinned).items() if f.startswith(b"r")}


def records(r: Any, keys: QueueKeys) -> dict[int, bytes]:
    """Every stored record by seq (in a stream, those in side too)."""
    if not _stream(keys):
        return {int(f): v for f, v in r.hgetall(keys.msgs).items()}
    flow = r.hgetall(keys.side)
    found = {seq: rec for seq, rec in (_entry(i, f, flow) for i, f in r.xrange(keys.msgs)) if rec is not None}
    side = _side(r, keys)
    # A reopened seq's record is kept in side whether or not the trim took its entry yet: a copy
    # of the entry's while there is one (includes/log_one.lua, logWriteNew).
    both = {seq for seq in found.keys() & side.keys() if found[seq] != side[seq]}
    assert not both, f"seqs whose record in side differs from their entry: {both}"
    return side | found


def seqs(r: Any, keys: QueueKeys) -> list[int]:
    """The seqs that have a record, ascending."""
    return sorted(records(r, keys))


def record(r: Any, keys: QueueKeys, seq: int) -> bytes | None:
    """The record of ``seq``, or None."""
    if not _stream(keys):
        rec: bytes | None = r.hget(keys.msgs, seq)
        return rec
    entries = r.xrange(keys.msgs, seq, seq)
    rec: bytes | None = _entry(*entries[0], r.hgetall(keys.side))[1] if entries else None
    return rec if rec is not None else r.hget(keys.pinned, f"r{seq}")


def count(r: Any, keys: QueueKeys) -> int:
    """How many records are stored (in a stream, those in side too)."""
    if not _stream(keys):
        return int(r.hlen(keys.msgs))
    return len(records(r, keys))


def length(r: Any, keys: QueueKeys) -> int:
    """How many records the log's key holds, in one cheap call (HLEN, or
    XLEN: a stream's replayed records in side are not counted); for a
    watcher that polls a log no group has replayed into."""
    return int(r.xlen(keys.msgs) if _stream(keys) else r.hlen(keys.msgs))


def put(r: Any, keys: QueueKeys, seq: int, rec: bytes) -> None:
    """Stores ``rec`` as ``seq``'s record, as the scripts would: in a stream
    an entry when ``seq`` is above the newest id, else in side."""
    if not _stream(keys):
        r.hset(keys.msgs, seq, rec)
        return
    try:
        r.xadd(keys.msgs, {"r": rec}, id=f"{seq}-0")
    except redis.ResponseError as e:
        if "equal or smaller" not in str(e):
            raise
        r.hset(keys.pinned, f"r{seq}", rec)


def is_stream(keys: QueueKeys) -> bool:
    """Whether the queue of ``keys`` keeps its log in a stream; for tests whose
    assertions follow a documented difference of that layout
    (docs/layout-d-plan.md, "Step 3, first part (built)")."""
    return _stream(keys)


def _ids(r: Any, keys: QueueKeys, seqs: list[int]) -> list[bytes]:
    """The stream entry ids of those of ``seqs`` that have an entry (a compact
    record's id holds its time, so it is read, not made), one XRANGE per run
    of consecutive seqs."""
    wanted = sorted(set(seqs))
    ids: list[bytes] = []
    i = 0
    while i < len(wanted):
        j = i
        while j + 1 < len(wanted) and wanted[j + 1] == wanted[j] + 1:
            j += 1
        ids += [entry_id for entry_id, _ in r.xrange(keys.msgs, wanted[i], wanted[j])]
        i = j + 1
    return ids


def delete(r: Any, keys: QueueKeys, *seqs: int) -> int:
    """Deletes the records of ``seqs``, as damage would (an entry by its own
    id, a stub with its side record, and a replayed record in side); how
    many seqs had one."""
    if not seqs:
        return 0
    if not _stream(keys):
        return int(r.hdel(keys.msgs, *seqs))
    ids = _ids(r, keys, list(seqs))
    gone = {int(i.partition(b"-")[0]) for i in ids}
    if ids:
        r.xdel(keys.msgs, *ids)
        r.hdel(keys.side, *gone)
    side = {seq for seq, there in zip(seqs, r.hmget(keys.pinned, [f"r{seq}" for seq in seqs])) if there is not None}
    if side:
        r.hdel(keys.pinned, *(f"r{seq}" for seq in side))
    return len(gone | side)


def _last_id(r: Any, keys: QueueKeys) -> bytes:
    """The stream's newest id ever (XINFO STREAM's last-generated-id): kept
    when the trim or XDEL takes entries, and read by the doctor."""
    info = r.xinfo_stream(keys.msgs)
    return bytes(info.get("last-generated-id", info.get(b"last-generated-id", b"0-0")))


def _id_key(entry_id: bytes) -> tuple[int, int]:
    ms, _, part = entry_id.partition(b"-")
    return int(ms), int(part or 0)


def _rebuild(r: Any, keys: QueueKeys, entries: list[tuple[bytes, dict[bytes, bytes]]], last_id: bytes) -> None:
    """Writes the stream log again as ``entries`` (ids rising) with newest id
    ``last_id``: a stream takes no id at or below its newest, so a record is
    changed, or a newest id moved back, only by making the key again. The
    newest id is set by adding an entry at it and deleting that entry."""
    r.delete(keys.msgs)
    for entry_id, fields in entries:
        r.xadd(keys.msgs, fields, id=entry_id)
    top = entries[-1][0] if entries else b"0-0"
    if _id_key(last_id) > _id_key(top):
        r.xadd(keys.msgs, {"r": b""}, id=last_id)
        r.xdel(keys.msgs, last_id)


def replace(r: Any, keys: QueueKeys, seq: int, rec: bytes) -> None:
    """Overwrites the stored record of ``seq`` with ``rec`` where it is kept,
    as damage (or an older writer) would: in a stream the entry (made again
    as an ``r`` entry ``<seq>-0``, the stream rebuilt with its newest id
    kept), or the replayed record in side when the seq has no entry."""
    if not _stream(keys):
        r.hset(keys.msgs, seq, rec)
        return
    entries = r.xrange(keys.msgs)
    if not any(int(i.partition(b"-")[0]) == seq for i, _ in entries):
        assert r.hexists(keys.pinned, f"r{seq}"), f"seq {seq} has no record to replace"
        r.hset(keys.pinned, f"r{seq}", rec)
        return
    last_id = _last_id(r, keys)
    changed = [
        (f"{seq}-0".encode(), {b"r": rec}) if int(i.partition(b"-")[0]) == seq else (i, fields) for i, fields in entries
    ]
    _rebuild(r, keys, changed, last_id)


def roll_back(r: Any, keys: QueueKeys, to: int) -> None:
    """The log as a replica that missed every write after the publish of seq
    ``to`` holds it: the records above ``to`` gone, and in a stream its newest
    id back to ``to``'s (so the next publish's XADD of ``to + 1`` is taken).
    The meta hash and the groups are the caller's."""
    if not _stream(keys):
        above = [seq for seq in seqs(r, keys) if seq > to]
        if above:
            r.hdel(keys.msgs, *above)
        return
    entries = r.xrange(keys.msgs)
    kept = [(i, f) for i, f in entries if int(i.partition(b"-")[0]) <= to]
    mine = [i for i, _ in kept if int(i.partition(b"-")[0]) == to]
    # The id of seq to's entry; trimmed, any id of seq to is as good (ids of later seqs are above it).
    _rebuild(r, keys, kept, mine[0] if mine else f"{to}-0".encode())
    side = [f for f in r.hkeys(keys.pinned) if f.startswith(b"r") and int(f[1:]) > to]
    if side:
        r.hdel(keys.pinned, *side)
    flow = [f for f in r.hkeys(keys.side) if int(f) > to]
    if flow:
        r.hdel(keys.side, *flow)


def exists(r: Any, keys: QueueKeys) -> bool:
    """Whether the log's key exists (a stream stays, empty, when its last
    entry goes) or, in a stream, side holds a record."""
    return bool(r.exists(keys.msgs)) or (_stream(keys) and bool(_side(r, keys)))


def connect(backend: str, prefix: str, clock: rqueue.ManualClock, layout: str) -> Any:
    """A sync client whose queues' logs are of ``layout`` ("hash" or "stream"),
    on the test clock, with seeded randomness: ``layout`` is this client's
    even where the prefix's marker names the other (as for a client of a
    version before the marker, or one that lost the race to write it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LAYOUT_ENV, layout)
        seed = rqueue.Randomness(seed=7)
        client = connect_as("sync", backend, prefix=prefix, clock=clock, randomness=seed, settings_ttl=0)
    client.log_layout = LogLayout(layout)
    return client
