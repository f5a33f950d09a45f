"""Handler results kept in Redis (docs/results.md): how a worker encodes a
handler's return value or its failure, and how :meth:`rqueue.Queue.result`
reads them back. Bytes stay bytes; anything else must be JSON; nothing is
ever pickled."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput, ResultLost
from .names import check_message_id, check_name
from .results import PublishResult

__all__ = [
    "Failure",
    "Result",
    "encode_value",
    "encode_failure",
    "decode",
    "asked",
    "judged",
    "result_group",
    "result_id",
    "result_seq",
    "unknown_id",
]

# The first byte of a stored result says what follows.
BYTES, JSON, FAILURE = b"b", b"j", b"e"

FIRST_POLL = 0.005  # seconds between the first two looks for a result
LAST_POLL = 0.2  # seconds between looks at most: polls back off by half each time up to it


@dataclass(frozen=True)
class Failure:
    """How a message failed for good: dead-lettered (or dropped) by the
    worker that stored it.

    Attributes:
        reason: ``rejected``, ``max-deliveries`` (its last attempt failed:
            an exception, or ``timeout: ...`` past a time limit).
        error: the last error text.
    """

    reason: str
    error: str


@dataclass(frozen=True)
class Result:
    """The outcome of one message, as its worker stored it.

    Attributes:
        seq: the message's seq.
        value: what the handler returned: bytes as they were, else the JSON
            value (None when it returned None, or when it failed).
        failure: None, or how the message failed.
        partition: the partition of a partitioned queue that kept it (its
            seq is that partition's), else None.
        group: the group whose worker kept it (None: not read from a queue).
    """

    seq: int
    value: Any = None
    failure: Failure | None = None
    partition: int | None = None
    group: str | None = None

    @property
    def ok(self) -> bool:
        """True when the handler returned (the message was acked)."""
        return self.failure is None


def encode_value(value: Any) -> bytes:
    """A handler's return value as stored: bytes as they are, anything else
    as JSON (InvalidInput when it is neither)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return BYTES + bytes(value)
    try:
        return JSON + json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"a handler's result must be bytes or a JSON value, not {type(value).__name__}: {exc}"
        ) from None


def encode_failure(reason: str, error: str) -> bytes:
    return FAILURE + json.dumps({"reason": reason, "error": error}, separators=(",", ":")).encode()


def decode(seq: int, raw: bytes, incarnation: str) -> Result | None:
    """The result stored as ``raw`` (``<incarnation>\\n<kind><body>``);
    None when it belongs to another incarnation of the queue (the queue was
    deleted or lost and made anew: its seqs name other messages now)."""
    stored_inc, sep, body = raw.partition(b"\n")
    if not sep or stored_inc.decode(errors="replace") != incarnation:
        return None
    kind, data = body[:1], body[1:]
    if kind == BYTES:
        return Result(seq, data)
    if kind == JSON:
        return Result(seq, json.loads(data))
    if kind == FAILURE:
        fields = json.loads(data)
        return Result(seq, None, Failure(str(fields.get("reason", "")), str(fields.get("error", ""))))
    return None


def asked(queue: str, seq: Any) -> tuple[int, str | None]:
    """The seq a result is asked for by (see :func:`result_seq`), and the
    incarnation that took the message when ``seq`` is a PublishResult that
    knows it (None otherwise)."""
    published = seq.incarnation if isinstance(seq, PublishResult) else None
    return result_seq(queue, seq), published


def judged(
    queue: str,
    seq: int,
    published: str | None,
    group: str | None,
    groups: list[str],
    raw: bytes | None,
    incarnation: str,
) -> Result | None:
    """What one read of ``group``'s result of ``seq`` (``raw`` and the
    queue's incarnation now, read together; no group while the queue has
    none) answers: the Result, or None to wait on. ResultLost when the
    message was published to another incarnation of the queue than the one
    Redis holds now, group or none; InvalidInput when the queue has other
    groups and not ``group``."""
    if published is not None and published != incarnation:
        raise ResultLost(queue, seq, published, incarnation)
    if group is None:
        return None
    found = None if raw is None else decode(seq, raw, incarnation)
    if found is None:
        if (wrong := no_such_group(queue, group, groups)) is not None:
            raise wrong
        return None
    return dataclasses.replace(found, group=group)


def result_seq(queue: str, seq: Any) -> int:
    """The seq ``seq`` names: a whole number, or a PublishResult of this
    queue (InvalidInput for one the alternate queue took)."""
    if isinstance(seq, PublishResult):
        if seq.alternate is not None:
            raise InvalidInput(
                f"seq {seq.seq} is a seq of the alternate queue {seq.alternate!r}, which took the message: "
                "ask that queue for its result"
            )
        seq = seq.seq
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InvalidInput(f"seq must be a whole number >= 1, a PublishResult or a message id (str), not {seq!r}")
    return seq


def result_id(msg_id: str) -> str:
    """``msg_id`` when it can name a message (InvalidInput otherwise; an
    empty one is named here, where None is no way out as it is for publish)."""
    if msg_id == "":
        raise InvalidInput("a message id must not be empty: give the id the message was published with, or its seq")
    return check_message_id(msg_id)


def unknown_id(queue: str, msg_id: str) -> InvalidInput:
    """The error for a result asked by a message id the queue does not know
    (never published with it, or its de-duplication window passed)."""
    return InvalidInput(
        f"message id {msg_id!r} is not known to queue {queue!r}: an id is known while it is inside the "
        "de-duplication window (dedup_window); ask by the seq publish returned"
    )


def result_group(queue: str, group: str | None, groups: list[str]) -> str | None:
    """The group whose result of a message to read: ``group``, or the
    queue's only group; None while the queue has no group yet (no worker
    joined: the caller waits for one). InvalidInput when the queue has
    several and none is named (each keeps its own result)."""
    if group is not None:
        return check_name("group", group)
    if len(groups) <= 1:
        return groups[0] if groups else None
    raise InvalidInput(
        f"queue {queue!r} has groups {', '.join(map(repr, groups))}, each keeps its own result: name one (group=...)"
    )


def no_such_group(queue: str, group: str, groups: list[str]) -> InvalidInput | None:
    """The error for a result asked of a group the queue does not have
    while it has others (a misspelt name: refused at once rather than
    waited for); None when ``group`` is one of them, or the queue has no
    group yet (its workers did not join yet: waited for)."""
    if not groups or group in groups:
        return None
    return InvalidInput(
        f"queue {queue!r} has no group {group!r} and no result of it (its groups: {', '.join(map(repr, groups))})"
    )
