"""Pattern settings: matching, specificity, storage shared by processes, and
bad settings, which are refused whole and store nothing."""

from __future__ import annotations

import json

import pytest
from support.refusals import names_input, nothing_changes

import rqueue
from rqueue import InvalidInput, InvalidName, InvalidSetting
from rqueue.engine.keys import settings_key
from rqueue.settings import pattern_matches, resolve

NAN = float("nan")
INF = float("inf")


# -- patterns -----------------------------------------------------------------------------


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
    # given patterns from the broadest to the exact name
    patterns = {
        "#": {"ack_wait": 1.0, "prefetch": 7},
        "orders.#": {"ack_wait": 2.0},
        "orders.*": {"ack_wait": 3.0},
        "orders.eu": {"max_deliveries": 4},
    }
    # when a queue's settings are resolved
    settings, origin = resolve(patterns, "orders.eu")
    # then each setting comes from the most specific pattern that has it
    assert (settings.ack_wait, settings.prefetch, settings.max_deliveries) == (3.0, 7, 4)
    assert origin == {"ack_wait": "orders.*", "prefetch": "#", "max_deliveries": "orders.eu"}


def test_defaults_when_nothing_matches():
    # given a pattern that does not match, then the defaults apply
    settings, origin = resolve({"billing.#": {"ack_wait": 9.0}}, "orders")
    assert settings == rqueue.Settings() and origin == {}


def test_default_cap_is_ten_times_the_delay():
    assert rqueue.Settings(redelivery_delay=2).effective_max_redelivery_delay == 20


def test_configure_is_seen_by_every_client(backend, prefix):
    # given two clients
    a = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    b = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    # when one configures a pattern twice
    a.configure("orders.#", ack_wait=5, max_deliveries=3)
    a.configure("orders.#", prefetch=9)
    # then the other sees both, merged
    s = b.queue("orders.eu").settings()
    assert (s.ack_wait, s.max_deliveries, s.prefetch) == (5.0, 3, 9)
    a.close()
    b.close()


def test_consumer_arguments_beat_patterns(client, queue):
    # given a pattern's prefetch of 2
    client.configure("orders", prefetch=2)
    queue.publish_many([b"m"] * 5)
    # then a consumer without a prefetch of its own takes 2, one given 3 takes 3
    assert len(queue.consumer("g").fetch(10)) == 2
    assert len(queue.consumer("g", prefetch=3).fetch(10)) == 3


def test_unset_returns_to_defaults(client, queue):
    # given a stored setting
    client.configure("orders", ack_wait=5)
    # when its pattern is unset, then the default applies again
    client.settings.unset("orders")
    assert queue.settings().ack_wait == rqueue.Settings().ack_wait


# -- bad settings ----------------------------------------------------------------------------


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


@pytest.mark.parametrize("value", [1e14, 2e11])
def test_a_stored_setting_beyond_its_limit_is_refused_naming_its_pattern(client, queue, held, value):
    # given a window beyond the limit stored for a pattern by an older version (as written to Redis)
    client.redis.hset(settings_key(client.prefix), "orders.# dedup_window", json.dumps(value))
    # when a message with an id is published
    with nothing_changes(client), pytest.raises(InvalidSetting) as exc:
        queue.publish(b"x", id="order-1")
    # then the setting, the limit and the pattern that stores it are named, and nothing was stored
    assert exc.value.setting == "dedup_window"
    names_input(exc.value, "dedup_window=", "over the limit of 315360000 s", "pattern 'orders.#'", "unset()")
    # and once it is unset the queue works again
    client.settings.unset("orders.#", "dedup_window")
    assert not queue.publish(b"x", id="order-1").duplicate
