"""What a newcomer meets first on the command line: a missing URL, a handler
module that does not import, unknown queues, one word for delayed
messages, JSON types and readable times, progress only where a person
watches, stdin, configure's messages, refused limits, a missing password,
the worker's dead-letter log line and memory:// without its extra."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from support.servers import start_server, wait_for

import rqueue
from rqueue.cli import cli
from rqueue.cli.common import progress

RQUEUE = str(Path(sys.executable).parent / "rqueue")
NO_URL = {"RQUEUE_URL": None}  # CliRunner unsets a variable given as None


@pytest.fixture
def url() -> str:
    """A memory:// server of this test's own."""
    return f"memory://{uuid.uuid4().hex}"


def run(url: str | None, *args: str, input: str | None = None) -> Result:
    head = ["--url", url] if url else []
    return CliRunner().invoke(cli, [*head, *args], input=input, env=NO_URL)


# -- a URL is needed by every command but demo and bench -----------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["publish", "orders", "hello"],
        ["publish", "orders"],  # before reading stdin
        ["configure", "orders", "--ack-wait", "5"],
        ["purge", "orders", "--yes"],
        ["worker", "nosuchmodule:handle", "-q", "orders", "-g", "g"],
        ["queues"],
        ["stats", "orders"],
        ["dlq", "list", "orders"],
        ["events", "orders"],
        ["create", "orders", "--partitions", "2"],
        ["scripts", "list"],
    ],
)
def test_a_command_without_a_url_exits_2_saying_it_needs_one(command):
    # when a command that keeps or reads data runs without --url or RQUEUE_URL
    result = run(None, *command, input="never read\n")
    # then it says a URL is needed, with exit code 2, and starts no server
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: this command needs a Redis URL: give --url")
    assert "rqueue demo" in result.stderr and "private server" not in result.stdout
    assert result.stdout == ""


# -- rqueue worker with a module that fails to import ---------------------------------------


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ("def handle(d):\n    return (\n", "SyntaxError"),
        ("raise RuntimeError('no DATABASE_URL')\n", "RuntimeError: no DATABASE_URL"),
        ("import os\nhandle = os.environ['RQUEUE_NO_SUCH_VARIABLE']\n", "KeyError"),
    ],
)
def test_worker_handler_module_that_raises_at_import_is_one_line_and_exit_2(url, tmp_path, monkeypatch, source, named):
    # given a handler module whose own code fails when imported
    module = f"broken_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    # when the worker is started with it
    result = run(url, "worker", f"{module}:handle", "-q", "orders", "-g", "g")
    # then one line names the module and the error, with exit code 2
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert result.stderr.startswith(f"error: handler '{module}:handle': importing '{module}' raised ")
    assert named in result.stderr


# -- unknown queues are exit code 3 everywhere ------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["dlq", "list", "ghost"],
        ["dlq", "show", "ghost", "1"],
        ["dlq", "replay", "ghost"],
        ["dlq", "purge", "ghost", "--yes"],
        ["events", "ghost"],
        ["events", "ghost", "--follow", "--seconds", "0"],
    ],
)
def test_unknown_queue_is_exit_code_3_for_dead_letters_and_events(url, command):
    rqueue.connect(url).queue("orders").publish(b"x")  # a queue exists, not this one
    result = run(url, *command)
    assert result.exit_code == 3, result.output
    assert "queue 'ghost' does not exist" in result.stderr and result.stdout == ""


# -- one word for delayed messages ------------------------------------------------------------------


def test_a_delayed_publish_is_delayed_in_stats_queues_and_top(url):
    # given a message published with --delay 60 and a group that has not read it
    client = rqueue.connect(url)
    client.queue("orders").consumer("g").close()
    assert run(url, "publish", "orders", "later", "--delay", "60").exit_code == 0
    # then stats, queues and top all call it delayed, and count it
    stats = run(url, "stats", "orders").stdout
    assert "delayed 1" in stats.splitlines()[0] and "scheduled" not in stats
    [row] = json.loads(run(url, "queues", "--json").stdout)["queues"]
    assert row["delayed"] == 1
    for command in (["queues"], ["top", "--once"]):
        lines = run(url, *command).stdout.splitlines()
        header = re.split(r"\s{2,}", lines[0])
        cells = re.split(r"\s{2,}", lines[1])
        assert cells[header.index("delayed")] == "1", lines


def test_queues_counts_a_delayed_redelivery_too(url):
    # given a message nacked with a delay of 60 s
    q = rqueue.connect(url).queue("orders")
    q.publish(b"x")
    [d] = q.consumer("g").fetch(1)
    d.nack(delay=60)
    # then queues counts it as delayed
    [row] = json.loads(run(url, "queues", "--json").stdout)["queues"]
    assert row["delayed"] == 1


# -- JSON types and readable times ------------------------------------------------------------------


@pytest.fixture
def dead(url):
    """orders: seq 1 rejected by group g."""
    q = rqueue.connect(url).queue("orders")
    q.publish(b"one")
    [d] = q.consumer("g").fetch(1)
    d.reject(reason="bad")
    return q


def test_events_json_has_ints_and_the_table_a_readable_time(url, dead):
    [e] = json.loads(run(url, "events", "orders", "--json").stdout)["events"]
    assert (e["event"], e["seq"], e["dlq_seq"]) == ("dead-lettered", 1, 1)
    assert isinstance(e["at"], int) and abs(e["at"] / 1000 - time.time()) < 3600
    [listed] = json.loads(run(url, "dlq", "list", "orders", "--json").stdout)["dead_letters"]
    assert isinstance(listed["dead_lettered_ms"], int) and listed["seq"] == e["seq"]
    text = run(url, "events", "orders").stdout
    assert re.search(r"rejected  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} ", text), text


def test_dlq_show_prints_times_as_clock_times_without_a_partition_line(url, dead):
    text = run(url, "dlq", "show", "orders", "1").stdout
    assert "partition" not in text and "_ms" not in text
    assert re.search(r"dead_lettered: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", text), text
    assert re.search(r"reason: rejected", text)


# -- progress only on a terminal, never with --json ----------------------------------------


def test_no_progress_words_without_a_terminal_or_with_json(url, dead):
    # stdin, stdout and stderr of CliRunner are not terminals
    for command in (
        ["publish", "orders", "--json"],
        ["publish", "orders"],
        ["dlq", "replay", "orders", "--json"],
        ["dlq", "purge", "orders", "--yes"],
        ["purge", "orders", "--yes", "--json"],
    ):
        result = run(url, *command, input="a\nb\n")
        assert result.exit_code == 0, (command, result.output)
        assert result.stderr == "", (command, result.stderr)


def test_progress_is_a_bar_on_a_terminal_unless_quiet(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with progress(3, "working") as bar:
        assert type(bar).__name__ == "ProgressBar"
    with progress(3, "working", quiet=True) as bar:
        assert type(bar).__name__ == "_NoBar"
        bar.update(3)


# -- publishing from stdin ---------------------------------------------------------------------------


def test_empty_stdin_says_no_messages(url):
    result = run(url, "publish", "orders", input="")
    assert result.exit_code == 0
    assert result.stdout == "no messages: stdin was empty, nothing published to orders\n"
    data = json.loads(run(url, "publish", "orders", "--json", input="").stdout)
    assert data == {"published": 0, "duplicates": 0, "first_seq": None, "last_seq": None}


def test_publish_on_a_terminal_says_it_reads_stdin(tmp_path):
    # given `rqueue publish orders` with a terminal as stdin
    primary, secondary = os.openpty()
    env = {k: v for k, v in os.environ.items() if k != "RQUEUE_URL"}
    proc = subprocess.Popen(
        [RQUEUE, "--url", f"memory://{uuid.uuid4().hex}", "publish", "orders"],
        stdin=secondary,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    os.close(secondary)
    try:
        # when a line and end-of-input are typed
        os.write(primary, b"typed\n\x04")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(primary)
    # then it said where it reads from, and published the line
    assert "reading messages for orders from stdin, one per line; end with Ctrl-D" in err
    assert proc.returncode == 0, err
    assert out.startswith("published 1 message(s) to orders")


# -- configure ----------------------------------------------------------------------------------------


def test_configure_messages(url):
    done = run(url, "configure", "orders", "--max-payload", "2048")
    assert done.stdout == "configured orders: set max_payload=2048\n"
    unset = run(url, "configure", "orders", "--unset", "max_payload")
    assert unset.exit_code == 0 and unset.stdout == "configured orders: unset max_payload\n"
    both = run(url, "configure", "orders", "--ack-wait", "5", "--unset", "max-payload", "--json")
    assert json.loads(both.stdout) == {"pattern": "orders", "set": {"ack_wait": 5.0}, "unset": ["max_payload"]}
    bad = run(url, "configure", "orders", "--unset", "nosuch")
    assert bad.exit_code == 2
    assert bad.stderr.startswith("error: --unset nosuch: no such setting; settings are ack_wait, alternate,")
    assert "None" not in bad.stderr


@pytest.mark.parametrize("option", ["--wait-in-redis", "--results"])
def test_a_true_or_false_setting_takes_true_or_false_and_names_any_other_value(url, option):
    # when a true-or-false setting is given a number or a word that is neither
    for bad in ("-1", "2", "maybe"):
        result = run(url, "configure", "orders", option, bad)
        # then the option and the value are named as not true or false, and nothing is stored
        assert result.exit_code == 2
        assert f"Invalid value for '{option}': '{bad}' is not a valid boolean" in result.stderr
    assert rqueue.connect(url).settings.resolve("orders")[1] == {}
    # when it is given true, then that is stored
    done = run(url, "configure", "orders", option, "true")
    assert done.exit_code == 0, done.stderr
    name = option[2:].replace("-", "_")
    assert rqueue.connect(url).settings.resolve("orders")[0].as_dict()[name] is True


def test_max_payload_beyond_what_redis_takes_is_refused(url):
    # when a max_payload over 500 MiB is configured
    result = run(url, "configure", "orders", "--max-payload", "999999999999")
    # then it is refused, naming the setting and the limit, and nothing is stored
    assert result.exit_code == 2
    assert result.stderr.startswith("error: invalid setting max_payload=999999999999: is over 524288000 bytes")
    assert "proto-max-bulk-len" in result.stderr
    client = rqueue.connect(url)
    assert client.settings.resolve("orders")[1] == {}
    with pytest.raises(rqueue.InvalidSetting):
        client.configure("orders", max_payload=500 * 1024 * 1024 + 1)
    client.configure("orders", max_payload=500 * 1024 * 1024)


# -- a missing password ---------------------------------------------------------------------------------


def test_a_missing_password_is_named():
    # given a server that wants a password
    server = start_server("redis")
    admin = redis.Redis.from_url(server.url)
    try:
        admin.config_set("requirepass", "s3cret-pw")
        # when the URL gives none, then the error says so
        result = run(server.url, "queues")
        assert result.exit_code == 1
        assert "the server needs a password and the URL gives none" in result.stderr
        # when it gives a wrong one, then the error says that instead
        wrong = run(server.url.replace("redis://", "redis://:wrong-pw@"), "queues")
        assert wrong.exit_code == 1 and "refused the URL's user name and password" in wrong.stderr
        assert "wrong-pw" not in wrong.stderr
    finally:
        admin.close()
        server.stop()


# -- the worker logs a dead letter --------------------------------------------------------------------


def test_worker_logs_each_dead_letter(url, caplog):
    # given a queue whose messages get one delivery, one failing and one rejected
    client = rqueue.connect(url)
    client.configure("orders", max_deliveries=1)
    q = client.queue("orders")
    q.publish_many([b"fail", b"reject"])

    def handle(d: rqueue.Delivery) -> None:
        if d.data == b"reject":
            raise rqueue.Reject("not wanted")
        raise ValueError("broken")

    # when a worker runs them
    caplog.set_level(logging.WARNING, logger="rqueue.worker")
    w = rqueue.Worker(q, "g", handle, concurrency=1)
    w.start()
    try:
        wait_for(lambda: q.stats().dead_letters == 2, timeout=30)
        wait_for(lambda: len([r for r in caplog.records if "dead-lettered" in r.getMessage()]) == 2, timeout=10)
    finally:
        w.stop()
    # then each dead letter was logged with why
    lines = sorted(r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage())
    assert lines[0].startswith("dead-lettered 1.1.")
    assert "reached max_deliveries; last error: ValueError: broken" in lines[0]
    assert lines[1].startswith("dead-lettered 2.1.") and "rejected by the handler: not wanted" in lines[1]


# -- memory:// without its extra ---------------------------------------------------------------------


def test_memory_url_without_the_extra_names_it_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "fakeredis", None)  # import fails as when not installed
    with pytest.raises(rqueue.InvalidURL) as exc:
        rqueue.connect("memory://x")
    assert str(exc.value).count("invalid URL") == 1
    assert str(exc.value) == (
        "invalid URL memory://x: memory:// needs the memory extra (fakeredis with Lua): pip install 'rqueue[memory]'"
    )


# -- the demo on its embedded server ------------------------------------------------------------------


def test_demo_reads_nothing_from_its_server_after_stopping_it(monkeypatch):
    # given clients that re-read settings on every use (as they do once the
    # cached ones are a second old, on a slow machine)
    connect = rqueue.connect
    monkeypatch.setattr(rqueue, "connect", lambda url, **kw: connect(url, **{**kw, "settings_ttl": 0}))
    # when the demo runs on its own embedded server
    result = run(None, "demo", "--messages", "200")
    # then its report needs nothing from the server it stopped
    assert result.exit_code == 0, result.output
    assert "dead-lettered 3 into DLQ.demo" in result.stdout
    assert result.stdout.endswith("ok: every message acked or dead-lettered\n")


# -- --no-scheduler and --allow-eviction --------------------------------------------------


@pytest.mark.parametrize(("flag", "expected"), [([], True), (["--no-scheduler"], False), (["--scheduler"], True)])
def test_worker_runs_the_scheduler_unless_told_not_to(url, monkeypatch, flag, expected):
    # given a worker command whose worker records what it was made with
    made = {}

    class Recorded:
        def run(self):
            return rqueue.WorkerStats()

    def worker_for(q, group, fn, **options):
        made.update(options)
        return Recorded()

    # (the package's attribute `worker` is the command: the module is taken from sys.modules)
    monkeypatch.setattr(sys.modules["rqueue.cli.worker"], "worker_for", worker_for)
    # when it runs with or without --no-scheduler
    result = run(url, "worker", "cli_handlers:handle", "-q", "orders", "-g", "g", *flag)
    # then the worker runs the scheduler by default and not with --no-scheduler
    assert result.exit_code == 0, result.output
    assert made["scheduler"] is expected


def test_a_server_that_may_evict_is_refused_unless_allow_eviction(prefix):
    # given a server whose maxmemory-policy may evict keys
    server = start_server("redis", extra_args=["--maxmemory-policy", "allkeys-lru"])
    try:
        # when a command connects to it
        refused = run(server.url, "--prefix", prefix, "queues")
        # then it exits 1 naming the policy and the way out, and with --allow-eviction it works
        assert refused.exit_code == 1
        assert "maxmemory-policy allkeys-lru" in refused.output and "allow_eviction" in refused.output
        allowed = CliRunner().invoke(cli, ["--url", server.url, "--prefix", prefix, "--allow-eviction", "queues"])
        assert allowed.exit_code == 0, allowed.output
    finally:
        server.stop()
