"""Checks for a refused call: it names what was wrong, changes nothing and
shows no password."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import rqueue
from support.raw import dump


@contextmanager
def nothing_changes(client: rqueue.Client, *queues: rqueue.Queue, skip: tuple[str, ...] = ()) -> Iterator[None]:
    """Asserts that the block leaves every key of the prefix and the stats of
    ``queues`` exactly as they were. Put it before ``pytest.raises`` in one
    ``with`` so that it checks after the expected error."""
    before = (without_wake_marks(dump(client, skip)), [q.stats() for q in queues])
    yield
    after = (without_wake_marks(dump(client, skip)), [q.stats() for q in queues])
    assert after[0] == before[0], "Redis keys changed"
    assert after[1] == before[1], "queue stats changed"


def without_wake_marks(keys: dict[str, Any]) -> dict[str, Any]:
    """``keys`` without the meta field "wake": a fetch that hands out
    nothing sets it (also one whose acks are refused), so that the next
    publish wakes the consumers waiting in Redis. A hint, not the queue's
    state (lua/includes/wake.lua)."""
    out = dict(keys)
    for key, (kind, value) in keys.items():
        if key.endswith(":meta") and kind == "hash" and b"wake" in value:
            out[key] = (kind, {f: v for f, v in value.items() if f != b"wake"})
    return out


def names_input(exc: BaseException, *fragments: str) -> None:
    """The error message contains each fragment (the bad input, the reason)."""
    text = str(exc)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in error message {text!r}"


def everything_shown(exc: BaseException, caplog: pytest.LogCaptureFixture) -> str:
    """All text the error and the logs could show a user."""
    return "\n".join([str(exc), repr(exc), str(getattr(exc, "url", "")), *traceback.format_exception(exc), caplog.text])
