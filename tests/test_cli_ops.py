"""`rqueue peek | publish | configure | settings | purge | top` and the
unknown-queue error, with click's CliRunner on every backend."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import rqueue
from rqueue.cli import cli


@pytest.fixture
def client(backend, prefix):
    c = rqueue.connect(backend, prefix=prefix, settings_ttl=0)
    yield c
    c.close()


def run(backend, prefix, *args, input=None):
    return CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, *args], input=input)


def test_publish_argument_file_and_stdin_lines(backend, prefix, client, tmp_path):
    one = run(backend, prefix, "publish", "orders", "hello", "-H", "k=v", "--id", "a", "--json")
    assert json.loads(one.stdout) == {"published": 1, "duplicates": 0, "first_seq": 1, "last_seq": 1}
    again = run(backend, prefix, "publish", "orders", "hello", "--id", "a", "--json")
    assert json.loads(again.stdout)["duplicates"] == 1
    f = tmp_path / "body.bin"
    f.write_bytes(b"\x00\x01binary")
    assert run(backend, prefix, "publish", "orders", "--file", str(f)).exit_code == 0
    lines = run(backend, prefix, "publish", "orders", "--json", input="a\nb\nc\n")
    assert json.loads(lines.stdout) == {"published": 3, "duplicates": 0, "first_seq": 3, "last_seq": 5}
    msgs = client.queue("orders").peek(10)
    assert [m.data for m in msgs] == [b"hello", b"\x00\x01binary", b"a", b"b", b"c"]
    assert msgs[0].headers == {"k": "v"}


def test_publish_bad_arguments(backend, prefix):
    assert run(backend, prefix, "publish", "orders", "x", "-H", "novalue").exit_code == 2
    many = run(backend, prefix, "publish", "orders", "--id", "a", input="a\nb\n")
    assert many.exit_code == 2 and "--id names one message" in many.output


def test_peek_log_and_group_view(backend, prefix, client):
    q = client.queue("orders")
    q.publish_many([b"1", b"2", b"3"])
    c = q.consumer("g")
    d1, d2 = c.fetch(2)
    d2.nack(delay=0)  # g would get 2 again first, then 3
    data = json.loads(run(backend, prefix, "peek", "orders", "--json").stdout)
    assert [m["data"] for m in data["messages"]] == ["1", "2", "3"]
    data = json.loads(run(backend, prefix, "peek", "orders", "-g", "g", "--json").stdout)
    assert [m["seq"] for m in data["messages"]] == [2, 3]
    assert "seq" in run(backend, prefix, "peek", "orders", "-n", "1").stdout
    assert run(backend, prefix, "peek", "orders", "-g", "nope").exit_code == 2


def test_configure_then_settings_shows_where_each_came_from(backend, prefix):
    assert run(backend, prefix, "configure", "orders.#", "--ack-wait", "5", "--max-deliveries", "3").exit_code == 0
    assert run(backend, prefix, "configure", "orders.eu", "--dead-letter", "none").exit_code == 0
    data = json.loads(run(backend, prefix, "settings", "orders.eu", "--json").stdout)
    assert (data["settings"]["ack_wait"], data["settings"]["max_deliveries"], data["settings"]["dead_letter"]) == (
        5.0,
        3,
        "none",
    )
    assert data["from"] == {"ack_wait": "orders.#", "max_deliveries": "orders.#", "dead_letter": "orders.eu"}
    assert run(backend, prefix, "configure", "orders.#", "--unset", "ack_wait").exit_code == 0
    assert json.loads(run(backend, prefix, "settings", "orders.eu", "--json").stdout)["settings"]["ack_wait"] == 30.0
    bad = run(backend, prefix, "configure", "orders", "--redelivery-jitter", "2")
    assert bad.exit_code == 2 and "redelivery_jitter" in bad.output
    assert run(backend, prefix, "configure", "orders").exit_code == 2


def test_purge_asks_then_purges(backend, prefix, client):
    q = client.queue("orders")
    q.publish_many([b"m"] * 4)
    q.consumer("g").fetch(1)
    assert run(backend, prefix, "purge", "orders", input="n\n").exit_code == 1
    assert q.stats().group("g").pending == 4
    done = run(backend, prefix, "purge", "orders", "--yes", "--json")
    assert json.loads(done.stdout) == {"purged": {"g": 3}}
    g = q.stats().group("g")
    assert (g.pending, g.in_flight) == (1, 1)


def test_top_once(backend, prefix, client):
    client.queue("orders").publish(b"m")
    out = run(backend, prefix, "top", "--once")
    assert out.exit_code == 0 and "orders" in out.stdout and "depth" in out.stdout


@pytest.mark.parametrize("command", [["stats", "ghost"], ["peek", "ghost"], ["purge", "ghost", "--yes"]])
def test_unknown_queue_is_exit_code_3(backend, prefix, command):
    result = run(backend, prefix, *command)
    assert result.exit_code == 3
    assert "queue 'ghost' does not exist" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_pausing_a_group_that_does_not_exist_is_bad_input(backend, prefix, client, command):
    # given a queue with group g
    client.queue("orders").publish(b"a")
    client.queue("orders").create_group("g")
    # when another group is paused or resumed, then it is bad input (exit 2), as for group reset
    r = run(backend, prefix, command, "orders", "--group", "nosuch")
    assert r.exit_code == 2 and "group nosuch does not exist" in r.output, r.output
    # and nothing changed
    assert client.queue("orders").stats().group("g").paused is False


def test_pause_and_resume_a_group_and_a_queue(backend, prefix, client):
    # given a queue with a group
    q = client.queue("orders")
    q.publish(b"a")
    c = q.consumer("g")
    # when the group is paused from the CLI, then it says so and stats and top show it
    r = run(backend, prefix, "pause", "orders", "--group", "g", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"queue": "orders", "group": "g", "paused": True, "mode": "hold", "changed": True}
    assert c.fetch(1) == []
    stats = json.loads(run(backend, prefix, "stats", "orders", "--json").output)
    assert stats["groups"][0]["paused"] is True and stats["paused"] == ""
    # when the queue is paused to refuse, then publishes fail and top names both
    r = run(backend, prefix, "pause", "orders", "--mode", "refuse")
    assert r.exit_code == 0 and "is now paused (refuse)" in r.output
    assert run(backend, prefix, "publish", "orders", "b").exit_code != 0
    top = run(backend, prefix, "top", "--once").output
    assert "queue (refuse), g" in top
    # when both are resumed, then it flows again
    assert json.loads(run(backend, prefix, "resume", "orders", "--json").output)["changed"] is True
    r = run(backend, prefix, "resume", "orders", "-g", "g")
    assert "is now running" in r.output
    assert [d.seq for d in c.fetch(1)] == [1]
    assert "was already running" in run(backend, prefix, "resume", "orders").output
