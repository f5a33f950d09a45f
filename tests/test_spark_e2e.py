"""End to end, exactly once, through format("rqueue") both ways: JSON files
-> the rqueue writer -> queue "raw" -> the rqueue source (group "spark") ->
a transformation -> the rqueue writer -> queue "out", on local[2,4], with
a task failing once in each direction and the driver killed (SIGKILL)
while batches run, then restarted from its checkpoints. The driver is
tests/support/spark_pipeline_driver.py, in a process of its own.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.servers import IN_CI, start_server

try:
    import pyspark  # noqa: F401
except ImportError:
    if IN_CI:
        raise ImportError("CI must run the Spark tests: install the spark extra") from None
    pytest.skip("pyspark is not installed (pip install -e '.[spark]')", allow_module_level=True)
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    if IN_CI:
        raise RuntimeError("CI must run the Spark tests: Java 17 is missing")
    pytest.skip("Spark needs Java 17 (java on PATH or JAVA_HOME)", allow_module_level=True)

import rqueue  # noqa: E402

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).parent / "support" / "spark_pipeline_driver.py"
FILES, PER_FILE = 3, 12
EVENTS = FILES * PER_FILE


def write_file(inbox: Path, n: int) -> None:
    lines = [json.dumps({"event_id": i, "user": f"u{i % 5}"}) for i in range(n * PER_FILE, (n + 1) * PER_FILE)]
    tmp = inbox.parent / f".events-{n}.json"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(inbox / f"events-{n}.json")  # the file source must never see a half-written file


def start_driver(url: str, prefix: str, work: Path, log: Path) -> subprocess.Popen:
    # A session of its own: the driver, its JVM and its Python workers are one process group.
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), url, prefix, str(work), str(EVENTS)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended by itself
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def all_payloads(client: rqueue.Client, name: str) -> collections.Counter:
    """Every payload stored in ``name`` (a queue without groups keeps them all)."""
    return collections.Counter(m.data for m in client.queue(name).peek(10_000))


def test_files_to_queue_to_queue_exactly_once_through_a_driver_kill_and_task_failures(tmp_path):
    server = start_server("redis")
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    client = rqueue.connect(server.url, prefix=prefix)
    work, log = tmp_path, tmp_path / "driver.log"
    (work / "in").mkdir()
    for n in range(FILES):
        write_file(work / "in", n)
    proc = start_driver(server.url, prefix, work, log)
    try:
        # given the pipeline running, with batches going through both legs
        deadline = time.monotonic() + 300
        while client.queue("out").stats().last_seq < 5:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no batch reached 'out' in time:\n" + log.read_text()[-3000:]
            time.sleep(0.05)
        # when the driver is killed while batches run (not everything has arrived yet), and started again
        assert client.queue("out").stats().last_seq < EVENTS
        kill_group(proc)
        proc = start_driver(server.url, prefix, work, log)
        assert proc.wait(300) == 0, log.read_text()[-3000:]
    finally:
        kill_group(proc)
    # then both injected failures happened (Spark tried those tasks again) ...
    assert (work / "sink-failed").exists() and (work / "source-failed").exists()
    # ... and every event arrived in "out" exactly once, shaped by the second leg
    assert all_payloads(client, "out") == collections.Counter(f"{i}:U{i % 5}".encode() for i in range(EVENTS))
    assert client.queue("out").stats().last_seq == EVENTS
    # and "raw" (2 partitions) stored each event once; its group "spark" settled every batch Spark committed
    # (the offsets of the last batch are committed when the next one starts), and their records are gone
    raw = client.queue("raw")
    assert sum(part.stats().last_seq for part in raw.parts) == EVENTS
    floors = [part.stats().groups[0].ack_floor for part in raw.parts]
    assert sum(floors) >= EVENTS - 2 * 10, floors
    assert sum(part.stats().depth for part in raw.parts) == EVENTS - sum(floors)
    client.close()
    server.stop()
