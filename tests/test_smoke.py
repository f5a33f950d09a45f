"""The shortest round trip: publish, fetch and ack one message."""

from __future__ import annotations


def test_publish_fetch_ack_round_trip(queue):
    # given a published message
    r = queue.publish(b"hello", headers={"k": "v"})
    c = queue.consumer("billing", name="w1")
    # when it is fetched and acked
    [d] = c.fetch(5)
    d.ack()
    # then the group's floor covers it and its data is gone
    assert (d.seq, d.data, d.headers, d.delivery_count, d.redelivered) == (r.seq, b"hello", {"k": "v"}, 1, False)
    s = queue.stats()
    assert s.group("billing").ack_floor == r.seq
    assert s.depth == 0
