"""The asyncio API has what the sync API has: every public method and
attribute of the sync classes is on their asyncio twins, but for the few
listed here with the reason; a name added to a sync class and not to its
twin fails here, and so does a listed name the twin has gained."""

from __future__ import annotations

import inspect

import pytest

import rqueue
import rqueue.aio

TWINS = [
    (rqueue.Client, rqueue.aio.Client),
    (rqueue.Queue, rqueue.aio.Queue),
    (rqueue.PartitionedQueue, rqueue.aio.PartitionedQueue),
    (rqueue.Consumer, rqueue.aio.Consumer),
    (rqueue.PartitionedConsumer, rqueue.aio.PartitionedConsumer),
    (rqueue.Delivery, rqueue.aio.Delivery),
    (rqueue.Worker, rqueue.aio.Worker),
]

# Names of a sync class its asyncio twin does not have, with the reason.
NOT_IN_AIO = {
    "Client.overview": "operator view over every queue: rqueue.connect, the CLI or the dashboard",
    "Client.schedule": "recurring schedules are defined from rqueue.connect or the CLI",
    "Client.schedules": "recurring schedules are defined from rqueue.connect or the CLI",
    "Client.pause_schedule": "recurring schedules are defined from rqueue.connect or the CLI",
    "Client.resume_schedule": "recurring schedules are defined from rqueue.connect or the CLI",
    "Client.remove_schedule": "recurring schedules are defined from rqueue.connect or the CLI",
    "Client.idempotent": "the sync client's retry of plain commands on a cluster (aio: cluster_retry)",
    "Worker.start": "a thread's start: the asyncio worker is a task (await worker.run())",
    "Worker.join": "a thread's join: await the task that runs worker.run()",
    "Client.grow_partitions": "growing a queue is an operator's step: rqueue partitions --grow or rqueue.connect",
    "Client.layout": "read by the sync partitioned queue's refresh; the asyncio client reads layouts in open_queue()",
    "PartitionedQueue.grow": "growing a queue is an operator's step: rqueue partitions --grow or rqueue.connect",
    "PartitionedQueue.refresh": "an asyncio client routes by the layout read at connect or open_queue() (docs/aio.md)",
    "Worker.interrupt": "an async handler past its time limit is cancelled; interrupt= raises in a handler thread",
    "Worker.scheduler": "the recurring-schedule scheduler runs in threaded workers and `rqueue scheduler`",
}


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def instance_attributes(cls: type) -> set[str]:
    """Public attributes set in __init__ (``self.x = ...``)."""
    try:
        source = inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return set()
    return {
        line.split("self.", 1)[1].split("=", 1)[0].split(":", 1)[0].strip()
        for line in source.splitlines()
        if line.strip().startswith("self.") and "=" in line and not line.strip().startswith("self._")
    }


@pytest.mark.parametrize("sync, aio", TWINS, ids=[s.__name__ for s, _ in TWINS])
def test_the_asyncio_twin_has_every_public_name(sync: type, aio: type) -> None:
    # given the public names of a sync class (methods, properties, attributes set in __init__)
    wanted = public(sync) | instance_attributes(sync)
    have = public(aio) | instance_attributes(aio)
    for base in aio.__mro__[1:]:
        have |= instance_attributes(base)
    # then its asyncio twin has each, but for the listed ones
    missing = {f"{sync.__name__}.{n}" for n in wanted - have}
    assert missing - NOT_IN_AIO.keys() == set(), "add these to rqueue.aio, or list them with the reason"
    # and no listed name has meanwhile come to the twin
    listed = {k for k in NOT_IN_AIO if k.startswith(sync.__name__ + ".")}
    assert listed - missing == set(), "rqueue.aio has these now: take them off NOT_IN_AIO"


@pytest.mark.parametrize("sync, aio", TWINS[:-1], ids=[s.__name__ for s, _ in TWINS[:-1]])
def test_what_sends_is_awaitable_and_takes_the_same_arguments(sync: type, aio: type) -> None:
    # given a method both classes have
    for name in sorted(public(sync) & public(aio)):
        mine, theirs = getattr(sync, name), getattr(aio, name)
        if not inspect.isfunction(mine) or not inspect.isfunction(theirs):
            continue
        # then the asyncio one takes the sync one's parameters (progress callbacks aside), in order
        wanted = [p for p in inspect.signature(mine).parameters if p != "progress"]
        got = list(inspect.signature(theirs).parameters)
        if name == "queue":  # the asyncio client's queue() sends nothing: open_queue(name, partitions) does
            theirs = aio.open_queue
            got = list(inspect.signature(theirs).parameters)
        assert got[: len(wanted)] == wanted, f"{aio.__name__}.{name}{got} vs {sync.__name__}.{name}{wanted}"
