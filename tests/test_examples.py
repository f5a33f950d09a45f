"""The examples run as their READMEs say: examples/basic's commands one
after the other against the redis-server its README starts (on a free
port here), and the Spark pipeline against a private server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.blocks import Session, code_blocks
from support.servers import start_server

import rqueue
from rqueue.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
BASIC = ROOT / "examples" / "basic"
README_PORT = "6399"  # the port examples/basic/README.md gives its throw-away server


def test_basic_example_runs_as_its_readme_says():
    # given a reader's terminals in examples/basic, the README's port made free
    port = str(free_port())
    url = f"redis://localhost:{port}/0"
    env = {k: v for k, v in os.environ.items() if k != "RQUEUE_URL"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    session = Session(cwd=BASIC, env=env, url=url)
    blocks = code_blocks((BASIC / "README.md").read_text())
    assert [b.lang for b in blocks] == ["bash", "bash", "bash"]
    try:
        # when its commands run in order (server, producer and worker, stats and dead letters)
        for block in blocks:
            session.shell(block.code.replace(README_PORT, port))
        session.settle()
        with rqueue.connect(url) as client:
            # then every order was handled: 18 charged, 2 rejected into DLQ.orders
            stats = client.queue("orders").stats()
            assert (stats.last_seq, stats.group("billing").ack_floor, stats.dead_letters) == (20, 20, 2)
            assert {d.seq: d.reason for d in client.queue("orders").dead_letters()} == {10: "rejected", 20: "rejected"}
    finally:
        ended = session.close()
    by_command = {r.command.split()[0] + " " + r.command.split()[1]: r for r in session.ran}
    assert by_command["python producer.py"].stdout == "published 20 orders (0 already there)\n"
    assert "billing" in by_command["rqueue stats"].stdout
    assert "negative amount" in by_command["rqueue dlq"].stdout
    # and the worker, stopped as Ctrl-C would, logged each order and each dead letter
    worker, server = ended
    assert worker.command.startswith("rqueue worker") and worker.returncode == 0, worker.stderr
    assert worker.stderr.count(": charged ") == 18
    assert worker.stderr.count("dead-lettered ") == 2
    assert server.command.startswith("redis-server") and server.returncode == 0
    assert not (BASIC / "dump.rdb").exists()


@pytest.mark.slow
def test_spark_pipeline_runs_exactly_once():
    # given a private server
    server = start_server("redis")
    try:
        # when the pipeline runs (small: the Spark session's start is most of its time)
        proc = subprocess.run(
            [sys.executable, "examples/spark_pipeline/pipeline.py", "--url", server.url]
            + ["--files", "2", "--per-file", "20"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.stop()
    # then every order arrived exactly once, also after the replayed batch
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("every order arrived exactly once")
