"""Queue.status: what became of one message, by id or seq."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.refusals import names_input, nothing_changes

import rqueue
from rqueue import MessageState as S
from rqueue.cli import cli


def test_status_follows_a_message_through_its_groups(client, queue, clock):
    # given a message with an id and two groups
    client.configure("orders", max_deliveries=1)
    queue.consumer("billing").close()
    queue.consumer("audit").close()
    queue.publish(b"order", id="order-42")
    # then at first it is published, and unread in both groups
    st = queue.status("order-42")
    assert (st.seq, st.state) == (1, S.PUBLISHED)
    assert {g: s.state for g, s in st.groups.items()} == {"billing": S.PUBLISHED, "audit": S.PUBLISHED}
    # when billing's consumer holds it, then it is in flight, by that consumer, once
    billing = queue.consumer("billing", name="w1")
    (d,) = billing.fetch()
    got = queue.status("order-42").groups["billing"]
    assert (got.state, got.consumer, got.deliveries) == (S.IN_FLIGHT, "w1", 1)
    # when billing acks it and audit dead-letters it
    d.ack()
    audit = queue.consumer("audit")
    audit.fetch()[0].term("not auditable")
    st = queue.status("order-42")
    # then each group says so, with the reason, and the message is settled
    assert st.groups["billing"] == (S.ACKED, None, 0, None)
    assert st.groups["audit"].state == S.DEAD_LETTERED and st.groups["audit"].reason == "terminated"
    assert st.state == S.SETTLED and queue.status(seq=1) == st


def test_status_of_delayed_and_waiting_messages(client, queue, clock):
    queue.consumer("g").close()
    later = queue.publish(b"later", delay=60)
    now = queue.publish(b"now")
    assert queue.status(seq=later.seq).state == S.DELAYED
    assert queue.status(seq=later.seq).groups["g"].state == S.DELAYED
    c = queue.consumer("g")
    c.fetch()[0].nack(delay=30)
    waiting = queue.status(seq=now.seq).groups["g"]
    assert (waiting.state, waiting.deliveries) == (S.DELAYED, 1)
    clock.advance(31)
    assert queue.status(seq=now.seq).groups["g"].state == S.WAITING


def test_unknown_ids_and_seqs(client, queue, clock):
    queue.publish(b"a", id="a")
    assert queue.status("never").state == S.UNKNOWN
    assert queue.status(seq=5).state == S.UNKNOWN
    # an id outside its de-duplication window is no longer known
    clock.advance(121)
    assert queue.status("a").state == S.UNKNOWN
    assert queue.status(seq=1).state == S.PUBLISHED


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({}, "give a message id or seq="), ({"id": "a", "seq": 1}, "not both"), ({"seq": 0}, "seq")],
)
def test_status_refuses_bad_input(client, queue, kwargs, fragment):
    queue.publish(b"a")
    with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput) as exc:
        queue.status(**kwargs)
    names_input(exc.value, fragment)


def test_status_of_a_group_reset_back(client, queue):
    client.configure("orders", max_age=3600)
    queue.publish(b"a", id="a")
    c = queue.consumer("g")
    c.fetch()[0].ack()
    assert queue.status("a").groups["g"].state == S.ACKED
    queue.reset_group("g", "first")
    assert queue.status("a").groups["g"].state == S.PUBLISHED


def test_status_of_a_replayed_message_says_where_it_stands(client, queue, clock):
    """A replay reopens a seq the group had settled (it may sit below the
    floor, in an acked run): status.lua reads the group's reopen set, so
    the replayed message is reported by its delivery, not as acked."""
    # given a message dead-lettered in group g, then replayed
    seq = queue.publish(b"x").seq
    c = queue.consumer("g", name="a")
    [d] = c.fetch(1)
    d.reject(reason="bad")
    assert queue.status(seq=seq).groups["g"].state == S.DEAD_LETTERED
    assert queue.replay_dead_letters().replayed == 1
    # then while it waits to be fetched again it is not settled
    st = queue.status(seq=seq)
    assert st.state is not S.SETTLED, st
    assert st.groups["g"].state is S.WAITING, st
    # when a consumer holds it, then it is in flight, by that consumer
    [d] = c.fetch(1)
    assert d.seq == seq and d.replayed
    st = queue.status(seq=seq)
    assert st.state is not S.SETTLED, st
    assert (st.groups["g"].state, st.groups["g"].consumer) == (S.IN_FLIGHT, "a"), st
    # when it is nacked with a delay, then it is delayed
    d.nack(delay=30)
    assert queue.status(seq=seq).groups["g"].state is S.DELAYED
    # when it is fetched and acked at last, then it is settled, acked
    clock.advance(31)
    [d] = c.fetch(1)
    d.ack()
    st = queue.status(seq=seq)
    assert st.state is S.SETTLED and st.groups["g"].state is S.ACKED, st


# A memory:// server lives in one client: the command's own client would see another.
@pytest.mark.parametrize("backend", ["redis", "valkey", "cluster"], indirect=True)
def test_status_command_with_json(backend, prefix):
    client = rqueue.connect(backend, prefix=prefix)  # the server's clock, as the command's
    queue = client.queue("orders")
    queue.consumer("g").close()
    queue.publish(b"a", id="a")
    out = CliRunner().invoke(cli, ["--url", client.url, "--prefix", client.prefix, "status", "orders", "a", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {
        "queue": "orders",
        "seq": 1,
        "state": "published",
        "published_ms": queue.peek(1)[0].published_ms,
        "not_before_ms": None,
        "groups": {"g": {"state": "published", "consumer": None, "deliveries": 0, "reason": None}},
    }
    text = CliRunner().invoke(cli, ["--url", client.url, "--prefix", client.prefix, "status", "orders", "--seq", "9"])
    assert text.exit_code == 0 and "unknown" in text.stdout
    client.close()


def test_the_asyncio_client_answers_as_the_sync_one(backend, prefix, client, queue):
    import asyncio

    import rqueue.aio

    # given a message in flight in one group, read by both clients
    queue.consumer("g").close()
    queue.publish(b"a", id="a")
    queue.consumer("g", name="w1").fetch()

    async def main() -> rqueue.MessageStatus:
        aclient = await rqueue.aio.connect(backend, prefix=prefix, clock=client.clock)
        try:
            return await aclient.queue("orders").status("a")
        finally:
            await aclient.close()

    assert asyncio.run(main()) == queue.status("a")
