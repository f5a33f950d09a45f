"""The rqueue command line: demo, stats, queues, and how errors are shown."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import rqueue
from rqueue.cli import cli
from rqueue.cli.common import table
from rqueue.cli.demo import DEMO_POISON, demo_problems
from rqueue.embedded import free_port
from rqueue.engine.keys import registry_key, settings_key


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def table_rows(text: str, first: str) -> dict[str, dict[str, str]]:
    """The rows of the aligned table in ``text`` whose header starts with
    ``first``, keyed by their first cell (columns are 2+ spaces apart)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first + " "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(header), line
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


@pytest.fixture
def prepared(backend: str, prefix: str):
    """Queue "orders" of group "billing": 5 published, seq 1 acked, seq 2
    rejected, seq 3 in flight, seqs 4 and 5 not yet read."""
    client = rqueue.connect(backend, prefix=prefix)
    q = client.queue("orders")
    q.publish_many([b"a", b"b", b"c", b"d", b"e"])
    c = q.consumer(group="billing", name="w1")
    d1, d2, d3 = c.fetch(3)
    d1.ack()
    d2.reject(reason="bad")
    yield q
    c.close()
    client.close()


# -- demo ----------------------------------------------------------------------


def test_demo_json_reports_acks_redeliveries_and_dead_letters(backend, prefix):
    # when the demo runs with 300 messages
    result = run("--url", backend, "--prefix", prefix, "demo", "--messages", "300", "--json")
    # then it succeeds and reports every message settled
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["published"] == 300
    assert report["consumed"] == 300
    assert report["dead_lettered"] == DEMO_POISON == 3
    assert report["redelivered"] >= 3  # messages 100, 200, 300 were nacked once
    assert report["publish_per_s"] > 0 and report["consume_per_s"] > 0
    assert report["ok"] is True and report["problems"] == []
    # and the final stats hold what the demo checked
    stats = report["stats"]
    [group] = stats["groups"]
    assert group["name"] == "workers"
    assert group["ack_floor"] == stats["last_seq"] == 300
    assert stats["depth"] == 0
    assert stats["dead_letters"] == 3
    assert group["dead_lettered"] == 3 and group["redelivered"] >= 3 and group["in_flight"] == 0


def test_demo_table_shows_group_and_throughput(backend, prefix):
    result = run("--url", backend, "--prefix", prefix, "demo", "--messages", "120", "--consumers", "3")
    assert result.exit_code == 0, result.output
    row = table_rows(result.stdout, "group")["workers"]
    assert (row["ack floor"], row["in flight"], row["dead-lettered"]) == ("120", "0", "3")
    assert int(row["redelivered"]) >= 1 and int(row["nacked"]) >= 1
    assert table_rows(result.stdout, "step")["publish"]["messages"] == "120"
    assert "messages/s" in result.stdout
    assert "publish" in result.stdout and "consume" in result.stdout
    assert "DLQ.demo" in result.stdout
    assert result.stdout.rstrip().endswith("ok: every message acked or dead-lettered")


def test_demo_twice_on_one_server_checks_only_its_own_dead_letters(backend, prefix):
    first = run("--url", backend, "--prefix", prefix, "demo", "--messages", "50", "--json")
    second = run("--url", backend, "--prefix", prefix, "demo", "--messages", "50", "--json")
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    stats = json.loads(second.stdout)["stats"]
    assert (stats["last_seq"], stats["dead_letters"]) == (100, 6)


def test_demo_problems_names_every_failed_check():
    group = rqueue.GroupStats("workers", 7, 10, 3, 1, 0, None, 0, 0, 6, 0, 0, 0, 1, 0)
    before = rqueue.QueueStats("demo", 0, 0, 0, 0, [])
    after = rqueue.QueueStats("demo", 10, 3, 0, 1, [group])
    problems = demo_problems(before, after, messages=10, published=10)
    assert problems == [
        "group 'workers' ack floor 7 != last seq 10",
        "queue depth 3 != 0",
        "dead letters grew by 1 (now 1), expected 3",
    ]


# -- stats and queues ------------------------------------------------------------


def test_stats_table(backend, prefix, prepared):
    result = run("--url", backend, "--prefix", prefix, "stats", "orders")
    assert result.exit_code == 0, result.output
    assert "queue orders: depth 3, last seq 5, delayed 0, dead letters 1" in result.stdout
    groups_part, members_part = result.stdout.split("\n\n")
    row = table_rows(groups_part, "group")["billing"]
    assert row.pop("oldest_lease_s") != "-"  # seq 3 is leased
    assert row == {
        "group": "billing",
        "floor": "2",
        "cursor": "3",
        "pending": "3",
        "in_flight": "1",
        "ready": "0",
        "delayed": "0",
        "acked": "1",
        "redelivered": "0",
        "dead_lettered": "1",
        "dropped": "0",
        "consumers": "1",
        "paused": "no",
        "keys_ready": "0",
        "keys_busy": "0",
    }
    member = table_rows(members_part, "group")["billing"]
    assert (member["consumer"], member["held"]) == ("w1", "1")


def test_stats_json(backend, prefix, prepared):
    result = run("--url", backend, "--prefix", prefix, "stats", "orders", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["name"], data["last_seq"], data["depth"], data["scheduled"], data["dead_letters"]) == (
        "orders",
        5,
        3,
        0,
        1,
    )
    [group] = data["groups"]
    assert group["name"] == "billing"
    assert (group["ack_floor"], group["cursor"], group["in_flight"], group["acked"], group["dead_lettered"]) == (
        2,
        3,
        1,
        1,
        1,
    )
    assert [c["name"] for c in group["consumers"]] == ["w1"] and group["consumers"][0]["held"] == 1


def test_queues_table_and_json(backend, prefix, prepared):
    prepared.client.queue("invoices").publish(b"x")
    text = run("--url", backend, "--prefix", prefix, "queues")
    assert text.exit_code == 0, text.output
    assert table_rows(text.stdout, "queue") == {
        "DLQ.orders": {
            "queue": "DLQ.orders",
            "groups": "0",
            "depth": "1",
            "in flight": "0",
            "delayed": "0",
            "dead letters": "0",
            "consumers": "0",
        },
        "invoices": {
            "queue": "invoices",
            "groups": "0",
            "depth": "1",
            "in flight": "0",
            "delayed": "0",
            "dead letters": "0",
            "consumers": "0",
        },
        "orders": {
            "queue": "orders",
            "groups": "1",
            "depth": "3",
            "in flight": "1",
            "delayed": "0",
            "dead letters": "1",
            "consumers": "1",
        },
    }
    assert len({len(line) for line in text.stdout.splitlines()}) == 1  # aligned: every line ends in the same column
    data = json.loads(run("--url", backend, "--prefix", prefix, "queues", "--json").stdout)
    assert data == {
        "queues": [
            {
                "name": "DLQ.orders",
                "groups": 0,
                "depth": 1,
                "in_flight": 0,
                "delayed": 0,
                "dead_letters": 0,
                "consumers": 0,
            },
            {
                "name": "invoices",
                "groups": 0,
                "depth": 1,
                "in_flight": 0,
                "delayed": 0,
                "dead_letters": 0,
                "consumers": 0,
            },
            {
                "name": "orders",
                "groups": 1,
                "depth": 3,
                "in_flight": 1,
                "delayed": 0,
                "dead_letters": 1,
                "consumers": 1,
            },
        ]
    }


def test_queues_of_an_empty_prefix(backend, prefix):
    assert run("--url", backend, "--prefix", prefix, "queues", "--json").stdout.strip() == '{\n  "queues": []\n}'
    assert run("--url", backend, "--prefix", prefix, "queues").stdout.strip() == "(no queues)"


def test_queues_lists_a_queue_it_cannot_read_with_a_warning(backend, prefix, prepared):
    # given, beside readable queues, names stored by older versions or other clients that this one refuses
    # (one whose dead-letter queue's name would be too long, one with a space) and a queue whose stored
    # settings are out of range
    client = prepared.client
    long_name = "q" * 199
    client.redis.sadd(registry_key(prefix), long_name, "bad name")
    client.queue("invoices").publish(b"x")
    client.redis.hset(settings_key(prefix), "invoices dedup_window", "1e14")
    # when the queues are listed
    text = run("--url", backend, "--prefix", prefix, "queues")
    # then the command succeeds and lists every queue, those it cannot read without figures
    assert text.exit_code == 0, text.output
    rows = table_rows(text.stdout, "queue")
    assert sorted(rows) == sorted(["DLQ.orders", "orders", "invoices", long_name, "'bad name'"])
    assert rows["orders"]["depth"] == "3"
    for bad in (long_name, "'bad name'", "invoices"):
        assert set(rows[bad].values()) == {bad, "-"}
    # and a warning on stderr says why for each
    warnings = [line for line in text.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 3
    assert any(w.startswith(f"warning: queue {long_name} cannot be read: invalid queue name") for w in warnings)
    assert any("'bad name' cannot be read" in w and "contains ' '" in w for w in warnings)
    assert any("queue invoices cannot be read: invalid setting dedup_window" in w for w in warnings)
    # and the JSON marks them with their error and null figures
    data = json.loads(run("--url", backend, "--prefix", prefix, "queues", "--json").stdout)
    by_name = {q["name"]: q for q in data["queues"]}
    assert "error" not in by_name["orders"]
    assert by_name["bad name"]["depth"] is None and "contains ' '" in by_name["bad name"]["error"]
    assert "over the limit of 200" in by_name[long_name]["error"]
    assert by_name["invoices"]["error"].startswith("invalid setting dedup_window")


def test_queues_lists_a_stored_name_that_is_not_utf8(backend, prefix, prepared):
    # given a name in the list of queues that is not UTF-8 (written by another client)
    prepared.client.redis.sadd(registry_key(prefix), b"\xffbad")
    # when the queues are listed
    text = run("--url", backend, "--prefix", prefix, "queues")
    # then the others are listed with their figures, and that one with a warning naming its bad byte
    assert text.exit_code == 0, text.output
    rows = table_rows(text.stdout, "queue")
    assert rows["orders"]["depth"] == "3"
    assert set(rows["'\\udcffbad'"].values()) == {"'\\udcffbad'", "-"}
    assert "a lone surrogate" in text.stderr


def test_table_aligns_numbers_right_and_text_left():
    assert table(["name", "n"], [["a", 1], ["long", 100]]).splitlines() == [
        "name    n",
        "a       1",
        "long  100",
    ]


# -- errors --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bad name", "a{b}", ""])
def test_invalid_queue_name_is_bad_input(backend, prefix, name):
    result = run("--url", backend, "--prefix", prefix, "stats", name)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: invalid queue name ")
    assert repr(name) in result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


def test_invalid_url_is_bad_input():
    result = run("--url", "http://example.com", "queues")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: invalid URL http://example.com")


def test_unreachable_url_is_an_error_without_traceback():
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = run("--url", url, "queues")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot use {url}")
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_url_comes_from_rqueue_url(backend, prefix, prepared):
    result = run("--prefix", prefix, "stats", "orders", "--json", env={"RQUEUE_URL": backend})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["depth"] == 3


# -- the console script with its own embedded server ---------------------------------------


def test_console_script_demo_starts_its_own_server():
    script = Path(sys.executable).with_name("rqueue")
    command = [str(script)] if script.exists() else [shutil.which("rqueue") or "rqueue"]
    env = {k: v for k, v in os.environ.items() if k != "RQUEUE_URL"}
    proc = subprocess.run(
        [*command, "demo", "--messages", "200", "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert (report["published"], report["consumed"], report["dead_lettered"]) == (200, 200, 3)
    assert report["redelivered"] >= 2
    assert report["stats"]["groups"][0]["ack_floor"] == report["stats"]["last_seq"] == 200
    assert report["stats"]["depth"] == 0 and report["stats"]["dead_letters"] == 3


def test_labelled_bars_draw_on_a_terminal_only_and_never_for_json(monkeypatch, capsys):
    # given work reported as (label, done, total), as the doctor's checks and the migration's levels are
    from rqueue.cli.common import LabelledBars

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    # when it is reported on a terminal, then a bar per label is drawn on stderr, stdout untouched
    bars = LabelledBars(min_total=10)
    bars("checking leases", 5, 50)
    bars("checking leases", 50, 50)
    bars("short", 1, 3)  # below min_total: no bar
    bars.close()
    out, err = capsys.readouterr()
    assert out == "" and "checking leases" in err and "short" not in err
    # and with --json (quiet) nothing is drawn
    quiet = LabelledBars(quiet=True)
    quiet("checking leases", 50, 50)
    quiet.close()
    assert capsys.readouterr() == ("", "")
