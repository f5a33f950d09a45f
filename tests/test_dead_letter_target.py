"""A dead-letter target that would loop: refused with an error naming it,
and nothing changed."""

from __future__ import annotations

import pytest
from support.aio_bridge import parametrize_api
from support.servers import SINGLE_SERVERS

import rqueue

pytest_generate_tests = parametrize_api  # every test of a client runs against both (aio_bridge.py)


# a cluster refuses any named dead-letter queue (test_dead_letters.py)
@pytest.mark.parametrize("backend", SINGLE_SERVERS, indirect=True)
def test_a_queue_named_as_its_own_dead_letter_queue_is_refused_not_a_loop(client, queue):
    # given a pattern whose dead-letter target is a queue it matches, and a message
    client.configure("orders.#", dead_letter="orders", max_deliveries=1)
    client.configure("orders", dead_letter="orders")
    queue.publish(b"m")
    # when a consumer of that queue is made, then it is refused, naming the setting
    with pytest.raises(rqueue.InvalidSetting, match="dead_letter='orders'.*names the queue itself"):
        queue.consumer("g")
    # and an override given to a consumer is refused alike
    client.configure("orders", dead_letter="dlq")
    with pytest.raises(rqueue.InvalidSetting, match="names the queue itself"):
        queue.consumer("g", dead_letter="orders")
    # and nothing was handed out or stored meanwhile: a consumer under the
    # default dead-letter queue gets the one message, whose reject ends it
    c = queue.consumer("g")
    [d] = c.fetch(10)
    d.reject()
    assert (queue.stats().last_seq, c.fetch(10)) == (1, [])
