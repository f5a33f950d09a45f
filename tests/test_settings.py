"""Pattern settings: matching, specificity, storage shared by processes."""

from __future__ import annotations

import pytest

import rqueue
from rqueue.settings import pattern_matches, resolve


@pytest.mark.parametrize(
    "pattern, name, expected",
    [
        ("orders", "orders", True),
        ("orders", "orders.eu", False),
        ("orders.*", "orders.eu", True),
        ("orders.*", "orders", False),
        ("orders.*", "orders.eu.paris", False),
        ("orders.#", "orders", True),
        ("orders.#", "orders.eu.paris", True),
        ("#", "anything.at.all", True),
        ("*.eu", "orders.eu", True),
        ("#.eu", "a.b.eu", True),
        ("#.eu", "a.b.us", False),
        ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.c.z", True),
    ],
)
def test_pattern_matching(pattern, name, expected):
    assert pattern_matches(pattern, name) is expected


def test_most_specific_pattern_wins_per_setting():
    patterns = {
        "#": {"ack_wait": 1.0, "prefetch": 7},
        "orders.#": {"ack_wait": 2.0},
        "orders.*": {"ack_wait": 3.0},
        "orders.eu": {"max_deliveries": 4},
    }
    settings, origin = resolve(patterns, "orders.eu")
    assert (settings.ack_wait, settings.prefetch, settings.max_deliveries) == (3.0, 7, 4)
    assert origin == {"ack_wait": "orders.*", "prefetch": "#", "max_deliveries": "orders.eu"}


def test_defaults_when_nothing_matches():
    settings, origin = resolve({"billing.#": {"ack_wait": 9.0}}, "orders")
    assert settings == rqueue.Settings() and origin == {}


def test_default_cap_is_ten_times_the_delay():
    assert rqueue.Settings(redelivery_delay=2).effective_max_redelivery_delay == 20


def test_configure_is_seen_by_every_client(backend, prefix):
    a = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    b = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    a.configure("orders.#", ack_wait=5, max_deliveries=3)
    a.configure("orders.#", prefetch=9)  # merges with what the pattern had
    s = b.queue("orders.eu").settings()
    assert (s.ack_wait, s.max_deliveries, s.prefetch) == (5.0, 3, 9)
    a.close()
    b.close()


def test_consumer_arguments_beat_patterns(client, queue):
    client.configure("orders", prefetch=2)
    queue.publish_many([b"m"] * 5)
    assert len(queue.consumer("g").fetch(10)) == 2
    assert len(queue.consumer("g", prefetch=3).fetch(10)) == 3


def test_unset_returns_to_defaults(client, queue):
    client.configure("orders", ack_wait=5)
    client.settings.unset("orders")
    assert queue.settings().ack_wait == rqueue.Settings().ack_wait
