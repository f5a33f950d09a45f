"""A queue's log read and written under the scripts, in either layout
(rqueue/engine/keys.py, LogLayout): the hash ``msgs`` (seq -> record), or
the stream ``log`` (entry ``<seq>-0``, one field ``r``) with the records
replayed below its newest id in the pinned hash as field ``r<seq>``
(rqueue/engine/lua/includes/log.lua). For tests that look at, plant or
remove records directly; the package's own access is rqueue/engine/log.py."""

from __future__ import annotations

from typing import Any

import redis

from rqueue.engine.keys import LogLayout, QueueKeys
from rqueue.engine.record import compact_record


def _stream(keys: QueueKeys) -> bool:
    return keys.layout is LogLayout.STREAM


def _entry(entry_id: bytes, fields: dict[bytes, bytes]) -> tuple[int, bytes]:
    """(seq, record) of a stream entry, which must be ``<seq>-0`` {r: record}
    or, for a compact record, ``<seq>-<published ms>`` {p: payload}."""
    seq, _, part = entry_id.partition(b"-")
    if list(fields) == [b"p"]:
        return int(seq), compact_record(int(part), fields[b"p"])
    assert part == b"0" and list(fields) == [b"r"], (entry_id, fields)
    return int(seq), fields[b"r"]


def _side(r: Any, keys: QueueKeys) -> dict[int, bytes]:
    """The replayed records kept in the pinned hash (stream layout)."""
    return {int(f[1:]): v for f, v in r.hgetall(keys.pinned).items() if f.startswith(b"r")}


def records(r: Any, keys: QueueKeys) -> dict[int, bytes]:
    """Every stored record by seq (in a stream, those in side too)."""
    if not _stream(keys):
        return {int(f): v for f, v in r.hgetall(keys.msgs).items()}
    found = dict(_entry(i, f) for i, f in r.xrange(keys.msgs))
    side = _side(r, keys)
    # A reopened seq's record is kept in side whether or not the trim took its entry yet.
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
    return _entry(*entries[0])[1] if entries else r.hget(keys.pinned, f"r{seq}")


def count(r: Any, keys: QueueKeys) -> int:
    """How many records are stored (in a stream, those in side too)."""
    if not _stream(keys):
        return int(r.hlen(keys.msgs))
    return len(records(r, keys))


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


def delete(r: Any, keys: QueueKeys, seq: int) -> int:
    """Deletes ``seq``'s record; how many there were (0 or 1)."""
    if not _stream(keys):
        return int(r.hdel(keys.msgs, seq))
    return min(1, int(r.xdel(keys.msgs, f"{seq}-0")) + int(r.hdel(keys.pinned, f"r{seq}")))


def exists(r: Any, keys: QueueKeys) -> bool:
    """Whether the log's key exists (a stream stays, empty, when its last
    entry goes) or, in a stream, side holds a record."""
    return bool(r.exists(keys.msgs)) or (_stream(keys) and bool(_side(r, keys)))
