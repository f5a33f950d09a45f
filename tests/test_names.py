"""Names of queues, groups, consumers, patterns and the key prefix: a bad
one is refused, naming the kind, the name and what is wrong with it, and
changes nothing (docs/guarantees.md, "Bad input")."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from support.refusals import names_input, nothing_changes

import rqueue
from rqueue import InvalidName
from rqueue.names import check_queue_name, dead_letter_root

BAD_NAMES = [
    pytest.param("", "must not be empty", id="empty"),
    pytest.param("x" * 201, "201 characters long, the limit is 200", id="too-long"),
    pytest.param("a{b", "contains '{'", id="open-brace"),
    pytest.param("a}b", "contains '}'", id="close-brace"),
    pytest.param("a b", "contains ' '", id="space"),
    pytest.param("a\tb", r"contains '\t'", id="tab"),
    pytest.param("a\nb", r"contains '\n'", id="newline"),
    pytest.param("a\x01b", r"contains '\x01'", id="control"),
    pytest.param("a\x7fb", r"contains '\x7f'", id="delete"),
    pytest.param("a\x9bb", r"contains '\x9b'", id="c1-control"),
    pytest.param("a\u00a0b", r"contains '\xa0'", id="no-break-space"),
    pytest.param("a\u200bb", r"contains '\u200b'", id="zero-width-space"),
    pytest.param("a\ud800b", r"contains '\ud800'", id="lone-surrogate"),
    pytest.param(42, "must be a str, not int", id="int"),
    pytest.param(b"orders", "must be a str, not bytes", id="bytes"),
]

NAME_USES: dict[str, Callable[[rqueue.Client, rqueue.Queue, Any], Any]] = {
    "queue": lambda client, queue, bad: client.queue(bad),
    "group": lambda client, queue, bad: queue.consumer(bad, name="w9"),
    "consumer": lambda client, queue, bad: queue.consumer("billing", name=bad),
    "pattern": lambda client, queue, bad: client.configure(bad, ack_wait=5),
}


@pytest.mark.parametrize("kind", list(NAME_USES))
@pytest.mark.parametrize("bad, why", BAD_NAMES)
def test_bad_name_is_refused_and_changes_nothing(client, queue, held, kind, bad, why):
    # given a queue with a group, consumers and messages in flight (held)
    # when a queue, group, consumer or pattern gets a bad name
    with nothing_changes(client, queue), pytest.raises(InvalidName) as exc:
        NAME_USES[kind](client, queue, bad)
    # then the error names the kind, the name and what is wrong with it
    assert exc.value.kind == kind
    assert exc.value.name == bad
    names_input(exc.value, f"invalid {kind} name", repr(bad)[:60], why)


@pytest.mark.parametrize("bad, why", BAD_NAMES)
def test_bad_key_prefix_is_refused_before_connecting(backend, bad, why):
    # given any backend
    # when connecting with a bad key prefix
    with pytest.raises(InvalidName) as exc:
        rqueue.connect(backend, prefix=bad)
    # then the prefix is named
    assert exc.value.kind == "key prefix"
    names_input(exc.value, "invalid key prefix name", repr(bad)[:60], why)


def test_longest_allowed_names_work(client):
    # given a queue name whose dead-letter queue DLQ.<name> is exactly the limit of 200 characters,
    # and group and consumer names of exactly 200
    name = "q" * 196
    # when they are used, down to a dead letter and its replay
    q = client.queue(name)
    c = q.consumer("g" * 200, name="c" * 200)
    assert q.publish(b"x").seq == 1
    c.fetch()[0].reject(reason="bad")
    # then everything that opens the dead-letter queue works
    assert q.stats().dead_letters == 1
    assert [d.seq for d in q.dead_letters()] == [1]
    assert q.replay_dead_letters().replayed == 1
    assert client.queues() == ["DLQ." + name, name]
    # and the dead-letter queue (200 characters) and its own (204) can be opened by name
    assert client.queue("DLQ." + name).stats().last_seq == 1
    assert client.queue("DLQ.DLQ." + name).stats().last_seq == 0


@pytest.mark.parametrize("length", [197, 200])
def test_name_whose_dead_letter_queue_name_would_be_too_long_is_refused(client, queue, held, length):
    # given a queue state
    name = "q" * length
    # when a queue name is used whose DLQ.<name> would be over 200 characters
    with nothing_changes(client, queue), pytest.raises(InvalidName) as exc:
        client.queue(name).publish(b"x")
    # then the error says why, and how long a name may be
    assert (exc.value.kind, exc.value.name) == ("queue", name)
    names_input(
        exc.value,
        f"its dead-letter queue would be named with {length + 4} characters, over the limit of 200",
        "with dlq_prefix 'DLQ.' and dlq_suffix '' a queue name may have up to 196 characters",
    )


def test_dead_letter_queue_of_a_name_too_long_is_refused_by_its_queue(client, queue, held):
    # given a queue state
    name = "DLQ." + "q" * 197
    # when the dead-letter queue of a queue whose name is too long is used
    with nothing_changes(client, queue), pytest.raises(InvalidName) as exc:
        client.queue(name)
    # then the error names the queue it belongs to
    names_input(exc.value, "it is a dead-letter queue of 'qqq", "over the limit of 200", "up to 196 characters")


def test_limit_follows_the_clients_dead_letter_naming(backend, prefix):
    # given a client whose dead-letter queues are named D.<name>.x
    with rqueue.connect(backend, prefix=prefix, dlq_prefix="D.", dlq_suffix=".x") as client:
        # when names of 196 and 197 characters are used
        ok = client.queue("q" * 196)
        with pytest.raises(InvalidName, match="may have up to 196 characters"):
            client.queue("q" * 197)
        # then the one that fits works down to its dead-letter queue
        ok.consumer("g").fetch()  # joins
        ok.publish(b"x")
        ok.consumer("g").fetch()[0].reject(reason="bad")
        assert ok.dead_letter_queue.name == "D." + "q" * 196 + ".x"
        assert ok.stats().dead_letters == 1


def test_dead_letter_naming_that_makes_no_valid_name_is_refused(backend, prefix):
    # given a client whose dead-letter suffix holds a space
    with rqueue.connect(backend, prefix=prefix, dlq_suffix=" dead") as client:
        # when any queue is used
        with pytest.raises(InvalidName) as exc:
            client.queue("orders")
        # then the error names the dead-letter queue's name and the setting to look at
        names_input(exc.value, "'DLQ.orders dead'", "contains ' '", "dlq_suffix ' dead'")


@pytest.mark.parametrize(
    "name, root, depth",
    [("orders", "orders", 0), ("DLQ.orders", "orders", 1), ("DLQ.DLQ.orders", "orders", 2), ("DLQ", "DLQ", 0)],
)
def test_dead_letter_root(name, root, depth):
    assert dead_letter_root(name, "DLQ.", "") == (root, depth)


@pytest.mark.parametrize(
    "name, why",
    [
        ("q" * 197, "its dead-letter queue would be named with 201 characters"),
        ("DLQ." * 3 + "q" * 197, "it is a dead-letter queue of"),
        ("DLQ.", "is only the dead-letter prefix 'DLQ.'"),
        ("a b", "contains ' '"),
        ("DLQ.a b", "contains ' '"),
        ("", "must not be empty"),
        (7, "must be a str, not int"),
    ],
)
def test_check_queue_name_refuses(name, why):
    with pytest.raises(InvalidName, match=re.escape(why)):
        check_queue_name(name, "DLQ.", "")


def test_check_queue_name_accepts_deep_dead_letter_queues_of_a_valid_name():
    name = "DLQ." * 10 + "q" * 196
    assert check_queue_name(name, "DLQ.", "") == name


@pytest.mark.parametrize("name", ["DLQ.", "DLQ.DLQ."])
def test_bare_dead_letter_prefix_is_not_a_queue_name(client, queue, held, name):
    # given a queue state
    # when the bare dead-letter prefix is used as a queue name
    with nothing_changes(client, queue), pytest.raises(InvalidName) as exc:
        client.queue(name)
    # then the error says why
    names_input(exc.value, repr(name), "only the dead-letter prefix 'DLQ.'")
