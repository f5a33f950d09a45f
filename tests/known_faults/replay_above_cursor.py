"""Reproduction: a dead letter above its group's cursor is not replayed
(tests/known_faults/README.md)."""

from __future__ import annotations

import pytest

import rqueue


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_a_priority_message_dead_lettered_above_the_cursor_is_replayed(backend, prefix):
    """A priority message is handed out apart from the cursor, ahead of an
    older plain one, and rejected: its dead letter sits above the group's
    cursor. replay.lua answers "unread" for any seq above the cursor (meant
    for a reset that moved the group back over it, whose scan hands it out
    again), so the operator's replay skips it until a fetch has moved the
    cursor past it. The scan would not hand it out (the group settled it):
    the replay should reopen it without the scan handing it out a second
    time. Found by helper 60."""
    c = rqueue.connect(backend, prefix=prefix)
    q = c.queue("orders")
    consumer = q.consumer("g", "a")
    q.publish(b"plain")
    q.publish(b"urgent", priority=5)
    (d,) = consumer.fetch(1)
    assert d.data == b"urgent"
    d.reject(reason="bad")
    # when the operator replays it, then it is replayed, and handed out once
    assert q.replay_dead_letters().replayed == 1
    handed = [x.data for x in consumer.fetch(10)]
    assert sorted(handed) == [b"plain", b"urgent"]
    c.close()
