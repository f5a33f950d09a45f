"""Queues: publishing, inspection, and handing out consumers.

Long because a queue is the API's main object: publishing, groups and
their positions, dead letters, results, status and figures are each a
short method that hands the work to the module that does it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import validate as check
from .constants import PURGE_BATCH
from .consumer import Consumer
from .deadletters import Selection, iter_dead_letters, purge, replay
from .engine import commands, store
from .engine.keys import QueueKeys, queue_base
from .engine.record import decode_record
from .errors import InvalidInput, InvalidName, InvalidSetting, QueueInUse, QueuePartitioned, ResultTimeout, StateLost
from .events import EventKind
from .names import check_message_id, check_name, check_queue_name
from .publishing import prepare, send
from .results import (
    DeadLetter,
    GroupReset,
    Message,
    MessageStatus,
    Progress,
    PublishResult,
    QueueStats,
    ReplayResult,
    Trimmed,
)
from .retention import Position, position_args
from .retention import trim as trim_step
from .settings import DEAD_LETTER_MODES, Settings
from .stored_results import FIRST_POLL as FIRST_RESULT_POLL
from .stored_results import LAST_POLL as LAST_RESULT_POLL
from .stored_results import (
    Result,
    asked,
    judged,
    result_group,
    result_id,
    unknown_id,
)
from .tracing import sending
from .waiting import wait_settled

if TYPE_CHECKING:
    from .protocols import QueueContext


# A script touches one hash slot; a named queue has its own.
CLUSTER_DEAD_LETTER = (
    "on Redis Cluster dead letters go to the queue's own dead-letter queue (dead_letter='dlq', "
    "which shares its slot) or are dropped ('none'); a named queue lives in another slot"
)
# A queue that is its own dead-letter queue would hand each dead letter out
# again as a new message to every group, without end.
SELF_DEAD_LETTER = (
    "names the queue itself: each dead letter would be a new message of it, handed out again to every group "
    "(max_deliveries would never end a message); name another queue, 'dlq' or 'none'"
)
# Dead letters of a partition stay with that partition (replay returns them there).
PARTITION_DEAD_LETTER = (
    "a partitioned queue keeps each partition's dead letters in that partition's own dead-letter queue "
    "(dead_letter='dlq') or drops them ('none'); a named queue would mix the partitions' seqs"
)


class Queue:
    """A named queue. Obtain one with :meth:`rqueue.Client.queue`.

    ``DLQ.<name>`` names the dead-letter queue of ``<name>``; it is a queue
    like any other (it can be peeked and consumed) stored in the same Redis
    Cluster slot as its source.
    """

    def __init__(self, client: QueueContext, name: str, partition: int | None = None, salt: int = 0) -> None:
        check_queue_name(name, client.dlq_prefix, client.dlq_suffix)
        root, depth = name, 0
        pre, suf = client.dlq_prefix, client.dlq_suffix
        while root.startswith(pre) and root.endswith(suf) and len(root) > len(pre) + len(suf):
            root, depth = root[len(pre) : len(root) - len(suf)], depth + 1
        if root.startswith(pre) and root.endswith(suf):  # nothing left between them
            marker = " and ".join(f"{what} {text!r}" for what, text in (("prefix", pre), ("suffix", suf)) if text)
            raise InvalidName("queue", name, f"is only the dead-letter {marker}")
        self.client = client
        self.name = name
        #: The queue whose dead-letter queue this is (``depth`` levels down), or the name itself.
        self.root = root
        #: None, or which partition of a partitioned queue this is (its
        #: settings, dead-letter headers and registry entry are the queue's).
        self.partition = partition
        #: Which hash tag a partition was placed under (rqueue/placement.py; 0 = ``{<queue>/<partition>}``).
        self.salt = salt
        self.keys = QueueKeys(queue_base(client.prefix, root, depth, partition, salt), client.log_layout)
        self._plain_checked = partition is not None

    def __repr__(self) -> str:
        if self.partition is not None:
            return f"Queue({self.name!r}, partition={self.partition})"
        return f"Queue({self.name!r})"

    @property
    def dead_letter_queue(self) -> Queue:
        """The queue that receives this queue's dead letters: ``DLQ.<name>``,
        or the queue named by the dead_letter setting."""
        target = self.settings().dead_letter
        if target in DEAD_LETTER_MODES or self.partition is not None:  # a partition never takes a named target
            return Queue(self.client, self.client.dead_letter_name(self.name), self.partition, self.salt)
        return Queue(self.client, target)

    def group_keys(self, group: str, settings: Settings) -> list[str]:
        """KEYS of the group scripts for ``group`` under ``settings``."""
        target = settings.dead_letter
        if target in DEAD_LETTER_MODES:
            return self.keys.group(group).as_list()
        if self.client.cluster:
            raise InvalidSetting("dead_letter", target, CLUSTER_DEAD_LETTER)
        if self.partition is not None:
            raise InvalidSetting("dead_letter", target, PARTITION_DEAD_LETTER)
        if target == self.name:
            raise InvalidSetting("dead_letter", target, SELF_DEAD_LETTER)
        return self.keys.group(group, Queue(self.client, target).keys).as_list()

    def group_call(self, group: str, settings: Settings | None = None, consumer: str = "") -> commands.GroupCall:
        """The engine's view of ``group`` (as ``consumer``; "" for calls no
        consumer makes: purge, stats, replay) under ``settings`` (the
        defaults when None: the calls that read none)."""
        settings = settings if settings is not None else Settings()
        client = self.client
        keys = self.group_keys(group, settings)
        return commands.GroupCall.of(
            client.scripts, client.clock, client.randomness, keys, self.name, self.keys.base, group, consumer, settings
        )

    # -- dead letters -------------------------------------------------------

    def dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
    ) -> list[DeadLetter]:
        """Dead letters of this queue, oldest first, filtered by the group
        that dead-lettered them, reason, original seq range and count."""
        return list(iter_dead_letters(self, Selection(group, reason, seq_from, seq_to, limit)))

    def replay_dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> ReplayResult:
        """Returns the selected dead letters to the group that dead-lettered
        each, and only to it, with a fresh delivery count; exactly once, even
        when run twice or interrupted."""
        return replay(self, Selection(group, reason, seq_from, seq_to, limit), dry_run, progress)

    def purge_dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        progress: Progress | None = None,
        *,
        dead_lettered_to: int | None = None,
    ) -> int:
        """Deletes the selected dead letters; returns how many were deleted.
        ``dead_lettered_to`` (server ms) leaves out dead letters that arrived
        after that time, so a purge confirmed by a person deletes no more
        than what was shown."""
        return purge(self, Selection(group, reason, seq_from, seq_to, limit, dead_lettered_to), progress)

    def purge(self, group: str | None = None, progress: Progress | None = None) -> dict[str, int]:
        """Settles, as purged, every message not in flight: for ``group``, or
        for every group; a queue without groups loses its stored messages.
        In-flight deliveries stay with their consumers. Returns how many
        messages each group purged ("" for a queue without groups)."""
        groups = [check_name("group", group)] if group is not None else self.groups()
        if group is not None and group not in self.groups():
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        if not groups:
            return {"": store.purge_records(self.client.redis, self.keys, PURGE_BATCH, progress)}
        out: dict[str, int] = {}
        for g in groups:
            out[g] = 0
            call = self.group_call(g)
            while True:
                reply = commands.purge(call, PURGE_BATCH)
                out[g] += reply.purged
                if progress is not None and reply.purged:
                    progress(reply.purged)
                if not reply.more:
                    break
        return out

    def pause(self, group: str | None = None, mode: str = "hold") -> bool:
        """Pauses ``group``: its fetches hand out nothing, while acks, nacks,
        lease extensions and heartbeats go on; leases that run out meanwhile
        are offered again after :meth:`resume`, not before. Without a group,
        pauses the queue: with ``mode`` "refuse" publishes raise
        QueuePaused; with "hold" they are stored and no group hands out a
        message published after the pause until :meth:`resume`.
        Returns False when it was already so (docs/flow-control.md)."""
        if group is not None:
            check_name("group", group)
        mode = check.pause_mode(mode)
        return commands.pause(
            self.client.scripts, self.keys, group, True, mode, self.name, *self._pause_event()
        ).changed

    def resume(self, group: str | None = None) -> bool:
        """Ends the pause of ``group``, or of the queue when None, and wakes
        its waiting consumers. Returns False when it was not paused."""
        if group is not None:
            check_name("group", group)
        record, now = self._pause_event()
        return commands.pause(self.client.scripts, self.keys, group, False, "", self.name, record, now).changed

    def _pause_event(self) -> tuple[bool, str]:
        """Whether a pause or resume is recorded (the events setting names
        "paused"), and the scripts' time."""
        return EventKind.PAUSED.value in self.settings().events, self.client.clock.script_now()

    def settle_through(self, group: str, seq: int, progress: Progress | None = None) -> int:
        """Settles, for ``group``, every message with a seq up to ``seq``
        (at most the last published) that is not in flight: unread ones and
        ones waiting for a redelivery, as if acked. Deliveries a consumer of
        the group holds stay with it: its ack or its lease decides them.
        For a reader that takes messages by seq (the Spark source) and
        settles what it read in one step; running it again settles nothing
        new. Returns how many messages it settled."""
        check_name("group", group)
        check.whole_number("seq", seq, 0)
        if group not in self.groups():
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        call = self.group_call(group)
        total, after = 0, 0
        while True:
            reply = commands.settle_to(call, seq, after, PURGE_BATCH)
            total += reply.settled
            if progress is not None and reply.settled:
                progress(reply.settled)
            if not reply.more:
                return total
            after = reply.reached

    def delete(self, force: bool = False) -> int:
        """Deletes the queue: its messages, groups, dead-letter queue and
        events. De-duplication ids are left to expire with their window, but
        a message id stored before the delete is no duplicate after it (ids
        belong to the incarnation that stored them).
        Refuses with QueueInUse, deleting nothing, while consumers hold
        deliveries of it, unless ``force`` (their settles then fail).
        Returns how many keys were deleted."""
        if not check.flag("force", force) and (held := store.in_flight(self.client.redis, self.keys)):
            raise QueueInUse(self.name, held)
        deleted = store.delete_queue(self.client.redis, self.keys, self.client.prefix, self.name)
        self.client.forget(self.name)
        # Its next incarnation is no loss to this client.
        self.client.state_watch(self.name, self.keys).forget()
        return deleted

    # -- groups and retention (docs/retention.md) ---------------------------

    def check_plain(self) -> None:
        """Refuses with QueuePartitioned, once per handle, a group operation
        on a queue partitioned since this client read its layout (another
        process partitioned it); the client learns it, so that its next
        ``queue(name)`` is the partitioned one. A publish and a join need no
        such read: their scripts refuse the partitioned name."""
        if self._plain_checked:
            return
        client = self.client
        raw = store.stored_partitions(client.redis, client.prefix, self.root, client.idempotent)
        if raw is not None:
            text = raw.decode("ascii", "replace")
            client.partitioned_now(self.root, text)
            raise QueuePartitioned(self.name, text)
        self._plain_checked = True

    def create_group(self, group: str, start: Position = "first") -> int:
        """Creates ``group`` at ``start``: "first" (the oldest message
        stored, where a consumer's first join starts a group), "last"
        (only messages published from now on), a seq (the first one the
        group is handed) or an aware datetime (the first message published
        at or after it). Returns the seq the group starts after. Raises
        InvalidInput, changing nothing, for a group that exists or a
        position that is not stored (a seq beyond the last, or one or a
        time older than the oldest message stored)."""
        check_name("group", group)
        mode, value = position_args(start)
        self.check_plain()
        return commands.group_create(self.group_call(group), mode, value).floor

    def reset_group(self, group: str, to: Position, force: bool = False) -> GroupReset:
        """Moves ``group`` to the position ``to`` (as for
        :meth:`create_group`): back, and it is handed again what it had
        settled (the operator's explicit choice), or forward, and it counts
        what it skips as settled. Refuses with GroupInUse, changing
        nothing, while its consumers hold deliveries, unless ``force``:
        they are taken back, and their acks fail (UnknownDeliveryTag or
        AlreadyAcked)."""
        check_name("group", group)
        mode, value = position_args(to)
        force = check.flag("force", force)
        self.check_plain()
        reply = commands.group_reset(self.group_call(group), mode, value, force)
        return GroupReset(group, reply.previous, reply.floor, reply.cancelled, self.partition)

    def delete_group(self, group: str, force: bool = False) -> int:
        """Deletes ``group`` and its state (its dead letters stay). Refuses
        with GroupInUse while its consumers hold deliveries, unless
        ``force`` (their acks then fail). Returns how many deliveries were
        taken back."""
        check_name("group", group)
        force = check.flag("force", force)
        self.check_plain()
        return commands.group_delete(self.group_call(group), force)

    def trim(self) -> Trimmed:
        """Stores the queue's retention settings (max_age, max_length) and
        runs one bounded trim step now; publishers run it by themselves."""
        reply = trim_step(self)
        return Trimmed(reply.retained, reply.trimmed, reply.passed)

    @property
    def last_state_loss(self) -> StateLost | None:
        """The last loss of this queue's state in Redis that this client's
        publishes saw (logged at ERROR and recorded as a "state-lost"
        event when seen), or None."""
        return self.client.state_watch(self.name, self.keys).last_loss

    def events_after(self, last_id: str, count: int = 100) -> list[dict[str, str]]:
        """Events newer than the stream id ``last_id`` ("0" for all), oldest first."""
        return store.events_after(self.client.redis, self.keys, last_id, count)

    def events(self, count: int = 100) -> list[dict[str, str]]:
        """The newest ``count`` events (dead-lettered, dropped, replayed,
        purged), oldest first, each with its stream id under "id"."""
        return store.newest_events(self.client.redis, self.keys, check.whole_number("count", count, 1))

    def settings(self) -> Settings:
        """The settings in force for this queue (patterns stored in Redis)."""
        return self.client.resolved_settings(self.name)

    # -- publishing ---------------------------------------------------------

    def publish(
        self,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        delay: float | None = None,
        mandatory: bool = False,
        durable: bool = False,
        priority: int = 0,
        ttl: float | None = None,
        key: str | None = None,
    ) -> PublishResult:
        """Appends one message; returns once Redis has applied it.

        ``id`` de-duplicates within the queue's dedup_window (seconds);
        ``delay`` (seconds) holds the message back; ``mandatory`` refuses the
        publish with Unroutable when the queue has no group. ``durable``
        also waits until the client's durable_replicas replicas have it and,
        where the server has WAITAOF and AOF is on, until it is fsynced;
        NotDurable is raised (the message is stored) when that falls short.
        ``priority`` (0 to 9, higher first) hands it out before messages of
        lower priority, after due redeliveries (docs/flow-control.md).
        ``key``, an ordering key, hands one key's messages out in seq order,
        key_concurrency of them at most at once per group (same doc).
        """
        return self.publish_many(
            [payload],
            headers=[headers] if headers else None,
            ids=[id],
            delay=delay,
            mandatory=mandatory,
            durable=durable,
            priority=priority or None,
            ttl=ttl,
            key=key,
        )[0]

    def publish_many(
        self,
        payloads: Sequence[bytes],
        headers: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None = None,
        ids: Sequence[str | None] | None = None,
        delay: float | None = None,
        mandatory: bool = False,
        durable: bool = False,
        priority: int | Sequence[int] | None = None,
        ttl: float | None = None,
        key: str | Sequence[str | None] | None = None,
    ) -> list[PublishResult]:
        """Appends many messages in one round trip, in order (``durable``,
        ``priority``, ``key``: see :meth:`publish`; each is one for all or
        one per message).

        ``headers`` is one mapping for all messages or one per message;
        ``ids`` one per message (None for no id). Every message is checked
        before anything is sent: one bad message fails the whole call and
        stores nothing.
        """
        with sending(self.name, payloads) as trace:
            flow: dict[str, Any] = {"trace": trace, "priority": priority, "ttl": ttl, "key": key}
            prepared = prepare(self, payloads, headers, ids, delay, mandatory, durable, **flow)
            return send(self, prepared) if prepared is not None else []

    # -- consuming ----------------------------------------------------------

    def consumer(
        self,
        group: str,
        name: str | None = None,
        prefetch: int | None = None,
        liveness: float | None = None,
        **settings: Any,
    ) -> Consumer:
        """Joins ``group`` (created on first use, starting at the oldest
        retained message) as consumer ``name`` (generated when None).

        ``prefetch`` and other settings given here beat the stored patterns
        for this consumer. ``liveness`` (seconds, default ack_wait) is how
        long the consumer may stay silent (no fetch, in_progress or
        heartbeat) before a worker of the group removes it as dead.
        """
        if prefetch is not None:
            settings["prefetch"] = prefetch
        return Consumer(self, group, name, settings, liveness)

    def wait_settled(self, group: str | None = None, timeout: float | None = None) -> dict[str, int]:
        """Waits until ``group`` (every group when None) has settled
        (acked, dead-lettered, dropped or purged) every message published
        before the call, as Dramatiq's ``broker.join`` does; for tests and
        batch jobs. Returns, per group, the last seq waited for. Raises
        rqueue.waiting.NotSettled (a TimeoutError) after ``timeout``
        seconds (None: no limit), InvalidInput for a group the queue does
        not have or a queue without groups."""
        return wait_settled([self], self.name, group, timeout)

    # -- inspection ---------------------------------------------------------

    def groups(self) -> list[str]:
        """Names of the queue's groups, sorted."""
        return store.group_names(self.client.redis, self.keys)

    def result(self, seq: int | str | PublishResult, timeout: float = 0.0, *, group: str | None = None) -> Result:
        """The stored outcome of message ``seq`` (or of the PublishResult
        publish returned, or of the message published with the id ``seq``,
        a str, found while it is inside the de-duplication window) for ``group``: a queue whose ``results`` setting
        is on keeps one per group and settled message for ``result_ttl``,
        the handler's return value or its :class:`~rqueue.stored_results.Failure`.
        ``group`` may be left out when the queue has one group (or none
        yet: the first to join is the one); with several it is InvalidInput
        (each group keeps its own), and so is a group the queue does not
        have while it has others. Waits up to ``timeout`` seconds for it,
        polling with backoff; raises :class:`rqueue.ResultTimeout` when
        none came (docs/results.md)."""
        if isinstance(seq, str):
            found_seq = self.status(result_id(seq)).seq
            if not found_seq:
                raise unknown_id(self.name, seq)
            seq = found_seq
        seq, published = asked(self.name, seq)
        timeout = check.seconds("timeout", timeout)
        if group is not None:
            check_name("group", group)
        clock = self.client.clock
        deadline = clock.monotonic() + timeout
        pause = FIRST_RESULT_POLL
        chosen = None
        while True:
            if chosen is None:  # until the queue has a group (a worker joined): then its result is the one
                groups = self.groups()
                chosen = result_group(self.name, group, groups)
            # Without a group yet, a PublishResult's incarnation still tells
            # whether Redis lost the message (ResultLost), so it is read.
            if chosen is not None or published is not None:
                raw, incarnation = store.read_result(self.client.redis, self.keys, seq, chosen)
                found = judged(self.name, seq, published, chosen, groups, raw, incarnation)
                if found is not None:
                    return found
                if not groups:
                    chosen = None  # a named group with no result yet: its worker may still join
            left = deadline - clock.monotonic()
            if left <= 0:
                raise ResultTimeout(self.name, seq, timeout, group if group is not None else chosen)
            clock.sleep(min(pause, left))
            pause = min(pause * 1.5, LAST_RESULT_POLL)

    def peek(self, n: int = 10, after: int = 0) -> list[Message]:
        """Up to ``n`` stored messages with seq > ``after``, oldest first,
        without claiming them."""
        check.whole_number("n", n, 1)
        check.whole_number("after", after, 0)
        return [self._message(seq, rec) for seq, rec in store.records_after(self.client.redis, self.keys, after, n)]

    def peek_group(self, group: str, n: int = 10) -> list[Message]:
        """The next ``n`` messages ``group`` would be offered (due
        redeliveries first, then new ones), without claiming them. A delayed
        publish shows here until the group's cursor passes it."""
        check_name("group", group)
        check.whole_number("n", n, 1)
        r = self.client.redis
        if not store.has_group(r, self.keys, group):
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        ready, cursor = store.group_position(r, self.keys, group, n)
        out = [m for m in (self._read(seq) for seq in ready) if m is not None]
        if len(out) < n and cursor < store.last_seq(r, self.keys):
            out += self.peek(n - len(out), after=cursor)
        return out[:n]

    def status(self, id: str | None = None, *, seq: int | None = None) -> MessageStatus:
        """What became of the message with id ``id`` (found while its id is
        inside the de-duplication window) or with ``seq``: published,
        delayed, or per group in flight (by whom, how many deliveries),
        waiting for a redelivery, acked, dead-lettered or dropped (the
        reason), from one consistent snapshot. UNKNOWN when there is no
        such message. docs/retention.md#message-status."""
        if (id is None) == (seq is None):
            raise InvalidInput("give a message id or seq=, not both and not neither")
        if id is not None:
            check_message_id(id)
        if seq is not None:
            check.whole_number("seq", seq, 1)
        r = self.client
        return commands.status(r.scripts, self.keys, r.clock.script_now(), id, seq, self.groups(), self.name)

    def _read(self, seq: int) -> Message | None:
        rec = store.record(self.client.redis, self.keys, seq)
        return None if rec is None else self._message(seq, rec)

    def _message(self, seq: int, rec: bytes) -> Message:
        published, headers, data = decode_record(rec, f"{self.keys.msgs}[{seq}]")
        return Message(seq, data, headers, published)

    def stats(self) -> QueueStats:
        """Depth, schedule, dead letters and per-group figures."""
        groups = [commands.stats(self.group_call(g)) for g in self.groups()]
        now = self.client.clock.script_now()
        last, depth, scheduled, dead = store.queue_figures(
            self.client.redis, self.keys, self.dead_letter_queue.keys, int(now) if now else None
        )
        paused = store.pause_state(self.client.redis, self.keys)
        return QueueStats(self.name, last, depth, scheduled, dead, groups, paused=paused)
