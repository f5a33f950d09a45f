"""SPEC "Bad input": every wrong input gets a clear error that names what was
wrong, and changes nothing.

Each test sets up a queue state (given), makes one bad call (when), and
checks the exception type, that its message names the bad input, and that
every Redis key under the test's prefix and the queue's stats are exactly as
they were (then).
"""

from __future__ import annotations

import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

import rqueue
from rqueue import (
    AlreadyAcked,
    InvalidInput,
    InvalidName,
    InvalidSetting,
    NotHeld,
    PayloadTooLarge,
    RQueueError,
    StaleDelivery,
    UnknownDeliveryTag,
    Unroutable,
)

NAN = float("nan")
INF = float("inf")


# -- helpers ----------------------------------------------------------------


def dump(client: rqueue.Client, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every key under the client's prefix with its type and full value."""
    r = client.redis
    out: dict[str, Any] = {}
    for raw in r.scan_iter(match=f"{client.prefix}:*", count=1000):
        key = raw.decode()
        if skip and key.endswith(skip):
            continue
        kind = r.type(raw).decode()
        if kind == "hash":
            value: Any = r.hgetall(raw)
        elif kind == "set":
            value = r.smembers(raw)
        elif kind == "zset":
            value = r.zrange(raw, 0, -1, withscores=True)
        elif kind == "list":
            value = r.lrange(raw, 0, -1)
        else:
            value = r.get(raw)
        out[key] = (kind, value)
    return out


@contextmanager
def nothing_changes(client: rqueue.Client, *queues: rqueue.Queue, skip: tuple[str, ...] = ()) -> Iterator[None]:
    """Asserts that the block leaves every key of the prefix and the stats of
    ``queues`` exactly as they were. Put it before ``pytest.raises`` in one
    ``with`` so that it checks after the expected error."""
    before = (dump(client, skip), [q.stats() for q in queues])
    yield
    after = (dump(client, skip), [q.stats() for q in queues])
    assert after[0] == before[0], "Redis keys changed"
    assert after[1] == before[1], "queue stats changed"


def names_input(exc: BaseException, *fragments: str) -> None:
    """The error message contains each fragment (the bad input, the reason)."""
    text = str(exc)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in error message {text!r}"


@pytest.fixture
def held(queue: rqueue.Queue) -> SimpleNamespace:
    """Three messages; group billing with w1 holding 1.1 and 2.1, w2 idle."""
    queue.publish_many([b"a", b"b", b"c"])
    w1 = queue.consumer("billing", name="w1")
    w2 = queue.consumer("billing", name="w2")
    d1, d2 = w1.fetch(2)
    assert (d1.tag, d2.tag) == ("1.1", "2.1")
    return SimpleNamespace(w1=w1, w2=w2, d1=d1, d2=d2)


@pytest.fixture
def stale(queue: rqueue.Queue, clock: rqueue.ManualClock) -> SimpleNamespace:
    """w1's lease on seq 1 ran out and w2 got it again: w1 holds stale 1.1,
    w2 holds 1.2."""
    queue.publish(b"a")
    w1 = queue.consumer("billing", name="w1")
    w2 = queue.consumer("billing", name="w2")
    [old] = w1.fetch(1)
    clock.advance(queue.settings().ack_wait + 1)
    [new] = w2.fetch(1)
    assert (old.tag, new.tag) == ("1.1", "1.2")
    return SimpleNamespace(w1=w1, w2=w2, old=old, new=new)


SETTLE_OPS: dict[str, Callable[[rqueue.Consumer, Any], Any]] = {
    "ack": lambda c, ref: c.ack(ref),
    "nack": lambda c, ref: c.nack(ref),
    "reject": lambda c, ref: c.reject(ref),
    "term": lambda c, ref: c.term(ref, "why"),
    "in_progress": lambda c, ref: c.in_progress(ref),
}


# -- names --------------------------------------------------------------------

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


# -- settings -------------------------------------------------------------

BAD_SETTINGS = [
    pytest.param("ack_wait", -1, "positive number of seconds", id="ack_wait-negative"),
    pytest.param("ack_wait", 0, "positive number of seconds", id="ack_wait-zero"),
    pytest.param("ack_wait", 0.0001, "at least 0.001", id="ack_wait-below-1ms"),
    pytest.param("redelivery_jitter", -0.1, "between 0 and 1", id="jitter-negative"),
    pytest.param("redelivery_jitter", 1.5, "between 0 and 1", id="jitter-above-1"),
    pytest.param("redelivery_multiplier", 0.5, "must be >= 1.0", id="multiplier-below-1"),
    pytest.param("max_deliveries", 0, "-1 for unlimited", id="max_deliveries-zero"),
    pytest.param("max_deliveries", -2, "-1 for unlimited", id="max_deliveries-minus-2"),
    pytest.param("max_deliveries", 2.5, "whole number", id="max_deliveries-fraction"),
    pytest.param("redelivery_delay", -1, "must not be negative", id="delay-negative"),
    pytest.param("max_redelivery_delay", -1, "must not be negative", id="cap-negative"),
    pytest.param("dedup_window", -5, "must not be negative", id="dedup-negative"),
    pytest.param("max_inflight", 0, "whole number >= 1", id="max_inflight-zero"),
    pytest.param("prefetch", 0, "whole number >= 1", id="prefetch-zero"),
    pytest.param("prefetch", -1, "whole number >= 1", id="prefetch-negative"),
    pytest.param("max_payload", 0, "bytes >= 1", id="max_payload-zero"),
    pytest.param(
        "dead_letter", "no where", "must be dlq or none, None, or a queue name", id="dead_letter-not-a-queue-name"
    ),
    pytest.param("alternate", "{x}", "must be None or a queue name", id="alternate-not-a-queue-name"),
    pytest.param("ack_wait", "5", "must be a number, not str", id="str"),
    pytest.param("ack_wait", True, "must be a number, not bool", id="bool"),
    pytest.param("max_deliveries", False, "must be a number, not bool", id="bool-false"),
    pytest.param("ack_wait", None, "must be a number, not NoneType", id="none"),
    pytest.param("prefetch", [1], "must be a number, not list", id="list"),
    pytest.param("ack_wait", NAN, "must be finite", id="nan"),
    pytest.param("ack_wait", INF, "must be finite", id="inf"),
    pytest.param("redelivery_delay", -INF, "must be finite", id="minus-inf"),
    pytest.param("max_inflight", 10**400, "too large", id="huge-int"),
    pytest.param("ack_wiat", 5, "unknown setting", id="unknown-name"),
]


@pytest.mark.parametrize("name, value, why", BAD_SETTINGS)
def test_bad_setting_in_configure_stores_nothing(client, queue, held, name, value, why):
    # given a queue in use and its settings
    settings_before = queue.settings()
    # when a bad setting is configured for it
    with nothing_changes(client, queue), pytest.raises(InvalidSetting) as exc:
        client.configure("orders", **{name: value})
    # then the setting and its value are named, and nothing was stored
    assert exc.value.setting == name
    assert exc.value.value is value
    names_input(exc.value, f"invalid setting {name}=", why)
    assert queue.settings() == settings_before


@pytest.mark.parametrize("name, value, why", BAD_SETTINGS)
def test_bad_setting_given_to_a_consumer_joins_nothing(client, queue, held, name, value, why):
    # given a queue with one group
    # when a consumer of a new group is created with a bad setting
    with nothing_changes(client, queue), pytest.raises(InvalidSetting) as exc:
        queue.consumer("audit", name="w9", **{name: value})
    # then the setting is named and the group was not created
    assert exc.value.setting == name
    names_input(exc.value, f"invalid setting {name}=", why)
    assert queue.groups() == ["billing"]


def test_one_bad_setting_fails_the_whole_configure(client, queue):
    # given default settings
    before = queue.settings()
    # when a good and a bad setting are configured together
    with nothing_changes(client, queue), pytest.raises(InvalidSetting, match="redelivery_jitter=2"):
        client.configure("orders", ack_wait=5, redelivery_jitter=2)
    # then the good one was not stored either
    assert queue.settings() == before


def test_cap_below_delay_in_one_call(client, queue):
    # given default settings
    # when the cap is set below the delay
    with nothing_changes(client, queue), pytest.raises(InvalidSetting) as exc:
        client.configure("orders", redelivery_delay=10, max_redelivery_delay=5)
    # then the cap is named with the delay it must reach
    assert exc.value.setting == "max_redelivery_delay"
    names_input(exc.value, "max_redelivery_delay=5", "redelivery_delay (10")


def test_delay_above_a_stored_cap_of_the_same_pattern(client, queue):
    # given a stored cap
    client.configure("orders", max_redelivery_delay=5)
    # when a delay above it is configured
    with nothing_changes(client, queue), pytest.raises(InvalidSetting) as exc:
        client.configure("orders", redelivery_delay=10)
    # then the clash is named
    names_input(exc.value, "max_redelivery_delay=5", "redelivery_delay (10")


def test_cap_below_a_delay_from_a_broader_pattern(client, queue):
    # given a delay for every queue under orders
    client.configure("orders.#", redelivery_delay=10)
    # when one of them gets a lower cap
    with nothing_changes(client, queue), pytest.raises(InvalidSetting) as exc:
        client.configure("orders.eu", max_redelivery_delay=1)
    # then both patterns are named, and the queue still works
    names_input(exc.value, "max_redelivery_delay=1", "'orders.eu'", "'orders.#'")
    assert client.queue("orders.eu").settings().redelivery_delay == 10


def test_delay_above_a_cap_of_a_narrower_pattern(client, queue):
    # given a cap for one queue
    client.configure("orders", max_redelivery_delay=1)
    # when every queue gets a higher delay
    with nothing_changes(client, queue), pytest.raises(InvalidSetting) as exc:
        client.configure("#", redelivery_delay=10)
    # then both patterns are named, and the queue still works
    names_input(exc.value, "'orders'", "'#'", "redelivery_delay=10")
    assert queue.settings().max_redelivery_delay == 1


def test_unset_that_would_expose_a_broader_delay_removes_nothing(client, queue):
    # given a broad delay and a narrow pair of delay and cap that fits it
    client.configure("#", redelivery_delay=10)
    client.configure("orders", redelivery_delay=1, max_redelivery_delay=2)
    # when the narrow delay is removed (the broad 10 would meet the cap of 2)
    with nothing_changes(client, queue), pytest.raises(InvalidSetting, match="max_redelivery_delay=2"):
        client.settings.unset("orders", "redelivery_delay")
    # then it is still there
    assert queue.settings().redelivery_delay == 1


def test_unset_of_an_unknown_setting(client, queue):
    # given a stored setting
    client.configure("orders", ack_wait=5)
    # when an unknown name is unset
    with nothing_changes(client, queue), pytest.raises(InvalidSetting, match="ack_wiat"):
        client.settings.unset("orders", "ack_wiat")
    # then the stored setting stays
    assert queue.settings().ack_wait == 5


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("a..b", "empty word"),
        (".a", "empty word"),
        ("a.", "empty word"),
        ("a*b", "mixes a wildcard"),
        ("a.b#", "mixes a wildcard"),
        ("{x}", "contains '{'"),
        ("", "must not be empty"),
        ("a b", "contains ' '"),
    ],
)
def test_bad_pattern_stores_nothing(client, queue, pattern, why):
    # given default settings
    # when a bad pattern is configured
    with nothing_changes(client, queue), pytest.raises(InvalidName) as exc:
        client.configure(pattern, ack_wait=5)
    # then the pattern is named
    assert exc.value.kind == "pattern"
    names_input(exc.value, f"invalid pattern name {pattern!r}", why)


def test_configure_without_settings(client, queue):
    # given default settings
    # when configure is called with a pattern only
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="at least one setting"):
        client.configure("orders")


# -- publishing ---------------------------------------------------------------


def test_payload_over_max_payload(client, queue, held):
    # given a queue whose max_payload is 8 bytes
    client.configure("orders", max_payload=8)
    assert queue.publish(b"12345678").seq == 4  # the limit itself is fine
    # when 9 bytes are published
    with nothing_changes(client, queue), pytest.raises(PayloadTooLarge) as exc:
        queue.publish(b"123456789")
    # then size and limit are named, nothing was stored
    assert (exc.value.size, exc.value.limit) == (9, 8)
    names_input(exc.value, "payload of 9 bytes", "max_payload 8 bytes")


def test_payload_over_max_payload_in_a_batch_names_the_index(client, queue, held):
    # given a queue whose max_payload is 8 bytes
    client.configure("orders", max_payload=8)
    # when the third message of a batch is too large
    with nothing_changes(client, queue), pytest.raises(PayloadTooLarge) as exc:
        queue.publish_many([b"a", b"b", b"123456789", b"d"])
    # then its index is named and none of the batch was stored
    names_input(exc.value, "payload of 9 bytes", "message 2 of the batch")
    assert queue.stats().last_seq == 3


def test_payload_size_counts_bytes_of_a_memoryview(client, queue):
    # given a queue whose max_payload is 8 bytes
    client.configure("orders", max_payload=8)
    # when a memoryview of three 4-byte items (12 bytes) is published
    with nothing_changes(client, queue), pytest.raises(PayloadTooLarge, match="12 bytes"):
        queue.publish(memoryview(array.array("I", [1, 2, 3])))


BAD_MESSAGES = [
    pytest.param({"payload": "text"}, "payload must be bytes, not str", id="payload-str"),
    pytest.param({"payload": 42}, "payload must be bytes, not int", id="payload-int"),
    pytest.param({"payload": None}, "payload must be bytes, not NoneType", id="payload-none"),
    pytest.param({"headers": {"k": 1}}, "header 'k': 1 is not str to str", id="header-value-int"),
    pytest.param({"headers": {1: "v"}}, "header 1: 'v' is not str to str", id="header-key-int"),
    pytest.param({"headers": {"k": b"v"}}, "header 'k': b'v' is not str to str", id="header-value-bytes"),
    pytest.param({"headers": {"k": None}}, "header 'k': None is not str to str", id="header-value-none"),
    pytest.param({"headers": [("k", "v")]}, "headers must be a mapping of str to str, not list", id="headers-list"),
    pytest.param({"headers": "k=v"}, "headers must be a mapping of str to str, not str", id="headers-str"),
    pytest.param({"headers": {"k": "x" * 70_000}}, "over the limit of 65536", id="headers-too-big"),
    pytest.param({"id": ""}, "message id must not be empty", id="id-empty"),
    pytest.param({"id": 42}, "message id 42 must be a str, not int", id="id-int"),
    pytest.param({"id": "x" * 513}, "message id of 513 characters is over the limit of 512", id="id-too-long"),
    pytest.param({"id": "a\ud800"}, r"message id 'a\ud800' cannot be encoded", id="id-surrogate"),
]


@pytest.mark.parametrize("how", ["publish", "publish_many"])
@pytest.mark.parametrize("message, why", BAD_MESSAGES)
def test_bad_message_stores_nothing(client, queue, held, how, message, why):
    # given a queue with a group and messages
    payload = message.get("payload", b"ok")
    # when one message is bad (alone, or second of a batch)
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        if how == "publish":
            queue.publish(payload, headers=message.get("headers"), id=message.get("id"))
        else:
            queue.publish_many([b"ok", payload], headers=[None, message.get("headers")], ids=[None, message.get("id")])
    # then the bad part (and in a batch its index) is named and nothing of
    # the batch was stored
    names_input(exc.value, why)
    if how == "publish_many":
        names_input(exc.value, "message 1 of the batch")


def test_longest_allowed_message_id_works(queue):
    # given an id of exactly 512 characters
    # when it is published twice
    first = queue.publish(b"a", id="i" * 512)
    second = queue.publish(b"a", id="i" * 512)
    # then it de-duplicates like any id
    assert (first.duplicate, second.duplicate, second.seq) == (False, True, first.seq)


@pytest.mark.parametrize(
    "delay, shown",
    [
        (-1, "delay -1 "),
        (-0.001, "delay -0.001 "),
        (NAN, "delay nan "),
        (INF, "delay inf "),
        ("5", "delay '5' "),
        (True, "delay True "),
    ],
)
@pytest.mark.parametrize("how", ["publish", "publish_many"])
def test_bad_delay_stores_nothing(client, queue, held, how, delay, shown):
    # given a queue with messages
    # when a publish has a bad delay
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        if how == "publish":
            queue.publish(b"x", delay=delay)
        else:
            queue.publish_many([b"x", b"y"], delay=delay)
    # then the delay is named
    names_input(exc.value, shown, "must be a number of seconds from 0 to")


def test_delay_too_large_for_a_float(client, queue, held):
    # given a queue with messages
    # when a publish has a delay of 10**400 seconds
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="delay"):
        queue.publish(b"x", delay=10**400)


def test_delay_of_thousands_of_years_is_refused_or_kept(client, queue):
    # given a queue with a group
    c = queue.consumer("billing", name="w1")
    # when a message is published with a delay of 100 billion seconds
    try:
        queue.publish(b"x", delay=1e11)
    except InvalidInput as exc:
        # then either it is refused, naming the delay
        names_input(exc, "delay")
        return
    # or it is kept back, neither delivered nor dead-lettered
    assert c.fetch(5) == []
    assert queue.stats().dead_letters == 0


@pytest.mark.parametrize(
    "kwargs, why",
    [
        pytest.param({"ids": ["a"]}, "ids has 1 entries for 2 payloads", id="ids-short"),
        pytest.param({"ids": ["a", "b", "c"]}, "ids has 3 entries for 2 payloads", id="ids-long"),
        pytest.param({"headers": [{"k": "v"}]}, "headers has 1 entries for 2 payloads", id="headers-short"),
    ],
)
def test_batch_with_mismatched_lengths_stores_nothing(client, queue, held, kwargs, why):
    # given a queue with messages
    # when a batch of 2 payloads comes with a list of another length
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        queue.publish_many([b"a", b"b"], **kwargs)
    # then both lengths are named
    names_input(exc.value, why)


@pytest.mark.parametrize("payloads", [b"abc", "abc", None, 42], ids=["bytes", "str", "none", "int"])
def test_batch_that_is_not_a_sequence_of_payloads(client, queue, payloads):
    # given an empty queue
    # when publish_many gets one payload instead of a list
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="payloads must be a sequence of bytes"):
        queue.publish_many(payloads)


def test_bad_payload_in_a_batch_names_the_index(client, queue):
    # given an empty queue
    # when the third payload of a batch is a str
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        queue.publish_many([b"a", b"b", "c"])
    # then the error says which one
    names_input(exc.value, "message 2")


def test_header_that_cannot_be_encoded(client, queue):
    # given an empty queue
    # when a header value holds a lone surrogate
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="header"):
        queue.publish(b"x", headers={"k": "\ud800"})


def test_mandatory_publish_without_a_group_stores_nothing(client, queue):
    # given a queue that has no group
    # when a mandatory publish (and a mandatory batch with an id) is made
    with nothing_changes(client, queue):
        with pytest.raises(Unroutable) as exc:
            queue.publish(b"x", id="order-1", mandatory=True)
        with pytest.raises(Unroutable):
            queue.publish_many([b"a", b"b"], ids=["order-2", None], mandatory=True)
    # then the queue is named and nothing was stored, not even the queue name or the ids
    assert exc.value.queue == "orders"
    names_input(exc.value, "'orders'", "no group", "nothing stored")
    assert queue.stats().last_seq == 0
    assert client.queues() == []
    # and once a group exists the same id is new
    queue.consumer("billing", name="w1")
    assert queue.publish(b"x", id="order-1", mandatory=True) == rqueue.PublishResult(1, False)


# -- fetching -----------------------------------------------------------------


@pytest.mark.parametrize("n", [0, -1, 10**9, True, 1.5, "1", None])
def test_fetch_with_a_bad_n(client, queue, held, n):
    # given a consumer with messages ready
    # when it asks for a bad number of deliveries
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w2.fetch(n)
    # then n is named with the allowed range
    names_input(exc.value, f"not {n!r}", "from 1 to 10000")


@pytest.mark.parametrize("timeout", [-1, -0.001, -INF, "1", None, True])
def test_fetch_with_a_bad_timeout(client, queue, held, timeout):
    # given a consumer with messages ready
    # when it fetches with a bad timeout
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w2.fetch(1, timeout=timeout)
    # then the timeout is named
    names_input(exc.value, f"timeout must be a number of seconds >= 0, not {timeout!r}")


@pytest.mark.parametrize("timeout", [NAN, INF], ids=["nan", "inf"])
def test_fetch_with_a_timeout_that_is_not_finite(client, queue, held, monkeypatch, timeout):
    # given a consumer; a fetch that got past validation fails at once
    # instead of hanging this test (NaN once made the wait loop endless)
    def passed_validation(self, n):
        raise AssertionError(f"fetch accepted timeout={timeout}")

    monkeypatch.setattr(rqueue.Consumer, "_fetch_once", passed_validation)
    # when it fetches with timeout NaN or infinity
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w2.fetch(1, timeout=timeout)
    # then the timeout is named
    names_input(exc.value, f"timeout must be a number of seconds >= 0, not {timeout!r}")


def test_peek_with_a_bad_n(client, queue, held):
    # given a queue with messages
    # when peek asks for 0
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="n must be a whole number >= 1, not 0"):
        queue.peek(0)


def test_peek_with_a_bad_after(client, queue, held):
    # given a queue with messages
    # when peek starts after a str
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="after"):
        queue.peek(1, after="x")


# -- settling: unknown, malformed, double, not held ---------------------------


@pytest.mark.parametrize("op", list(SETTLE_OPS))
@pytest.mark.parametrize(
    "tag",
    [
        pytest.param("999.1", id="never-published"),
        pytest.param("3.1", id="published-not-delivered"),
        pytest.param("1.2", id="count-not-reached"),
        pytest.param("1.0", id="count-zero"),
    ],
)
def test_unknown_tag(client, queue, held, op, tag):
    # given w1 holding 1.1 and 2.1, seq 3 not delivered yet
    # when a tag that was never handed out is settled
    with nothing_changes(client, queue), pytest.raises(UnknownDeliveryTag) as exc:
        SETTLE_OPS[op](held.w1, tag)
    # then the tag is named, and the consumer keeps working
    assert exc.value.tag == tag
    names_input(exc.value, f"delivery tag {tag} ", "unknown")
    held.w1.ack([held.d1, held.d2])
    assert queue.stats().group("billing").ack_floor == 2


def test_tag_of_seq_zero_is_unknown(client, queue, held):
    # given w1 holding 1.1 and 2.1
    # when tag 0.1 is acked
    with nothing_changes(client, queue), pytest.raises(UnknownDeliveryTag, match="0.1"):
        held.w1.ack("0.1")


@pytest.mark.parametrize("op", list(SETTLE_OPS))
@pytest.mark.parametrize("tag", ["abc", "", "1", "1.", ".1", "1.x", "-1.1", "1.1.1", " 1.1", "1 .1"])
def test_malformed_tag(client, queue, held, op, tag):
    # given w1 holding 1.1 and 2.1
    # when a string that is not a tag is settled
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        SETTLE_OPS[op](held.w1, tag)
    # then the string is named with the expected form
    names_input(exc.value, f"{tag!r} is not a delivery tag of the form <seq>.<count>")


@pytest.mark.parametrize("op", list(SETTLE_OPS))
@pytest.mark.parametrize("ref", [11, None, 1.1], ids=["int", "none", "float"])
def test_ref_that_is_not_a_tag(client, queue, held, op, ref):
    # given w1 holding 1.1 and 2.1
    # when something that is neither a Delivery nor a tag is settled
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        SETTLE_OPS[op](held.w1, ref)
    # then its type is named
    names_input(exc.value, "expected a Delivery", "delivery tag", f", not {type(ref).__name__}")


def test_tag_with_a_superscript_digit_is_named(client, queue, held):
    # given w1 holding 1.1 and 2.1
    # when a tag with a superscript digit is acked
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        held.w1.ack("².1")
    # then the tag is named
    names_input(exc.value, "'².1' is not a delivery tag")


@pytest.mark.parametrize("op", list(SETTLE_OPS))
def test_settling_after_ack(client, queue, held, op):
    # given a delivery that was acked
    held.d1.ack()
    # when it is settled again (the second ack, or a nack, reject, ...)
    with nothing_changes(client, queue), pytest.raises(AlreadyAcked) as exc:
        SETTLE_OPS[op](held.w1, held.d1)
    # then the tag is named, and the consumer keeps working
    assert exc.value.tag == "1.1"
    names_input(exc.value, "delivery tag 1.1 ", "already settled")
    held.d2.ack()
    assert queue.stats().group("billing").ack_floor == 2


def test_same_delivery_twice_in_one_ack_acks_nothing(client, queue, held):
    # given w1 holding 1.1 and 2.1
    # when one list acks 1.1 twice
    with nothing_changes(client, queue), pytest.raises(AlreadyAcked) as exc:
        held.w1.ack([held.d1, held.d2, held.d1])
    # then the tag is named and not even the others were acked
    names_input(exc.value, "delivery tag 1.1 ")


@pytest.mark.parametrize("op", list(SETTLE_OPS))
def test_tag_held_by_another_consumer(client, queue, held, op):
    # given w1 holding 1.1
    # when w2 of the same group settles it
    with nothing_changes(client, queue), pytest.raises(NotHeld) as exc:
        SETTLE_OPS[op](held.w2, held.d1.tag)
    # then the tag is named, and w1 can still ack it
    assert exc.value.tag == "1.1"
    names_input(exc.value, "delivery tag 1.1 ", "held by another consumer")
    held.d1.ack()
    assert queue.stats().group("billing").acked == 1


@pytest.mark.parametrize(
    "bad, error, tag",
    [
        pytest.param("999.1", UnknownDeliveryTag, "999.1", id="unknown"),
        pytest.param("1.2", UnknownDeliveryTag, "1.2", id="count-not-reached"),
        pytest.param("abc", InvalidInput, "'abc'", id="malformed"),
        pytest.param("w2", NotHeld, "3.1", id="held-by-w2"),
        pytest.param("acked", AlreadyAcked, "4.1", id="already-acked"),
    ],
)
def test_ack_list_with_one_bad_tag_acks_none(client, queue, held, bad, error, tag):
    # given w1 holding 1.1 and 2.1, w2 holding 3.1, and 4.1 acked by w1
    queue.publish(b"d")
    [d3] = held.w2.fetch(1)
    [d4] = held.w1.fetch(1)
    d4.ack()
    ref = {"w2": d3.tag, "acked": d4}.get(bad, bad)
    # when w1 acks a list with one bad tag in the middle
    with nothing_changes(client, queue), pytest.raises(error) as exc:
        held.w1.ack([held.d1, ref, held.d2])
    # then the bad tag is named and none of the list was acked
    names_input(exc.value, tag)
    assert queue.stats().group("billing").in_flight == 3
    # and the good ones can still be acked
    held.w1.ack([held.d1, held.d2])
    assert queue.stats().group("billing").ack_floor == 2


def test_ack_multiple_takes_one_delivery(client, queue, held):
    # given w1 holding 1.1 and 2.1
    # when ack(multiple=True) gets a list of two
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="exactly one delivery"):
        held.w1.ack([held.d1, held.d2], multiple=True)


@pytest.mark.parametrize(
    "call, why",
    [
        pytest.param(lambda d: d.nack(delay=-1), "delay -1 must be", id="nack-delay-negative"),
        pytest.param(lambda d: d.nack(delay=NAN), "delay nan must be", id="nack-delay-nan"),
        pytest.param(lambda d: d.nack(delay="1"), "delay '1' must be", id="nack-delay-str"),
        pytest.param(lambda d: d.nack(error=5), "error must be a str, not int", id="nack-error-int"),
        pytest.param(lambda d: d.reject(reason=5), "reason must be a str, not int", id="reject-reason-int"),
        pytest.param(lambda d: d.term(b"why"), "reason must be a str, not bytes", id="term-reason-bytes"),
    ],
)
def test_bad_settle_arguments(client, queue, held, call, why):
    # given w1 holding 1.1
    # when it is nacked, rejected or termed with a bad argument
    with nothing_changes(client, queue), pytest.raises(InvalidInput) as exc:
        call(held.d1)
    # then the argument is named and the delivery is still held
    names_input(exc.value, why)
    held.d1.ack()


def test_error_text_that_cannot_be_encoded(client, queue, held):
    # given w1 holding 1.1
    # when it is nacked with an error text holding a lone surrogate
    with nothing_changes(client, queue), pytest.raises(InvalidInput, match="error"):
        held.d1.nack(error="\ud800")


def test_closed_consumer(client, queue, held):
    # given a consumer that left its group
    held.w2.close()
    # when it is used again
    with nothing_changes(client, queue):
        with pytest.raises(RQueueError, match="name='w2'.*is closed"):
            held.w2.fetch(1)
        with pytest.raises(RQueueError, match="is closed"):
            held.w2.ack("3.1")


# -- settling: stale deliveries -----------------------------------------------


@pytest.mark.parametrize("op", ["nack", "reject", "term"])
def test_stale_delivery_cannot_be_nacked_or_dead_lettered(client, queue, stale, op):
    # given w1's lease on seq 1 ran out and w2 holds it as 1.2
    # when w1 nacks, rejects or terms its old delivery 1.1
    with nothing_changes(client, queue), pytest.raises(StaleDelivery) as exc:
        SETTLE_OPS[op](stale.w1, stale.old)
    # then the old tag is named and w2 still holds the message
    assert exc.value.tag == "1.1"
    names_input(exc.value, "delivery tag 1.1 ", "no longer held")
    assert {c.name: c.held for c in queue.stats().group("billing").consumers} == {"w1": 0, "w2": 1}


def test_stale_delivery_cannot_be_extended(client, queue, stale):
    # given w1's lease on seq 1 ran out and w2 holds it as 1.2
    lease_before = client.redis.zrange(queue.keys.group("billing").as_list()[5], 0, -1, withscores=True)
    # when w1 extends its old delivery 1.1 (which records that w1 is alive,
    # so its heartbeat is left out of the comparison)
    with nothing_changes(client, skip=(":beats:billing",)), pytest.raises(StaleDelivery) as exc:
        stale.w1.in_progress(stale.old)
    # then the old tag is named and w2's lease is untouched
    names_input(exc.value, "delivery tag 1.1 ", "no longer held")
    assert client.redis.zrange(queue.keys.group("billing").as_list()[5], 0, -1, withscores=True) == lease_before


def test_late_ack_of_a_stale_delivery_completes_the_message(client, queue, clock, stale):
    # given w1's lease on seq 1 ran out and w2 holds it as 1.2
    # when w1 acks its old delivery 1.1 (the work was done)
    stale.w1.ack(stale.old)
    # then the message is complete for the group and nobody holds it
    g = queue.stats().group("billing")
    assert (g.ack_floor, g.in_flight, g.acked, [c.held for c in g.consumers]) == (1, 0, 1, [0, 0])
    assert queue.stats().depth == 0
    # and w2's newer delivery can no longer settle it, without changing anything
    with nothing_changes(client, queue), pytest.raises(AlreadyAcked, match="1.2"):
        stale.new.ack()
    # and it is not delivered again
    clock.advance(queue.settings().ack_wait + 1)
    assert stale.w1.fetch(5) == [] and stale.w2.fetch(5) == []


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 1e300, True, "5"])
def test_bad_heartbeat_timeout_is_refused_and_changes_nothing(client, queue, held, bad):
    # given w1 holding two deliveries
    # when it sends a heartbeat with a timeout that is no duration it can keep
    with nothing_changes(client, queue), pytest.raises(rqueue.InvalidInput) as exc:
        held.w1.heartbeat([held.d1, held.d2], timeout=bad)
    # then the error names the argument and the value
    names_input(exc.value, "timeout must be a positive number of seconds", repr(bad))
