"""Names of queues, groups, consumers, patterns and the key prefix: a bad
one is refused, naming the kind, the name and what is wrong with it, and
changes nothing (docs/guarantees.md, "Bad input")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.refusals import names_input, nothing_changes

import rqueue
from rqueue import InvalidName

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


def test_longest_allowed_name_works(client):
    # given a queue name of exactly the limit of 200 characters
    name = "q" * 200
    # when it is used
    q = client.queue(name)
    q.consumer("g" * 200, name="c" * 200)
    # then it works like any other
    assert q.publish(b"x").seq == 1


@pytest.mark.parametrize("name", ["DLQ.", "DLQ.DLQ."])
def test_bare_dead_letter_prefix_is_not_a_queue_name(client, queue, held, name):
    # given a queue state
    # when the bare dead-letter prefix is used as a queue name
    with nothing_changes(client, queue), pytest.raises(InvalidName) as exc:
        client.queue(name)
    # then the error says why
    names_input(exc.value, repr(name), "only the dead-letter prefix 'DLQ.'")
