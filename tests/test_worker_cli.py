"""`rqueue worker MODULE:FUNCTION` as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def start_worker(server, prefix, *options):
    """`rqueue worker cli_handlers:handle -q orders -g g` as a child process."""
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
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )


@pytest.mark.parametrize("partitions", [None, 3], ids=["plain", "partitioned"])
def test_worker_command_processes_and_stops_cleanly_on_sigterm(server, prefix, partitions):
    # given a queue (plain, or of 3 partitions) with a poison message among others
    client = rqueue.connect(server.url, prefix=prefix)
    q = client.queue("orders", partitions=partitions)
    q.publish_many([b"a", b"poison", b"c", b"d", b"e", b"f"])
    proc = start_worker(server, prefix, "-c", "2")
    try:
        # when the worker runs, then every message (in every partition) is settled
        wait_for(lambda: q.stats().groups and q.stats().group("g").ack_floor == 6, timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    # and SIGTERM stops it cleanly, leaving the group (in every partition)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert err.count(b"left orders/g") == (partitions or 1)
    s = q.stats()
    assert (s.dead_letters, s.group("g").consumers) == (1, [])
    client.close()


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
