"""The log seen from the client: the commands that read, count and delete
a queue's message records outside the scripts (lua/includes/log.lua is
the scripts' side, and describes the two layouts, keys.LogLayout): the hash
``msgs`` (seq -> record), or the stream ``log`` (entry ``<seq>-<ms>`` with
field ``p``, a compact record's payload, or ``<seq>-0`` with field ``r``,
any other record, or with field ``s``, a stub, for a message published with
a priority or an ordering key, whose record is in the side hash ``side``,
seq -> record). The decoding functions give records, a compact one made
again from its entry, and None for a stub: ``stubs`` names the seqs of a
reply's stubs, and ``read_flow`` reads their records from the side hash.

Each command function queues one command on ``r``, a client or a pipeline,
sync or asyncio, and returns what that call returns (a reply, the pipeline,
or an awaitable), so callers keep their round trips and their error
handling; the reply goes through the matching decoding function
(``read`` -> ``record_of``, ``read_many`` -> ``records``, ``has`` ->
``present``, ``scan`` -> ``scan_page``).

In the stream layout the record of a seq reopened by replay is also kept
beside the queue's pins (field ``r<seq>`` of the pinned hash), where the
trim cannot take it: ``read_side`` reads it there, for a seq whose entry is
gone.
"""

from __future__ import annotations

from typing import Any

from ..errors import LayoutMismatch
from .keys import LogLayout, QueueKeys
from .record import compact_record


def stream(keys: QueueKeys) -> bool:
    """Whether the queue's log is a stream (read_side then applies)."""
    return keys.layout is LogLayout.STREAM


# Meta field "layout" while lua/migrate.lua moves a level's log from the hash
# to the stream: both layouts' calls are refused.
MIGRATING = "migrating"


def check_layout(keys: QueueKeys, layout: Any, seq: Any) -> None:
    """Raises LayoutMismatch when the queue's meta fields ``layout`` and
    ``seq`` (as read: None when missing) say its log has the other layout
    than ``keys``: a client's reads of the other layout's key would find no
    record and say the queue is empty. As lua/includes/layout.lua's
    layoutProblem, for the reads made outside the scripts."""
    is_stream = stream(keys)
    if (layout in (b"stream", "stream") and is_stream) or (layout is None and (not is_stream or seq is None)):
        return
    said = "hash" if layout is None else _as_bytes(layout).decode(errors="replace")
    if said == MIGRATING:
        raise LayoutMismatch(
            keys.base,
            f"{keys.meta} says the log is being migrated to the stream layout (`rqueue migrate`): every call is "
            "refused until it is done",
        )
    raise LayoutMismatch(
        keys.base, f"{keys.meta} says the log has the {said} layout, and this client reads the key {keys.msgs}"
    )


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _entry_seq(entry_id: Any) -> int:
    return int(_as_bytes(entry_id).partition(b"-")[0])


def _entry_record(entry_id: Any, fields: Any) -> bytes | None:
    """The record of a stream entry: field ``r`` as it is, field ``p`` a
    compact record's payload, its time in the id; None for a stub (field
    ``s``: the record is in the side hash)."""
    pairs = fields.items() if isinstance(fields, dict) else zip(fields[::2], fields[1::2], strict=False)
    for name, value in pairs:
        if _as_bytes(name) == b"r":
            return _as_bytes(value)
        if _as_bytes(name) == b"p":
            return compact_record(int(_as_bytes(entry_id).partition(b"-")[2]), _as_bytes(value))
    return None


def read(r: Any, keys: QueueKeys, seq: int) -> Any:
    """Queues the read of ``seq``'s record (decoded by record_of)."""
    if stream(keys):
        return r.xrange(keys.msgs, seq, seq)
    return r.hget(keys.msgs, seq)


def record_of(keys: QueueKeys, reply: Any) -> Any:
    """The record in a reply of read, or None."""
    if not stream(keys):
        return reply
    return _entry_record(*reply[0]) if reply else None


def _is_stub(fields: Any) -> bool:
    names = fields.keys() if isinstance(fields, dict) else fields[::2]
    return any(_as_bytes(name) == b"s" for name in names)


def stubs(keys: QueueKeys, reply: Any) -> list[int]:
    """The seqs whose entries are stubs in a reply of read or read_many:
    their records are read by read_flow."""
    if not stream(keys):
        return []
    return [_entry_seq(entry_id) for entry_id, fields in reply if _is_stub(fields)]


def with_flow(seqs: list[int], recs: list[Any], flow: list[int], side_recs: Any) -> list[Any]:
    """``recs`` (by ``records``, one per seq of ``seqs``) with the records of
    the stubs ``flow`` (by ``stubs``) filled in from ``side_recs``, the
    reply of ``read_flow`` for them."""
    in_side = dict(zip(flow, side_recs, strict=True))
    return [in_side.get(seq) if rec is None else rec for seq, rec in zip(seqs, recs, strict=True)]


def read_flow(r: Any, keys: QueueKeys, seqs: list[int]) -> Any:
    """Stream layout: queues the read of the records of ``seqs`` kept in
    the side hash, the messages published with a priority or an ordering
    key (one value or None per seq)."""
    return r.hmget(keys.side, seqs)


def read_side(r: Any, keys: QueueKeys, seqs: list[int]) -> Any:
    """Stream layout: queues the read of the replayed records of ``seqs``
    kept beside the pins (one value or None per seq)."""
    return r.hmget(keys.pinned, [f"r{seq}" for seq in seqs])


def read_many(r: Any, keys: QueueKeys, seqs: list[int]) -> Any:
    """Queues the read of the records of ``seqs`` (decoded by records); in
    the stream layout one range from the lowest to the highest."""
    if stream(keys):
        return r.xrange(keys.msgs, min(seqs), max(seqs))
    return r.hmget(keys.msgs, seqs)


def records(keys: QueueKeys, seqs: list[int], reply: Any) -> list[Any]:
    """One record (or None) per seq, in the order of ``seqs``, from a reply
    of read_many."""
    if not stream(keys):
        return list(reply)
    found = {_entry_seq(entry_id): _entry_record(entry_id, fields) for entry_id, fields in reply}
    return [found.get(seq) for seq in seqs]


def has(pipe: Any, keys: QueueKeys, seq: int) -> int:
    """Queues on ``pipe`` the question whether ``seq`` has a record; returns
    how many replies it takes, which present reads. A stub counts only with
    its side record; a side record counts without its stub (a stub deleted:
    the scripts read the record there, lua/includes/log_one.lua)."""
    if stream(keys):
        pipe.xrange(keys.msgs, seq, seq)
        pipe.hexists(keys.side, seq)
        return 2
    pipe.hexists(keys.msgs, seq)
    return 1


def present(keys: QueueKeys, replies: list[Any]) -> bool:
    """Whether the seq has a record, from the replies of has's reads."""
    if not stream(keys):
        return bool(replies[0])
    entries, in_side = replies
    return bool(in_side) or bool(entries) and not _is_stub(entries[0][1])


def stub_missing(keys: QueueKeys, replies: list[Any]) -> bool:
    """Whether the seq has a side record and no entry, from the replies of
    has's reads: its stub was deleted (damage), and the scripts read its
    record from the side hash."""
    if not stream(keys):
        return False
    entries, in_side = replies
    return bool(in_side) and not entries


def flow(keys: QueueKeys, replies: list[Any]) -> bool:
    """Whether the seq is a message published with a priority or an
    ordering key, by its own entry (a stub) or its record in the side hash,
    from the replies of has's reads; never so in a hash log, which does not
    tell."""
    if not stream(keys):
        return False
    entries, in_side = replies
    return bool(in_side) or bool(entries) and _is_stub(entries[0][1])


def length(pipe: Any, keys: QueueKeys) -> int:
    """Queues on ``pipe`` (a pipeline, sync or asyncio) the reads that count
    the stored records; returns how many replies they take, which
    length_of reads. In a stream: the entries, less those at or below the
    trim point that a lagging deletion has not reached (meta field
    "swept", lua/includes/settle_shared.lua; a stream's entries have every
    seq), and the replayed records beside the pins whose entries the trim
    took (at or below the trim point)."""
    if stream(keys):
        pipe.xlen(keys.msgs)
        pipe.hkeys(keys.pinned)
        pipe.hmget(keys.meta, "trimmed", "swept")
        return 3
    pipe.hlen(keys.msgs)
    return 1


def length_of(keys: QueueKeys, replies: list[Any]) -> int:
    """How many records are stored, from the replies of length's reads."""
    if not stream(keys):
        return int(replies[0])
    entries, pins, (trimmed, swept) = replies
    low = int(trimmed or 0)
    lagging = low - int(swept) if swept is not None and swept.isdigit() and int(swept) < low else 0
    side = [f for f in (p.decode() if isinstance(p, bytes) else str(p) for p in pins) if f.startswith("r")]
    return max(0, int(entries) - lagging) + sum(1 for f in side if f[1:].isdigit() and int(f[1:]) <= low)


def delete(r: Any, keys: QueueKeys, seqs: list[int]) -> Any:
    """Deletes the records of ``seqs`` (dead letters, in a stream: entries
    ``<seq>-0``, as every dead letter is, and meta field "gaps" set with no
    "gaps_to"); replies
    (first, on a pipeline) how many there were."""
    if stream(keys):
        deleted = r.xdel(keys.msgs, *(f"{seq}-0" for seq in seqs))
        # entries deleted one by one, at any seq: a group made later passes over them
        # (lua/includes/missing_record.lua), "gaps" with no bound
        r.hset(keys.meta, "gaps", "1")
        r.hdel(keys.meta, "gaps_to")
        return deleted
    return r.hdel(keys.msgs, *seqs)


def delete_range(pipe: Any, keys: QueueKeys, seqs: range) -> None:
    """Queues on ``pipe`` the deletion of the records of ``seqs``, a range
    that starts above every other stored record (a purge in steps); the
    first reply is how many there were (in a stream: entries, stubs
    included; their side records go with them)."""
    if stream(keys):
        pipe.xtrim(keys.msgs, minid=f"{seqs[-1] + 1}-0", approximate=False)
        pipe.hdel(keys.side, *seqs)
        return
    pipe.hdel(keys.msgs, *seqs)


def newest(r: Any, keys: QueueKeys) -> Any:
    """Stream layout: queues the read of the stream's facts (XINFO STREAM,
    decoded by newest_of); the stream must exist."""
    return r.xinfo_stream(keys.msgs)


def newest_of(reply: Any) -> int:
    """The highest seq a stream log ever held, from newest's reply: a stream
    keeps its newest id when the trim takes its entries."""
    last = reply.get("last-generated-id", reply.get(b"last-generated-id", b"0-0"))
    return _entry_seq(last)


def key(keys: QueueKeys) -> str:
    """The log's key, for EXISTS and DEL beside other keys, and for messages."""
    return keys.msgs


def scan(r: Any, keys: QueueKeys, cursor: Any, count: int) -> Any:
    """Queues one step of a walk over every record from ``cursor`` (0 at
    first; decoded by scan_page)."""
    if stream(keys):
        return r.xrange(keys.msgs, f"{int(cursor)}-0" if int(cursor) else "-", "+", count=count)
    return r.hscan(keys.msgs, cursor, count=count)


def scan_page(keys: QueueKeys, reply: Any, count: int) -> tuple[Any, dict[Any, Any]]:
    """(next cursor, 0 at the end; {seq: record}) from a reply of scan (a
    hash's walk may repeat a record; a stub's record, in the side hash, is
    b"" here)."""
    if not stream(keys):
        cursor, page = reply
        return cursor, page
    page = {str(_entry_seq(entry_id)): _entry_record(entry_id, fields) or b"" for entry_id, fields in reply}
    if len(reply) < count:
        return 0, page
    return _entry_seq(reply[-1][0]) + 1, page
