"""`rqueue worker MODULE:FUNCTION` as a real process: processing, stopping
(also at once while Redis is unreachable), and its metrics (also while
Redis is unreachable)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.servers import start_server, wait_for

import rqueue
from rqueue.cli import cli

HERE = Path(__file__).resolve().parent
RQUEUE = str(Path(sys.executable).parent / "rqueue")


@pytest.fixture(scope="module")
def server():
    s = start_server("redis")
    yield s
    s.stop()


def start_worker(server, prefix, *options, handler="cli_handlers:handle"):
    """`rqueue worker cli_handlers:handle -q orders -g g` as a child process."""
    return subprocess.Popen(
        [
            RQUEUE,
            "--url",
            server.url,
            "--prefix",
            prefix,
            "worker",
            handler,
            "-q",
            "orders",
            "-g",
            "g",
            *options,
        ],
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # The caller's PYTHONPATH too: a checkout run that way imports its own rqueue.
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)},
    )


@pytest.mark.parametrize(
    "partitions, handler, options",
    [
        (None, "cli_handlers:handle", ()),
        (3, "cli_handlers:handle", ()),
        (None, "cli_handlers:handle_all", ("--batch", "4")),
        (None, "cli_handlers:handle_pairs", ()),
    ],
    ids=["plain", "partitioned", "batch-option", "batch-decorated"],
)
def test_worker_command_processes_and_stops_cleanly_on_sigterm(server, prefix, partitions, handler, options):
    # given a queue (plain, or of 3 partitions) with a poison message among
    # others, and a handler (or a batch handler, by option or decorator)
    client = rqueue.connect(server.url, prefix=prefix)
    q = client.queue("orders", partitions=partitions)
    q.publish_many([b"a", b"poison", b"c", b"d", b"e", b"f"])
    proc = start_worker(server, prefix, "-c", "2", *options, handler=handler)
    try:
        # when the worker runs, then every message (in every partition) is settled
        wait_for(lambda: q.stats().groups and q.stats().group("g").ack_floor == 6, timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    # and SIGTERM stops it cleanly, leaving the group (in every partition)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert err.count(b"left orders/g") == 1  # one worker, also for every partition
    s = q.stats()
    assert (s.dead_letters, s.group("g").consumers) == (1, [])
    client.close()


def test_worker_command_refuses_a_batch_handler_in_processes(prefix, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    url = f"memory://{prefix}"
    for args in (
        ["cli_handlers:handle_all", "--batch", "4", "--processes"],
        ["cli_handlers:handle_pairs", "--processes"],
    ):
        result = CliRunner().invoke(cli, ["--url", url, "worker", *args, "-q", "orders", "-g", "g"])
        assert result.exit_code == 2, result.output
        assert "--processes" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon", "module.path:function"),
        ("no_such_module_xyz:handle", "cannot import"),
        ("cli_handlers:missing", "no callable 'missing'"),
        ("cli_handlers:NOT_CALLABLE", "no callable 'NOT_CALLABLE'"),
    ],
)
def test_worker_command_rejects_a_bad_handler(backend, prefix, spec, message, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    result = CliRunner().invoke(cli, ["--url", backend, "--prefix", prefix, "worker", spec, "-q", "orders", "-g", "g"])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_worker_serves_prometheus_metrics(server, prefix):
    import urllib.request

    from rqueue.embedded import free_port

    client = rqueue.connect(server.url, prefix=prefix)
    q = client.queue("orders")
    q.publish_many([b"a", b"b"])
    port = free_port()
    proc = start_worker(server, prefix, "--metrics-port", str(port))

    def scrape():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            return ""

    try:
        text = wait_for(
            lambda: (t := scrape()) and 'rqueue_acked_total{group="g",queue="orders"} 2.0' in t and t, timeout=30
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert 'rqueue_group_ack_floor{group="g",queue="orders"} 2.0' in text
    assert "rqueue_handler_seconds_bucket" in text
    client.close()


# -- Redis gone: stopping and metrics -------------------------------------------------


def _start_logged_worker(server, prefix, log_path, *options):
    """As start_worker, with the worker's log in ``log_path``."""
    with open(log_path, "wb") as err:
        return subprocess.Popen(
            [
                RQUEUE,
                "--url",
                server.url,
                "--prefix",
                prefix,
                "worker",
                "cli_handlers:handle",
                "-q",
                "orders",
                "-g",
                "g",
                *options,
            ],
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=err,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
            },
        )


def _gone(server, how: str) -> None:
    """ "down" kills ``server``; "silent" pauses it (SIGSTOP): connections
    are accepted and never answered."""
    if how == "down":
        server.kill()
    else:
        os.kill(server.process.pid, signal.SIGSTOP)


def _back(server, how: str) -> None:
    if how == "silent" and server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)


@pytest.mark.parametrize("how", ["down", "silent"])
def test_a_second_sigterm_exits_at_once_while_redis_is_unreachable(prefix, tmp_path, how):
    # Given a worker (grace period 2 s) whose Redis went away while it worked:
    # down (its calls are refused, and it retries them) or silent (its call
    # waits for a reply)
    server = start_server("redis")
    proc = None
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        q = client.queue("orders")
        q.publish_many([b"a", b"b"])
        log_path = tmp_path / "worker.log"
        proc = _start_logged_worker(server, prefix, log_path, "--grace-period", "2")
        wait_for(lambda: q.stats().groups and q.stats().group("g").ack_floor == 2, timeout=30)
        client.close()
        gone = time.monotonic()
        _gone(server, how)
        if how == "down":
            wait_for(lambda: "retrying" in log_path.read_text())
        else:  # its next idle poll is under way
            wait_for(lambda: time.monotonic() > gone + 1.0)
        # When it gets SIGTERM, and a second SIGTERM
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "SIGTERM: finishing running handlers" in log_path.read_text())
        second = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Then it exits at once, saying why (Redis stayed unreachable: exit code 1)
        proc.wait(30)
        took = time.monotonic() - second
        log = log_path.read_text()
        assert "second SIGTERM: stopping at once" in log
        assert proc.returncode == 1, log[-2000:]
        assert "Redis stayed unreachable" in log
        assert took < 2.0, took
        print(f"Redis {how}: second SIGTERM -> exit in {took:.2f} s")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        _back(server, how)
        server.stop()


def test_metrics_are_served_while_redis_is_unreachable(prefix, tmp_path):
    import urllib.request

    from rqueue.embedded import free_port

    # Given a worker serving metrics that has acked two messages
    server = start_server("redis")
    proc = None
    try:
        client = rqueue.connect(server.url, prefix=prefix)
        q = client.queue("orders")
        q.publish_many([b"a", b"b"])
        port = free_port()
        proc = _start_logged_worker(server, prefix, tmp_path / "worker.log", "--metrics-port", str(port))
        labels = 'group="g",queue="orders"'

        def scrape():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                return ""

        wait_for(lambda: f"rqueue_acked_total{{{labels}}} 2.0" in scrape(), timeout=30)
        for how in ("silent", "down"):
            # When Redis does not answer (paused), or is down
            _gone(server, how)
            try:
                started = time.monotonic()
                text = scrape()
                took = time.monotonic() - started
            finally:
                _back(server, how)
            # Then the scrape still answers, in time, with the worker's
            # counters, says that the queue gauges could not be read, and
            # leaves them out
            assert f"rqueue_acked_total{{{labels}}} 2.0" in text, how
            assert f"rqueue_queue_stats_up{{{labels}}} 0.0" in text, how
            assert "rqueue_group_ack_floor{" not in text and "rqueue_queue_depth{" not in text, how
            assert took < 4.0, (how, took)
            if how == "silent":
                # and once Redis answers again, so do the gauges
                text = wait_for(lambda: (t := scrape()) and f"rqueue_queue_stats_up{{{labels}}} 1.0" in t and t)
                assert f"rqueue_group_ack_floor{{{labels}}} 2.0" in text
        assert "queue gauges of orders/g could not be read" in (tmp_path / "worker.log").read_text()
        client.close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()
