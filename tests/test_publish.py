"""Publishing: seqs, de-duplication by id, delays, payload, header and
batch limits, mandatory publishes, and a server out of memory.

A refused publish names the bad input and stores nothing (docs/guarantees.md,
"Bad input").
"""

from __future__ import annotations

import array

import pytest
from support.aio_bridge import parametrize_api
from support.refusals import names_input, nothing_changes
from support.servers import start_server

import rqueue
from rqueue import InvalidInput, PayloadTooLarge, Unroutable
from rqueue.constants import MAX_BATCH

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)

NAN = float("nan")
INF = float("inf")


# -- seqs and ids ---------------------------------------------------------------


def test_publish_assigns_increasing_seqs(queue):
    # given an empty queue
    # when a batch and then one message are published
    rs = queue.publish_many([b"a", b"b", b"c"])
    # then their seqs count up from 1
    assert [r.seq for r in rs] == [1, 2, 3]
    assert queue.publish(b"d").seq == 4


def test_duplicate_id_inside_window_is_confirmed_but_not_stored(queue):
    # given a message published with an id
    first = queue.publish(b"x", id="order-42")
    # when the same id is published again, alone and inside a batch
    again = queue.publish(b"x2", id="order-42")
    batch = queue.publish_many([b"y", b"y-dup"], ids=["order-43", "order-43"])
    # then the duplicates name the first seq and nothing extra is stored
    assert again == rqueue.PublishResult(first.seq, True)
    assert [r.duplicate for r in batch] == [False, True]
    assert batch[1].seq == batch[0].seq
    assert queue.stats().last_seq == 2


def test_duplicate_window_expires(client, queue, clock):
    # given a de-duplication window of 10 s and a message with an id
    client.configure("orders", dedup_window=10)
    queue.publish(b"x", id="a")
    # when the id comes again inside the window, then it is a duplicate
    clock.advance(9)
    assert queue.publish(b"x", id="a").duplicate
    # and past the window it is new
    clock.advance(2)
    assert not queue.publish(b"x", id="a").duplicate


def test_id_past_its_window_is_new_even_when_cleanup_has_not_reached_it(client, queue, clock):
    # given 300 ids published with a window of 1 s
    client.configure("orders", dedup_window=1)
    queue.publish_many([b"m"] * 300, ids=[f"id-{i}" for i in range(300)])
    # when the last of them comes again after the window, before any cleanup reached it
    clock.advance(5)
    r = queue.publish(b"again", id="id-299")
    # then it is new
    assert not r.duplicate and r.seq == 301


def test_longest_allowed_message_id_works(queue):
    # given an id of exactly 512 characters
    # when it is published twice
    first = queue.publish(b"a", id="i" * 512)
    second = queue.publish(b"a", id="i" * 512)
    # then it de-duplicates like any id
    assert (first.duplicate, second.duplicate, second.seq) == (False, True, first.seq)


def test_queue_without_group_keeps_what_is_published(queue):
    # given a queue without a group that was published to
    queue.publish_many([b"a", b"b"])
    # when a group is created, then it sees everything retained
    c = queue.consumer("late")
    assert [d.data for d in c.fetch(10)] == [b"a", b"b"]


# -- delays ---------------------------------------------------------------------


def test_delayed_publish_waits_and_others_flow(queue, clock):
    # given a message delayed by 5 s and one published after it without delay
    queue.publish(b"later", delay=5)
    queue.publish(b"now")
    # when the group fetches, then only the one without delay comes
    c = queue.consumer("g")
    assert [d.data for d in c.fetch(10)] == [b"now"]
    assert queue.stats().scheduled == 1
    # and the delayed one comes once its time is reached, as a first delivery
    clock.advance(5)
    [d] = c.fetch(10)
    assert (d.data, d.delivery_count) == (b"later", 1)


def test_sched_index_is_trimmed_by_the_publish_that_passes_a_multiple_of_64_seqs(client, queue, clock):
    # given five delayed publishes (seqs 1-5) that are now due
    queue.publish_many([b"m"] * 5, delay=1)
    clock.advance(2)
    # when plain publishes reach seq 63, the due entries are still there (stats skip them)
    queue.publish_many([b"n"] * 58)
    assert client.redis.zcard(queue.keys.sched) == 5 and queue.stats().scheduled == 0
    # then the publish of seq 64 removes them
    queue.publish(b"n")
    assert client.redis.zcard(queue.keys.sched) == 0


def test_sched_index_is_trimmed_by_the_next_delayed_publish(client, queue, clock):
    # given five delayed publishes that are now due
    queue.publish_many([b"m"] * 5, delay=1)
    clock.advance(2)
    # when another delayed publish is made
    queue.publish(b"n", delay=1)
    # then the index holds only the new entry
    assert client.redis.zcard(queue.keys.sched) == 1 and queue.stats().scheduled == 1


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


# -- payloads, headers and batches ------------------------------------------------


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


# -- mandatory publishes -----------------------------------------------------------


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


def test_unroutable_mandatory_publish_goes_to_the_alternate(client, queue):
    # given a queue without a group that names an alternate queue
    client.configure("orders", alternate="orders-unrouted")
    # when a mandatory publish finds no group
    [r] = queue.publish_many([b"m"], mandatory=True)
    # then the message is stored in the alternate, not in the queue
    assert (r.alternate, r.seq) == ("orders-unrouted", 1)
    assert queue.stats().last_seq == 0
    assert [m.data for m in client.queue("orders-unrouted").peek()] == [b"m"]


@pytest.mark.parametrize("partitions", [None, 2], ids=["plain", "partitioned"])
def test_a_queue_named_as_its_own_alternate_is_refused_not_stored_groupless(client, partitions):
    # given a queue without a group whose alternate (from a pattern it matches) is itself
    client.configure("orders.#", alternate="orders")
    queue = client.queue("orders", partitions=partitions)
    # when a mandatory publish is made, then it is refused naming the setting, and nothing is stored
    with nothing_changes(client), pytest.raises(rqueue.InvalidSetting) as exc:
        queue.publish_many([b"m", b"n"], mandatory=True)
    assert exc.value.setting == "alternate"
    names_input(exc.value, "alternate='orders'", "names the queue itself")
    # and once a group exists it is refused alike: the setting, not the groups, is wrong
    queue.consumer("billing", name="w1")
    with nothing_changes(client), pytest.raises(rqueue.InvalidSetting, match="names the queue itself"):
        queue.publish(b"m", mandatory=True)
    # and a publish that is not mandatory, which never reads it, is stored
    assert queue.publish(b"m").alternate is None
    # and an exact-name override of the pattern puts mandatory publishes right again
    client.configure("orders", alternate=None)
    assert queue.publish(b"m", mandatory=True).alternate is None


def test_unroutable_without_alternate_stores_nothing(queue):
    # given a queue without a group or alternate
    # when a mandatory publish is made, then it is refused and nothing is stored
    with pytest.raises(rqueue.Unroutable, match="orders"):
        queue.publish(b"m", mandatory=True)
    assert queue.stats().last_seq == 0


# -- a server over its maxmemory -----------------------------------------------------


@pytest.mark.parametrize("kind", ["redis", "valkey"])
def test_over_maxmemory_acks_get_through_and_publishes_are_refused_whole(kind, prefix):
    # given a server with a small maxmemory (noeviction) and 5 deliveries held
    server = start_server(kind, extra_args=["--maxmemory-policy", "noeviction"])
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        q = client.queue("orders")
        q.publish_many([b"m"] * 5)
        c = q.consumer("g")
        held = c.fetch(5)
        # when the server holds more than its maxmemory
        client.redis.set(f"{prefix}:filler", b"x" * 5_000_000)
        client.redis.config_set("maxmemory", 4 * 1024 * 1024)
        assert client.redis.info("memory")["used_memory"] > 4 * 1024 * 1024
        # then a publish is refused whole: nothing of it is stored
        with pytest.raises(Exception, match="maxmemory"):
            q.publish_many([b"n"] * 3)
        assert q.stats().last_seq == 5
        # and the acks of the worker's combined ack-and-fetch call are applied all the same
        statuses, _, _ = c.ack_and_fetch(held, 5)
        assert statuses == [None] * 5
        assert q.stats().group("g").acked == 5
        client.close()
    finally:
        server.stop()


# -- batches over MAX_BATCH messages -------------------------------------------------


def _full_after_one_call(client, prefix):
    """Sets maxmemory 4.5 MB above what the server uses now. A publish call
    of MAX_BATCH messages of 400 bytes with ids holds about 3 MB of
    arguments while Redis checks its memory, and stores about 3 MB: the
    first call of a batch starts below the limit, and the next one, its
    arguments on top of what the first stored, finds the server full."""
    client.queue("warm-up").publish(b"x")  # the script is loaded
    client.redis.delete(*client.redis.keys(f"{prefix}:*"))
    client.redis.config_set("maxmemory", client.redis.info("memory")["used_memory"] + 4_500_000)


@pytest.mark.parametrize("durable", [False, True], ids=["plain", "durable"])
@pytest.mark.parametrize("kind", ["redis", "valkey"])
def test_a_batch_whose_later_call_fails_says_what_was_stored(kind, prefix, durable):
    # given a server that fills up after one publish call of MAX_BATCH messages
    server = start_server(kind)
    try:
        client = rqueue.connect(server.url, prefix=prefix, durable_replicas=0)
        _full_after_one_call(client, prefix)
        q = client.queue("orders")
        payloads = [b"m" * 400] * (3 * MAX_BATCH)
        ids = [f"order-{i}" for i in range(len(payloads))]
        # when a batch of three calls is published
        with pytest.raises(rqueue.PartialPublish) as caught:
            q.publish_many(payloads, ids=ids, durable=durable)
        # then the error lists the first call's messages as stored, the others as not, and why
        err = caught.value
        assert [r.seq for r in err.results[:MAX_BATCH]] == list(range(1, MAX_BATCH + 1))
        assert err.results[MAX_BATCH:] == [None] * (2 * MAX_BATCH)
        # (the calls after it, by their index from 0, each with its error)
        assert 1 in err.errors and all(isinstance(why, rqueue.OutOfMemory) for why in err.errors.values())
        names_input(err, f"stored {MAX_BATCH} of {3 * MAX_BATCH} messages", "OutOfMemory")
        assert q.stats().last_seq == MAX_BATCH
        assert client.queues() == ["orders"]
        # and once memory is back, the same batch again stores each message once
        client.redis.config_set("maxmemory", 0)
        again = q.publish_many(payloads, ids=ids)
        assert [r.duplicate for r in again] == [True] * MAX_BATCH + [False] * (2 * MAX_BATCH)
        assert [r.seq for r in again] == list(range(1, 3 * MAX_BATCH + 1))
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["redis", "valkey"])
def test_a_batch_whose_first_call_fails_raises_that_error_and_stores_nothing(kind, prefix):
    # given a server already over its maxmemory
    server = start_server(kind)
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        client.queue("warm-up").publish(b"x")  # the script is loaded
        client.redis.set(f"{prefix}:filler", b"x" * 5_000_000)
        # (below the filler's value alone: a limit set just under used_memory
        # can end up above it once the server frees the SET's query buffer)
        client.redis.config_set("maxmemory", 4 * 1024 * 1024)
        assert client.redis.info("memory")["used_memory"] > 4 * 1024 * 1024
        q = client.queue("orders")
        # when a batch of two calls is published
        # then the server's refusal is raised as it came, and nothing is stored
        with pytest.raises(rqueue.OutOfMemory):
            q.publish_many([b"m"] * (MAX_BATCH + 1))
        assert q.stats().last_seq == 0
        assert client.queues() == ["warm-up"]
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)
def test_a_durable_batch_of_several_calls_not_confirmed_lists_every_message(backend, prefix):
    # given a server without the replica a durable publish waits for
    client = rqueue.connect(backend, prefix=prefix, durable_replicas=1, durable_timeout=0.05)
    q = client.queue("orders")
    # when a durable batch of two calls is published
    with pytest.raises(rqueue.NotDurable) as caught:
        q.publish_many([b"m"] * (MAX_BATCH + 1), durable=True)
    # then every message is stored and listed, and the shortfall is named once
    err = caught.value
    assert [r.seq for r in err.results] == list(range(1, MAX_BATCH + 2))
    assert (err.replicas, err.required) == (0, 1)
    assert q.stats().last_seq == MAX_BATCH + 1
    client.close()
