"""The only place where Redis key names are spelled.

Every key of a queue starts with ``<prefix>:{<root>}`` so that one queue,
its groups and its dead-letter queue live in one Redis Cluster slot and every
script can touch them atomically. A dead-letter queue ``DLQ.orders`` is the
queue ``orders`` one level down: ``<prefix>:{orders}:dlq``.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

# The environment variable that picks the layout of a new prefix's queues
# (LogLayout; rqueue.engine.prefix_layout): a prefix that has a layout keeps
# it. The name it had while the stream layout was hidden is read too.
LAYOUT_ENV = "RQUEUE_LAYOUT"
OLD_LAYOUT_ENV = "RQUEUE_EXPERIMENTAL_LAYOUT"


class LogLayout(enum.Enum):
    """How a queue stores its log of message records."""

    #: The hash ``msgs``: seq -> record.
    HASH = "hash"
    #: The stream ``log``: one entry per record (a compact one as id
    #: ``<seq>-<published ms>`` with its payload, field ``p``; any other as
    #: ``<seq>-0``, field ``r``), trimmed at the lowest ack floor; the
    #: record of a message published with a priority or an ordering key in
    #: the hash ``side`` (seq -> record), with the stub entry ``<seq>-0``
    #: field ``s`` in the stream; replayed records in the queue's ``pinned``
    #: hash, field ``r<seq>`` (lua/includes/log.lua).
    STREAM = "stream"


def default_layout() -> LogLayout:
    """The layout of the queues a client makes under a prefix that has
    none yet (rqueue.engine.prefix_layout): LogLayout.STREAM unless the
    environment names another (LAYOUT_ENV, or OLD_LAYOUT_ENV)."""
    name = LAYOUT_ENV if os.environ.get(LAYOUT_ENV) else OLD_LAYOUT_ENV
    text = os.environ.get(name, "") or LogLayout.STREAM.value
    try:
        return LogLayout(text)
    except ValueError:
        names = ", ".join(layout.value for layout in LogLayout)
        raise ValueError(f"{name} is {text!r}; it must be one of {names}") from None


@dataclass(frozen=True)
class QueueKeys:
    """Keys of one queue (or dead-letter queue), below ``base``, whose log
    has ``layout`` (a dead-letter queue has its queue's). Each name is built
    once (cached_property): publish and fetch read them per call."""

    base: str
    layout: LogLayout = LogLayout.HASH

    @cached_property
    def meta(self) -> str:
        return f"{self.base}:meta"

    @cached_property
    def msgs(self) -> str:
        """The log: the hash ``msgs`` or the stream ``log`` (LogLayout). The
        scripts tell the layout by the name's last letter."""
        return f"{self.base}:log" if self.layout is LogLayout.STREAM else f"{self.base}:msgs"

    @cached_property
    def side(self) -> str:
        """Stream layout: the hash seq -> record of the messages published
        with a priority or an ordering key, whose entries in the stream are
        stubs (field ``s``): the flow-control reads take them by HMGET, where
        a stream would take one XRANGE each (lua/includes/log.lua)."""
        return f"{self.base}:side"

    @cached_property
    def floors(self) -> str:
        return f"{self.base}:floors"

    @cached_property
    def settled(self) -> str:
        return f"{self.base}:settled"

    def message_id(self, msg_id: str) -> str:
        """The de-duplication key of ``msg_id`` (expires with the window).
        The queue's hash tag comes first, so any id stays in its slot."""
        return f"{self.base}:id:{msg_id}"

    def result(self, seq: int, group: str) -> str:
        """The stored result of message ``seq`` for ``group`` (ack_result.lua:
        each group keeps its own), expiring with the queue's result_ttl."""
        return f"{self.base}:result:{seq}:{group}"

    def tracker(self, writer: str) -> str:
        """Hash of what one re-runnable writer (a Spark task of one batch)
        stored: publish_tracked.lua's tracker, expiring with the window."""
        return f"{self.base}:track:{writer}"

    @cached_property
    def sched(self) -> str:
        return f"{self.base}:sched"

    @cached_property
    def pinned(self) -> str:
        """Hash seq -> groups that reopened it by replay (kept from trimming)."""
        return f"{self.base}:pinned"

    @cached_property
    def events(self) -> str:
        """Capped stream of dead-letters, drops and replays."""
        return f"{self.base}:events"

    @cached_property
    def prio(self) -> str:
        """Sorted set seq -> "<seq>:<priority>" of the messages published
        with a priority (1-9): the log each group's fetch reads them from."""
        return f"{self.base}:prio"

    @cached_property
    def wake_channel(self) -> str:
        """Pub/sub channel (not a key) announcing new messages."""
        return f"{self.base}:wake"

    @cached_property
    def wakes(self) -> str:
        """Stream of one entry, added to when messages arrive for a queue
        whose fetch found nothing: an idle consumer blocks on it
        (lua/includes/wake.lua)."""
        return f"{self.base}:wakes"

    def schedule(self, name: str) -> str:
        """Hash of recurring schedule ``name``, which publishes to this
        queue: under the queue's hash tag, so that one script reads the
        schedule and stores its message."""
        return f"{self.base}:schedule:{name}"

    @cached_property
    def dead_letters(self) -> QueueKeys:
        return QueueKeys(f"{self.base}:dlq", self.layout)

    def publish_keys(self) -> list[str]:
        """The fixed KEYS of publish.lua (a new list); id keys follow them."""
        return list(self._publish_keys)

    @cached_property
    def _publish_keys(self) -> tuple[str, ...]:
        return (self.meta, self.msgs, self.floors, self.sched, self.wakes)

    @cached_property
    def publish_flow_keys(self) -> tuple[str, ...]:
        """The KEYS publish.lua is sent last, after the id keys, when a
        message has a priority or an ordering key: the priority log, and in
        the stream layout the side hash after it."""
        if self.layout is LogLayout.STREAM:
            return (self.prio, self.side)
        return (self.prio,)

    def deletion_order(self, groups: Sequence[str]) -> list[str]:
        """Every key of this level and of ``groups``, in the order a queue
        delete removes them (one DEL per batch): the groups' keys first, the
        floors hash (which names the groups) after them, and the meta and
        the log (by which the level is found) last, so that a delete cut off
        between two DELs leaves what it has not deleted findable, and a
        delete run again finishes it."""
        last = (self.floors, self.meta, self.msgs)
        doomed = [key for g in groups for key in self.group(g).group_only()]
        doomed += [key for key in self.all_static() if key not in last]
        return doomed + list(last)

    def group(self, group: str, dead_letters: QueueKeys | None = None) -> GroupKeys:
        """Keys of ``group``; ``dead_letters`` names another queue to receive
        its dead letters (default: this queue's own dead-letter queue)."""
        return GroupKeys(self, group, dead_letters or self.dead_letters)

    def status_keys(self, msg_id: str | None, groups: Sequence[str]) -> list[str]:
        """KEYS of status.lua: the message's id key (the meta key when it
        is named by its seq), then four keys per group (the reopen set last:
        a replayed seq is pending again below the floor), then the pins; in
        the stream layout two keys per group (the call records, by which a
        first delivery out on a call is found) and the side hash."""
        keys = [self.meta, self.msgs, self.floors, self.events, self.message_id(msg_id) if msg_id else self.meta]
        for g in groups:
            gk = self.group(g)
            keys += [gk.deliveries, gk.acked, gk.delay, gk.reopen]
        keys.append(self.pinned)
        if self.layout is LogLayout.STREAM:
            for g in groups:  # the call records and their first seqs (status.lua)
                gk = self.group(g)
                keys += [gk.calls, gk.call_seqs]
        keys += self._layout_keys  # a stream log's side hash, last (status.lua)
        return keys

    def retain_keys(self) -> list[str]:
        """KEYS of retain.lua: in the stream layout the priority log and the
        side hash last, as the trim step reads stubs and deletes the side
        records its trim point passes."""
        if self.layout is LogLayout.STREAM:
            return [self.meta, self.msgs, self.floors, self.settled, self.pinned, self.prio, self.side]
        return [self.meta, self.msgs, self.floors, self.settled, self.pinned]

    def all_static(self) -> list[str]:
        """The queue-level keys, for deletion and inspection."""
        return [
            self.meta,
            self.msgs,
            self.floors,
            self.settled,
            self.sched,
            self.events,
            self.pinned,
            self.prio,
            self.wakes,
            *self._layout_keys,
        ]

    @cached_property
    def _layout_keys(self) -> tuple[str, ...]:
        """The queue-level keys of its layout alone."""
        return (self.side,) if self.layout is LogLayout.STREAM else ()


ACK_KEYS = 13  # keys: the first of GroupKeys.as_list that ack.lua is sent (all it can touch)
# The first of GroupKeys.as_list that nack, reject, extend, heartbeat, join,
# leave, settle_to and replay are sent: none of them reads the priority,
# rate or ordering-key keys (every key sent costs a call about 1,200 Redis
# instructions). In the stream layout the side hash follows them (a
# redelivery's and a dead letter's record may be a stub's): settle_keys.
SETTLE_KEYS = 17
# How many of GroupKeys.as_list are the group layout's, the same in every
# layout; a layout's own keys follow them (QueueKeys._layout_keys).
GROUP_KEYS = 24


def settle_keys(keys: Sequence[str]) -> list[str]:
    """The KEYS of a script sent the first SETTLE_KEYS of ``keys`` (a
    GroupKeys.as_list), with the layout's own keys after them: in the
    stream layout the call keys, then the side hash, which every script
    that can meet a stub is sent last (lua/includes/group_keys.lua); none
    in the hash layout."""
    return [*keys[:SETTLE_KEYS], *keys[GROUP_KEYS:]]


def call_keys_of(keys: Sequence[str]) -> list[str]:
    """The call keys among ``keys`` (a GroupKeys.as_list): the three after
    the GROUP_KEYS in the stream layout, none in the hash layout."""
    return [*keys[GROUP_KEYS:-1]] if len(keys) > GROUP_KEYS else []


def side_of(keys: Sequence[str]) -> list[str]:
    """The side hash among ``keys`` (a GroupKeys.as_list): last, in the
    stream layout alone."""
    return [*keys[-1:]] if len(keys) > GROUP_KEYS else []


def ack_keys(keys: Sequence[str]) -> list[str]:
    """ack.lua's KEYS: the first ACK_KEYS of ``keys``, then the call keys."""
    return [*keys[:ACK_KEYS], *call_keys_of(keys)]


def fetch_plain_keys(keys: Sequence[str]) -> list[str]:
    """fetch.lua's KEYS for a plain call: the first FETCH_PLAIN_KEYS of
    ``keys`` (a GroupKeys.as_list); in the stream layout then the call keys
    and the queue's schedule of delayed publishes, by which fetch claims
    first deliveries without reading their records (lua/fetch.lua)."""
    calls = call_keys_of(keys)
    if not calls:
        return [*keys[:FETCH_PLAIN_KEYS]]
    return [*keys[:FETCH_PLAIN_KEYS], *calls, keys[0].removesuffix("meta") + "sched"]


# The first of GroupKeys.as_list that fetch.lua is sent for a queue that never
# had a priority or keyed message, by a group without a rate limit: the
# priority log and set, the rate window and the ordering keys' four are left
# out (every key sent costs a call about 1,200 Redis instructions).
FETCH_PLAIN_KEYS = 17


@dataclass(frozen=True)
class GroupKeys:
    """Keys of one group of a queue, in the layout of lua/includes/group_keys.lua."""

    queue: QueueKeys
    group: str
    dlq: QueueKeys

    def _k(self, kind: str) -> str:
        return f"{self.queue.base}:{kind}:{self.group}"

    @property
    def state(self) -> str:
        """Hash of the group's cursor, floor and counters."""
        return self._k("grp")

    @property
    def lease(self) -> str:
        """Sorted set of the seqs in flight, by lease deadline (ms)."""
        return self._k("lease")

    @property
    def ready(self) -> str:
        """Sorted set of seqs ready for redelivery, by seq."""
        return self._k("ready")

    @property
    def delay(self) -> str:
        """Sorted set of seqs waiting for a redelivery, by due time (ms)."""
        return self._k("delay")

    @property
    def deliveries(self) -> str:
        """Hash of seq -> delivery state, while delivered and unsettled."""
        return self._k("dlv")

    @property
    def acked(self) -> str:
        """Sorted set of the runs of seqs settled above the ack floor."""
        return self._k("acked")

    @property
    def reopen(self) -> str:
        """Sorted set of the seqs a replay reopened for the group (replay.lua)."""
        return self._k("reopen")

    @property
    def priority(self) -> str:
        """Sorted set of the priority seqs the group read from the queue's
        priority log and has not handed out (fetch.lua)."""
        return self._k("pq")

    @property
    def rate(self) -> str:
        """Sorted set of the deliveries inside the rate limit's window."""
        return self._k("rate")

    @property
    def key_ready(self) -> str:
        """Sorted set of the ordering keys that may hand out, by turn."""
        return self._k("kready")

    @property
    def key_busy(self) -> str:
        """Sorted set of the ordering keys with deliveries out, by turn."""
        return self._k("kbusy")

    @property
    def key_flight(self) -> str:
        """Hash of each busy ordering key's deliveries out (and rate window)."""
        return self._k("kflight")

    @property
    def key_queue(self) -> str:
        """Sorted set (by lex) "<key> <seq>" of the keyed messages the group
        pulled and has not handed out."""
        return self._k("kq")

    @property
    def consumers(self) -> str:
        """Hash of consumer -> deliveries it holds, per member of the group."""
        return self._k("cons")

    @property
    def calls(self) -> str:
        """Hash of token -> call record: the first deliveries of one fetch
        from the cursor, in a stream log (lua/includes/call_state.lua)."""
        return self._k("calls")

    @property
    def call_deadlines(self) -> str:
        """Sorted set of the calls' tokens, by deadline (ms)."""
        return self._k("cexp")

    @property
    def call_seqs(self) -> str:
        """Sorted set of the calls' tokens, by first seq."""
        return self._k("cseq")

    @property
    def call_keys(self) -> tuple[str, ...]:
        """The call keys of the stream layout (none in the hash layout),
        sent right after the first ACK_KEYS, SETTLE_KEYS or GROUP_KEYS of
        :meth:`as_list` (lua/includes/group_keys.lua)."""
        if self.queue.layout is LogLayout.STREAM:
            return (self.calls, self.call_deadlines, self.call_seqs)
        return ()

    def as_list(self) -> list[str]:
        q = self.queue
        dlq = self.dlq
        return [
            q.meta,
            q.msgs,
            q.floors,
            q.settled,
            self._k("grp"),
            self._k("lease"),
            self._k("ready"),
            self._k("delay"),
            self._k("dlv"),
            self._k("acked"),
            self._k("cons"),
            q.pinned,
            self.reopen,
            self._k("beats"),
            dlq.meta,
            dlq.msgs,
            q.events,
            q.prio,
            self._k("pq"),
            self._k("rate"),
            self._k("kq"),
            self._k("kready"),
            self._k("kbusy"),
            self._k("kflight"),
            *self.call_keys,
            *q._layout_keys,
        ]

    def group_only(self) -> list[str]:
        """The keys that belong to this group alone (the call keys in the
        stream layout only)."""
        return [
            self._k(kind)
            for kind in (
                "grp",
                "lease",
                "ready",
                "delay",
                "dlv",
                "acked",
                "cons",
                "reopen",
                "beats",
                "pq",
                "rate",
                "kq",
                "kready",
                "kbusy",
                "kflight",
            )
        ] + list(self.call_keys)


def queue_base(prefix: str, root: str, depth: int, partition: int | None = None, salt: int = 0) -> str:
    """Base of the keys of ``root``'s dead-letter queue ``depth`` levels down
    (0 = the queue itself); with ``partition``, of that partition of a
    partitioned queue.

    A partition's hash tag ``{<root>/<partition>}`` differs per partition, so
    the partitions spread over the slots (and shards) of a cluster; the
    ``part:`` before it keeps partition keys apart from those of a plain queue
    that happens to be named ``<root>/<partition>``. A ``salt`` (placement,
    rqueue/placement.py) makes the tag ``{<root>/<partition>~<salt>}``, a
    tag whose slot is served by the primary the partition was placed on.
    """
    if partition is None:
        return f"{prefix}:{{{root}}}" + ":dlq" * depth
    return f"{prefix}:part:{{{partition_tag(root, partition, salt)}}}" + ":dlq" * depth


def partition_tag(root: str, partition: int, salt: int = 0) -> str:
    """The hash tag (without braces) of a partition: ``<root>/<partition>``,
    or ``<root>/<partition>~<salt>``. The last ``/`` segment is digits, or
    digits ``~`` digits, so no two partitions of any queues share a tag."""
    return f"{root}/{partition}" if salt == 0 else f"{root}/{partition}~{salt}"


def settings_key(prefix: str) -> str:
    """Hash of pattern settings: field "<pattern> <setting>" -> JSON value."""
    return f"{prefix}:settings"


def partitions_key(prefix: str) -> str:
    """Hash of partitioned queues: queue name -> number of partitions."""
    return f"{prefix}:partitions"


def layout_key(prefix: str) -> str:
    """String: the LogLayout of every queue of the prefix
    (rqueue.engine.prefix_layout)."""
    return f"{prefix}:layout"


def registry_key(prefix: str) -> str:
    """Set of the names of every queue written to."""
    return f"{prefix}:queues"


def schedules_key(prefix: str) -> str:
    """Hash of recurring schedules: schedule name -> the queue it publishes to."""
    return f"{prefix}:schedules"


def schedules_channel(prefix: str) -> str:
    """Pub/sub channel (not a key) announcing that a schedule was added,
    changed, paused, resumed or removed: schedulers read them again."""
    return f"{prefix}:schedules:changed"
