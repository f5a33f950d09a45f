"""A chaos run on loopback: producer and worker processes against a private
Redis with AOF (appendfsync always), while a nemesis kills workers with
SIGKILL, kills every client connection (CLIENT KILL), kills and restarts
Redis (keeping its AOF), pauses workers with SIGSTOP (for up to 7 s, longer
than the lease, most of them right as the worker's handlers start on a
fetched batch), kills Redis and starts it again without its data (the
settings are applied again at once, as an operator would), and fails over
to a replica that is behind: the replica (AOF always too) is stalled with
DEBUG SLEEP while the primary takes writes for 0.7 s more, both are killed,
and a server on the primary's address starts from the replica's data (the
clients' address stays; the queue keeps its incarnation, but its seqs and
acks go back), and pauses the group (for up to 3 s) and resumes it.
Producers publish even ids with priorities 0 and 6 in turn, odd ids with
one of KEYS ordering keys (key_concurrency 1): no handler run of a keyed
message starts before a run of every earlier message of its key ended,
unless Redis lost state in that incarnation before it (keyed_out_of_order
must be 0).

Every handler call and every ack Redis applied is recorded by the children
(the message's id, seq and the queue's incarnation, with the time), every
publish Redis confirmed by the producers, and every loss of Redis state a
client reported (with the time). At the end the run prints confirmed
publishes, those handled, those lost and reported, those lost and not
reported (must be 0) and handler runs after an ack of the same message
that no reported loss came between (must be 0: a failover to a replica
that missed an ack hands the message out again, at least once, and says
so); every message published after the last loss must be settled by the
group.

    python tests/support/chaos.py --seconds 120 --messages 20000   # the long run, by hand

tests/test_chaos.py runs a short one in CI (RQUEUE_CHAOS_SECONDS and
RQUEUE_CHAOS_MESSAGES make it longer). RQUEUE_CHAOS_PREFETCH=auto leaves
the workers' prefetch windows to them, under a group cap they can reach. Every loop is bounded in count and
time and only addresses on 127.0.0.1 are used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import redis

ROOT = Path(__file__).resolve().parents[2]  # the repository, for `import rqueue` in the child processes
sys.path.insert(0, str(ROOT))

import rqueue  # noqa: E402
from rqueue.consumer import Consumer  # noqa: E402
from rqueue.embedded import EmbeddedServer, find_binary  # noqa: E402

T = TypeVar("T")
QUEUE, GROUP = "chaos", "g"
BATCH = 50  # messages per publish_many
MAX_INFLIGHT = 16  # the group's cap, below 3 workers x PREFETCH so that it binds
CONCURRENCY = 4  # handler threads per worker
PREFETCH: int | None = 8  # each worker's cap: its handlers' deliveries and those waiting for a thread
if os.environ.get("RQUEUE_CHAOS_PREFETCH") == "auto":
    # The workers' windows left to them (rqueue/worker/window.py), under a
    # group cap they can reach.
    PREFETCH, MAX_INFLIGHT = None, 3 * rqueue.constants.ADAPTIVE_PREFETCH_CAP
KEYS = 7  # ordering keys of the odd ids
# How soon after SIGCONT a handler thread paused between its last lease check
# and the handler's call starts it (on a loaded machine, a while)
PAUSED_INSTANT = 0.5
# Seconds the workers run on after the last failover or wipe before the
# run ends: a worker that acked a message whose ack Redis lost reports the
# loss at its first fetch after the rollback, which its reconnect backoff
# (up to 2 s) can put after every message was handled again elsewhere.
AFTER_ROLLBACK = 4.0


@dataclass
class Report:
    messages: int = 0
    confirmed: int = 0
    handled: int = 0  # confirmed publishes whose ack Redis applied
    lost_reported: int = 0  # confirmed, never acked, gone in a loss a client reported
    lost_unreported: int = 0  # confirmed, never acked, no report covers it: must be 0
    runs_after_ack: int = 0  # handler calls that began after an ack of their message: must be 0
    losses_reported: int = 0  # StateLost reports by the children (one per client that saw a loss)
    runs_again_after_a_loss: int = 0  # runs after an ack, that their process reported lost first (allowed)
    # runs after an ack by another process than the one that acked, that a
    # failover took back and a client that saw it reported (allowed)
    runs_again_elsewhere_after_a_loss: int = 0
    # the same where no client reported a loss: the acks a failover took
    # back were above the floor, and the process that acked was not handed
    # them again (guarantee 12: "a message acked out of order by another
    # consumer, or fetched by a consumer that never saw the floor, may run
    # again"; allowed, and counted apart)
    runs_again_elsewhere_unreported: int = 0
    # runs that began just after their worker's SIGCONT, of a message another
    # acked during the pause: paused between the last lease check and the
    # handler's call (guarantee 13's one instant; at most one per handler
    # thread and pause, allowed)
    runs_after_ack_in_a_paused_instant: int = 0
    worker_kills: int = 0
    group_pauses: int = 0
    worker_pauses: int = 0
    client_kills: int = 0
    redis_restarts: int = 0
    redis_wipes: int = 0  # restarts without the data
    lagging_failovers: int = 0  # restarts from a replica that was behind
    handler_calls: int = 0
    duplicates_presented: int = 0  # handler calls beyond one per message
    dead_lettered: int = 0
    max_in_flight_seen: int = 0
    max_held_seen: int = 0
    keyed_pairs_checked: int = 0  # (earlier, later) messages of one key whose runs were compared
    keyed_out_of_order: int = 0  # a later message of a key ran before any run of an earlier one ended: must be 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


# -- child processes ---------------------------------------------------------------


def retrying(call: Callable[[], T], seconds: float = 60) -> T:
    """``call()``, tried again while Redis is being restarted."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except (redis.RedisError, OSError, rqueue.RQueueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def connect_retrying(url: str, prefix: str, seconds: float = 60) -> rqueue.Client:
    """A child may start while Redis is being restarted: keep trying."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return rqueue.connect(url, prefix=prefix)
        except rqueue.ConnectionFailed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class LossLog(logging.Handler):
    """Appends every StateLost a client of this process logs to a file, as
    JSON: the incarnation it was about and the seq above which it is gone."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.ERROR)
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        for loss in args:
            if isinstance(loss, rqueue.StateLost):
                with open(self.path, "a") as f:
                    fields = {
                        "incarnation": loss.incarnation,
                        "gone_above": loss.gone_above,
                        "at": time.time(),
                        "pid": os.getpid(),
                    }
                    f.write(json.dumps(fields) + "\n")


def record_losses(path: str) -> None:
    logging.getLogger("rqueue").addHandler(LossLog(path))


def producer(url: str, prefix: str, first: int, count: int, out: str, seconds: float) -> None:
    """Publishes ids first..first+count-1 spread over ``seconds``, retrying
    each batch (same ids) until Redis confirms it; appends "id seq
    incarnation" of each confirmed message to ``out``."""
    record_losses(out + ".losses")
    with open(out, "a") as f:
        client = connect_retrying(url, prefix)
        q = retrying(lambda: client.queue(QUEUE))
        watch = client.state_watch(QUEUE, q.keys)  # type: ignore[attr-defined]
        pause = seconds / max(1, count // BATCH)
        for start in range(first, first + count, BATCH):
            time.sleep(pause)
            ids = [f"m{i}" for i in range(start, min(start + BATCH, first + count))]
            deadline = time.monotonic() + 120
            while True:
                try:
                    # priorities and ordering keys: their paths take the
                    # same kills, restarts, wipes and failovers
                    results = q.publish_many(
                        [i.encode() for i in ids],
                        ids=ids,
                        priority=[int(i[1:]) % 4 * 3 if int(i[1:]) % 2 == 0 else 0 for i in ids],
                        key=[f"k{int(i[1:]) % KEYS}" if int(i[1:]) % 2 else None for i in ids],
                    )
                    break
                except (redis.RedisError, OSError, rqueue.RQueueError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            inc = watch.incarnation  # of this reply (a loss it showed is recorded by then)
            f.write("".join(f"{i} {r.seq} {inc}\n" for i, r in zip(ids, results, strict=True)))
            f.flush()


def worker(url: str, prefix: str, out: str) -> None:
    """A Worker whose handler appends "run id seq incarnation published_ms
    time pid" lines to ``out``, and whose acks Redis applied are appended as
    "ack ..." (published_ms tells apart two copies of one publish that a
    rollback made: the retry of a publish whose reply was lost, stored
    again under the same seq; pid tells apart the processes of one slot)."""
    record_losses(out + ".losses")
    pid = os.getpid()
    client = connect_retrying(url, prefix)
    lock = threading.Lock()
    with open(out, "a", buffering=1) as log:

        def write(line: str) -> None:
            with lock:
                log.write(line)

        def handler(d: rqueue.Delivery) -> None:
            c = d.consumer
            assert isinstance(c, Consumer)
            write(f"run {d.data.decode()} {d.seq} {c.incarnation} {d.published_ms} {time.time():.6f} {pid}\n")
            time.sleep(random.uniform(0.005, 0.03))
            write(f"end {d.data.decode()} {d.seq} {c.incarnation} {d.published_ms} {time.time():.6f} {pid}\n")

        def recorded(method):  # type: ignore[no-untyped-def]
            # Each ack whose status is None was applied; the time is taken
            # after the reply, so it is no earlier than the ack itself.
            def call(self, acks, *args, **kwargs):  # type: ignore[no-untyped-def]
                acks = list(acks)
                out = method(self, acks, *args, **kwargs)
                statuses = out[0] if isinstance(out, tuple) else out
                now = time.time()
                for d, status in zip(acks, statuses, strict=False):
                    if status is None and isinstance(d, rqueue.Delivery):
                        write(f"ack {d.data.decode()} {d.seq} {self.incarnation} {d.published_ms} {now:.6f} {pid}\n")
                return out

            return call

        Consumer.ack_and_fetch = recorded(Consumer.ack_and_fetch)  # type: ignore[method-assign]
        Consumer.ack_available = recorded(Consumer.ack_available)  # type: ignore[method-assign]

        w = rqueue.Worker(
            retrying(lambda: client.queue(QUEUE)),
            GROUP,
            handler,
            concurrency=CONCURRENCY,
            prefetch=PREFETCH,
            heartbeat_interval=0.2,
            heartbeat_timeout=1.0,
            grace_period=5,
            reconnect_timeout=120,
        )
        w.run()


# -- the run ------------------------------------------------------------------------


def run(seconds: float, messages: int, workers: int = 3, producers: int = 2, seed: int = 1) -> Report:
    rng = random.Random(seed)
    report = Report(messages=messages)
    work = Path(tempfile.mkdtemp(prefix="rqueue-chaos-"))
    no_delay = ["--repl-diskless-sync-delay", "0"]  # a replica's full sync at once (the default waits 5 s)
    server = EmbeddedServer(
        binary=find_binary(prefer="redis"), data_dir=work / "data", appendonly=True, extra_args=no_delay
    ).start()
    prefix = "chaos"
    me = [sys.executable, str(Path(__file__).resolve())]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    client = rqueue.connect(server.url, prefix=prefix)

    def configure() -> None:
        client.configure(QUEUE, ack_wait=5, max_inflight=MAX_INFLIGHT, max_deliveries=-1)
        client.queue(QUEUE).consumer(GROUP, name="setup").close()  # the group exists from the start

    configure()
    admin = redis.Redis(port=server.port, socket_timeout=2)
    binary = find_binary(prefer="redis")

    def start_replica() -> EmbeddedServer:
        for path in (work / "replica").glob("*"):
            if path.name != "server.log":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        args = ["--replicaof", "127.0.0.1", str(server.port), "--enable-debug-command", "local"]
        started = EmbeddedServer(binary=binary, data_dir=work / "replica", appendonly=True, extra_args=args).start()
        with redis.Redis(port=started.port, socket_timeout=2) as r:
            deadline = time.monotonic() + 5
            while r.info("replication").get("master_link_status") != "up" and time.monotonic() < deadline:
                time.sleep(0.02)
        return started

    replica = start_replica()

    def spawn(*args: str) -> subprocess.Popen[bytes]:
        # stderr kept (appended per role and slot) so that a child's failure names its cause
        slot = Path(args[-2] if args[0] == "producer" else args[-1]).stem  # p0, w1, ...
        with open(work / f"{args[0]}-{slot}.err", "ab") as log:
            return subprocess.Popen([*me, *args], env=env, stdout=subprocess.DEVNULL, stderr=log)

    per = messages // producers
    pace = str(seconds * 0.8)  # the load lasts through the chaos
    prods = [
        spawn("producer", server.url, prefix, str(i * per), str(per), str(work / f"p{i}.txt"), pace)
        for i in range(producers)
    ]
    report.messages = per * producers
    logs = [work / f"w{i}.txt" for i in range(workers)]
    procs = [spawn("worker", server.url, prefix, str(logs[i])) for i in range(workers)]
    # The chaos starts once every child is at work: each producer confirmed a
    # publish and each worker ran a handler (a loaded machine can take many
    # seconds to start a Python process, and a wipe before the first publish
    # takes nothing anyone saw).
    if not _each_wrote([*(work / f"p{i}.txt" for i in range(producers)), *logs], 120):
        report.problems.append("the producers and workers did not all start within 120 s")
    started = time.monotonic()
    wipe_at = started + seconds / 2  # one wipe for certain, while messages flow
    failover_at = started + seconds / 4  # and one failover to a lagging replica
    pause_at = started + seconds * 3 / 4  # and one pause of a worker
    group_pause_at = started + seconds * 5 / 8  # and one pause of the group
    pauses: list[tuple[str, float, float]] = []  # (pid, SIGSTOP, SIGCONT) of each worker paused
    # (began, back) of each failover and wipe: Redis lost writes applied
    # before it came back, and clients see it from when it began
    rollbacks: list[tuple[float, float]] = []
    try:
        while time.monotonic() - started < seconds:
            time.sleep(rng.uniform(0.3, 1.0))
            action = rng.choice(
                [
                    "kill-worker",
                    "kill-worker",
                    "client-kill",
                    "restart-redis",
                    "pause-worker",
                    "wipe-redis",
                    "failover-lagging",
                    "pause-group",
                    "sample",
                ]
            )
            if time.monotonic() > wipe_at:
                action, wipe_at = "wipe-redis", float("inf")
            elif time.monotonic() > failover_at:
                action, failover_at = "failover-lagging", float("inf")
            elif time.monotonic() > pause_at:
                action, pause_at = "pause-worker", float("inf")
            elif time.monotonic() > group_pause_at:
                action, group_pause_at = "pause-group", float("inf")
            try:
                if action == "failover-lagging":
                    began = time.time()
                    try:
                        _fail_over_to_a_lagging_replica(server, replica)
                    finally:
                        rollbacks.append((began, time.time()))
                    replica = start_replica()
                    configure()
                    report.lagging_failovers += 1
                elif action == "pause-worker":
                    i = rng.randrange(workers)
                    stopped, resumed = _pause_after_a_fetch(procs[i], logs[i], rng.uniform(1.0, 7.0))
                    pauses.append((str(procs[i].pid), stopped, resumed))
                    report.worker_pauses += 1
                elif action == "wipe-redis":
                    # Redis comes back without its data: no AOF, no RDB
                    began = time.time()
                    server.kill()
                    for path in server.data_dir.iterdir():
                        if path.name != "server.log":
                            shutil.rmtree(path) if path.is_dir() else path.unlink()
                    server.start()
                    rollbacks.append((began, time.time()))
                    configure()
                    report.redis_wipes += 1
                    replica.kill()  # it would sync the empty primary: started afresh
                    replica = start_replica()
                elif action == "pause-group":
                    # the group hands out nothing for a while (its leases may
                    # run out meanwhile: redelivered after the resume)
                    paused = client.queue(QUEUE)
                    paused.pause(GROUP)
                    report.group_pauses += 1
                    try:
                        time.sleep(rng.uniform(0.5, 3.0))
                    finally:
                        retrying(lambda: client.queue(QUEUE).resume(GROUP), 30)
                elif action == "kill-worker":
                    i = rng.randrange(workers)
                    procs[i].kill()
                    procs[i].wait()
                    procs[i] = spawn("worker", server.url, prefix, str(logs[i]))
                    report.worker_kills += 1
                elif action == "client-kill":
                    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                    report.client_kills += 1
                elif action == "restart-redis":
                    server.kill()
                    server.start()
                    report.redis_restarts += 1
                else:
                    _sample(client, report)
            except (redis.RedisError, OSError, rqueue.RQueueError):
                pass  # the server was restarting; the next action goes on
        for p in prods:
            p.wait(120)
            if p.returncode != 0:
                tails = [f.read_text(errors="replace").strip().splitlines()[-3:] for f in work.glob("producer-*.err")]
                report.problems.append(f"a producer exited with {p.returncode}: {[t for t in tails if t]}")
        report.confirmed = len(_confirmed(work, producers))
        q = client.queue(QUEUE)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                s = q.stats()
                _sample(client, report)
                g = s.group(GROUP)
                calm = not rollbacks or time.time() > rollbacks[-1][1] + AFTER_ROLLBACK
                if g.ack_floor == s.last_seq and g.in_flight == 0 and calm:
                    break
            except (redis.RedisError, OSError, rqueue.RQueueError, KeyError):
                pass
            time.sleep(0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs + prods:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    report.seconds = round(time.monotonic() - started, 1)
    final = _check(client, report, logs)
    _account(report, work, producers, logs, final, rollbacks, pauses)
    client.close()
    admin.close()
    replica.stop()
    server.stop()
    return report


def _each_wrote(paths: list[Path], seconds: float) -> bool:
    """Waits until each file holds a line; False when ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while not all(path.exists() and path.stat().st_size for path in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _pause_after_a_fetch(proc: subprocess.Popen[bytes], log: Path, seconds: float) -> tuple[float, float]:
    """SIGSTOP for ``seconds``, as soon as the worker's handlers start on
    something (it has just fetched a batch; the rest waits in it), or after
    a second; then SIGCONT. Returns the times of the two."""
    size = log.stat().st_size if log.exists() else 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and (log.stat().st_size if log.exists() else 0) == size:
        time.sleep(0.002)
    proc.send_signal(signal.SIGSTOP)
    stopped = time.time()
    try:
        time.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGCONT)
    return stopped, time.time()


def _fail_over_to_a_lagging_replica(server: EmbeddedServer, replica: EmbeddedServer) -> None:
    """The replica stalls (DEBUG SLEEP) while the primary takes writes for
    0.7 s more; both die; the primary's address comes back with the
    replica's data (the caller starts a new replica of it)."""
    stall = threading.Thread(
        target=lambda: _quietly(lambda: redis.Redis(port=replica.port).execute_command("DEBUG", "SLEEP", "3"))
    )
    stall.start()
    time.sleep(0.7)
    server.kill()
    replica.kill()
    stall.join()
    for path in server.data_dir.iterdir():
        if path.name != "server.log":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    shutil.copytree(replica.data_dir / "appendonlydir", server.data_dir / "appendonlydir")
    server.start()


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(redis.RedisError, OSError):  # the stalled replica is killed under its DEBUG SLEEP
        call()


def _confirmed(work: Path, producers: int) -> set[tuple[str, int, str]]:
    """(id, seq, incarnation) of every publish Redis confirmed."""
    out = set()
    for i in range(producers):
        path = work / f"p{i}.txt"
        for line in path.read_text().splitlines() if path.exists() else []:
            mid, seq, inc = line.split()
            out.add((mid, int(seq), inc))
    return out


def _account(
    report: Report,
    work: Path,
    producers: int,
    logs: list[Path],
    final: tuple[str, int] | None,
    rollbacks: list[tuple[float, float]],
    pauses: list[tuple[str, float, float]],
) -> None:
    """Confirmed, handled, lost and reported or not, runs after an ack.
    ``final`` is the queue's incarnation at the end and the last seq its
    group settled (None when it did not settle): a publish of it at or
    below that seq that a handler ran was handled, whether or not its
    worker lived to record the ack (a SIGKILL can fall between the ack's
    reply and the record). One the group settled without a handler run (an
    old ack settling a new message) counts as lost, and reported only if a
    report covers it. ``rollbacks`` are the (began, back) times of the
    failovers and wipes, ``pauses`` the (pid, SIGSTOP, SIGCONT) of the
    workers paused."""
    confirmed = _confirmed(work, producers)
    runs: list[tuple[tuple[str, int, str, int], float, str]] = []  # (copy, time, pid)
    acked: dict[tuple[str, int, str, int], tuple[float, str]] = {}  # a copy -> its first applied ack's (time, pid)
    losses: list[tuple[str, int, float]] = []
    reported_by: dict[str, list[tuple[str, float]]] = {}  # pid -> (incarnation, time) of its reports
    for path in [*logs, *(work / f"p{i}.txt" for i in range(producers))]:
        extra = Path(str(path) + ".losses")
        for line in extra.read_text().splitlines() if extra.exists() else []:
            loss = json.loads(line)
            losses.append((loss["incarnation"], int(loss["gone_above"]), float(loss["at"])))
            reported_by.setdefault(str(loss["pid"]), []).append((loss["incarnation"], float(loss["at"])))
    for path in logs:
        for line in path.read_text().splitlines() if path.exists() else []:
            kind, mid, seq, inc, published, at, pid = line.split()
            key = (mid, int(seq), inc, int(published))
            if kind == "run":
                runs.append((key, float(at), pid))
            elif kind == "end":
                pass
            elif key not in acked or float(at) < acked[key][0]:
                acked[key] = (float(at), pid)
    report.losses_reported = len(losses)
    # ids are unique, so every copy of (id, seq, incarnation) is of one confirmed publish
    ran = {key[:3] for key, _, _ in runs}
    done = {key[:3] for key in acked}
    settled = {m for m in confirmed & ran if final is not None and m[2] == final[0] and m[1] <= final[1]}
    report.handled = len(confirmed & (done | settled))
    for _mid, seq, inc in confirmed - done - settled:
        if any(inc == lost and seq > above for lost, above, _ in losses):
            report.lost_reported += 1
        else:
            report.lost_unreported += 1
    in_instant: dict[tuple[float, float], int] = {}  # runs allowed per pause
    for key, at, pid in runs:
        acked_at, acker = acked.get(key, (at, pid))
        if at <= acked_at:
            continue
        if any(lost == key[2] and acked_at < when < at for lost, when in reported_by.get(pid, [])):
            # Redis lost the ack, and the process that ran it again said so
            # first (at least once, and said so).
            report.runs_again_after_a_loss += 1
        elif pid != acker and any(
            acked_at < back and at > began and any(lost == key[2] and when >= began for lost, _, when in losses)
            for began, back in rollbacks
        ):
            # Redis lost the ack in a failover between the two, and a client
            # that saw what it lost reported it: only the process that acked
            # can tell the message (docs/guarantees.md, guarantee 12).
            report.runs_again_elsewhere_after_a_loss += 1
        elif pid != acker and any(acked_at < back and at > began for began, back in rollbacks):
            # Redis lost the ack in a failover between the two, and no client
            # reported it: only the process that acked can tell the message,
            # and only if it is handed that message again or sees the floor
            # go back (tests/test_state_loss.py checks both one by one).
            report.runs_again_elsewhere_unreported += 1
        elif pause := next(
            (
                (stopped, resumed)
                for paused, stopped, resumed in pauses
                if paused == pid != acker and stopped < acked_at < resumed <= at < resumed + PAUSED_INSTANT
            ),
            None,
        ):
            # Its worker was paused between its last lease check and the
            # handler's call, and another acked the message meanwhile: the
            # one instant guarantee 13 leaves out, one per handler thread.
            in_instant[pause] = in_instant.get(pause, 0) + 1
            if in_instant[pause] <= CONCURRENCY:
                report.runs_after_ack_in_a_paused_instant += 1
            else:
                report.runs_after_ack += 1
        else:
            report.runs_after_ack += 1
    _check_keys(report, logs, losses)
    if report.lost_unreported:
        report.problems.append(f"{report.lost_unreported} confirmed publishes lost without a report")
    if report.runs_after_ack:
        report.problems.append(f"{report.runs_after_ack} handler runs after an ack of their message")


def _check_keys(report: Report, logs: list[Path], losses: list[tuple[str, int, float]]) -> None:
    """Per ordering key and incarnation: the first run of a message starts
    after some run of each earlier message of its key ended (the end is
    written before the ack is sent), unless that earlier one never ended (a
    killed worker, a dead letter) or Redis lost state in that incarnation
    around them."""
    # A copy of a message is (incarnation, published_ms, seq), as _account tells copies apart: a
    # failover to a lagging replica keeps the incarnation and gives its lost seqs to later messages.
    first_run: dict[tuple[str, int, int], float] = {}  # copy -> earliest run start
    first_end: dict[tuple[str, int, int], float] = {}
    key_of: dict[tuple[str, int, int], str] = {}
    for path in logs:
        for line in path.read_text().splitlines() if path.exists() else []:
            kind, mid, seq, inc, published, at, _pid = line.split()
            if kind not in ("run", "end") or int(mid[1:]) % 2 == 0:
                continue
            copy = (inc, int(published), int(seq))
            key_of[copy] = f"k{int(mid[1:]) % KEYS}"
            times = first_run if kind == "run" else first_end
            times[copy] = min(times.get(copy, float("inf")), float(at))
    by_key: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for copy, key in key_of.items():
        by_key.setdefault((copy[0], key), []).append(copy)
    for (inc, _), copies in by_key.items():
        copies.sort()  # in publish order: by published_ms, then seq
        ended = float("inf")  # the latest first end among earlier messages that ended
        for prev, copy in zip(copies, copies[1:], strict=False):
            if prev in first_end:
                ended = first_end[prev]
            start = first_run.get(copy)
            if start is None or ended == float("inf"):
                continue
            report.keyed_pairs_checked += 1
            # a loss is reported by a client when it sees it, possibly after the run: one
            # reported within 10 s either side excuses the pair
            if start < ended and not any(lost == inc and ended - 10 <= when <= start + 10 for lost, _, when in losses):
                report.keyed_out_of_order += 1
    if report.keyed_out_of_order:
        report.problems.append(
            f"{report.keyed_out_of_order} keyed messages ran before an earlier one of their key ended"
        )


def _sample(client: rqueue.Client, report: Report) -> None:
    g = client.queue(QUEUE).stats().group(GROUP)
    report.max_in_flight_seen = max(report.max_in_flight_seen, g.in_flight)
    report.max_held_seen = max([report.max_held_seen] + [c.held for c in g.consumers if c.name != "setup"])


def _check(client: rqueue.Client, report: Report, logs: list[Path]) -> tuple[str, int] | None:
    """The checks of the queue's state at the end; returns its incarnation
    and last seq when its group settled every message, else None."""
    q = client.queue(QUEUE)
    s = q.stats()
    g = s.group(GROUP)
    inc = client.redis.hget(q.keys.meta, "inc")  # type: ignore[attr-defined]
    final = (inc.decode(), s.last_seq) if inc and g.ack_floor == s.last_seq and g.pending == 0 else None
    calls: Counter[tuple[str, int, str, str]] = Counter()
    for path in logs:
        for line in path.read_text().splitlines():
            kind, mid, seq, inc, published, _, _pid = line.split()
            if kind == "run":
                calls[(mid, int(seq), inc, published)] += 1
    report.handler_calls = sum(calls.values())
    report.duplicates_presented = report.handler_calls - len(calls)
    report.dead_lettered = s.dead_letters
    if not report.redis_wipes and s.last_seq != report.confirmed:
        report.problems.append(f"{report.confirmed} publishes confirmed but the queue holds seqs up to {s.last_seq}")
    if g.ack_floor != s.last_seq or g.pending != 0:
        report.problems.append(f"group not settled: floor {g.ack_floor}, pending {g.pending}, last seq {s.last_seq}")
    if s.depth != 0:
        report.problems.append(f"{s.depth} records left after every message was settled")
    if report.max_in_flight_seen > MAX_INFLIGHT:
        report.problems.append(f"max_inflight {MAX_INFLIGHT} exceeded: {report.max_in_flight_seen}")
    held_cap = PREFETCH or rqueue.constants.ADAPTIVE_PREFETCH_CAP
    if report.max_held_seen > held_cap:
        report.problems.append(f"prefetch {held_cap} exceeded: {report.max_held_seen}")
    return final


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("producer", "worker"):
        role, *args = sys.argv[1:]
        if role == "producer":
            producer(args[0], args[1], int(args[2]), int(args[3]), args[4], float(args[5]))
        else:
            worker(*args)
        return
    parser = argparse.ArgumentParser(description="rqueue chaos run (loopback only)")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    a = parser.parse_args()
    report = run(a.seconds, a.messages, a.workers, seed=a.seed)
    print(json.dumps(asdict(report), indent=2))
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
