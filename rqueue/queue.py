"""Queues: publishing, inspection, and handing out consumers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

from . import constants as C
from .deadletters import DeadLetter, Progress, ReplayResult, Selection, iter_dead_letters, purge, replay
from .engine.durable import publish_durably
from .engine.keys import QueueKeys, queue_base, registry_key
from .engine.record import decode_record, encode_body
from .errors import (
    InvalidInput,
    InvalidName,
    InvalidSetting,
    NotDurable,
    PayloadTooLarge,
    Unroutable,
    from_script_error,
)
from .names import check_message_id, check_name
from .results import ConsumerStats, GroupStats, PublishResult, QueueStats
from .settings import DEAD_LETTER_MODES, Settings

if TYPE_CHECKING:
    from .client import Client
    from .consumer import Consumer


# A script touches one hash slot; a named queue has its own.
CLUSTER_DEAD_LETTER = (
    "on Redis Cluster dead letters go to the queue's own dead-letter queue (dead_letter='dlq', "
    "which shares its slot) or are dropped ('none'); a named queue lives in another slot"
)
# Dead letters of a partition stay with that partition (replay returns them there).
PARTITION_DEAD_LETTER = (
    "a partitioned queue keeps each partition's dead letters in that partition's own dead-letter queue "
    "(dead_letter='dlq') or drops them ('none'); a named queue would mix the partitions' seqs"
)


def _delay_ms(delay: float | None) -> int:
    if delay is None:
        return 0
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= C.MAX_DELAY:
        raise InvalidInput(f"delay {delay!r} must be a number of seconds from 0 to {C.MAX_DELAY:.0f}")
    return int(round(delay * 1000))


class Message:
    """A stored message seen without claiming it (peek, dead-letter listing)."""

    __slots__ = ("seq", "data", "headers", "published_ms")

    def __init__(self, seq: int, data: bytes, headers: dict[str, str], published_ms: int) -> None:
        self.seq = seq
        self.data = data
        self.headers = headers
        self.published_ms = published_ms

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, data={self.data[:40]!r}, headers={self.headers!r})"


class Queue:
    """A named queue. Obtain one with :meth:`rqueue.Client.queue`.

    ``DLQ.<name>`` names the dead-letter queue of ``<name>``; it is a queue
    like any other (it can be peeked and consumed) stored in the same Redis
    Cluster slot as its source.
    """

    def __init__(self, client: Client, name: str, partition: int | None = None) -> None:
        check_name("queue", name)
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
        self.keys = QueueKeys(queue_base(client.prefix, root, depth, partition))

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
            return Queue(self.client, self.client.dead_letter_name(self.name), self.partition)
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
        return self.keys.group(group, Queue(self.client, target).keys).as_list()

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
    ) -> int:
        """Deletes the selected dead letters; returns how many were deleted."""
        return purge(self, Selection(group, reason, seq_from, seq_to, limit), progress)

    def purge(self, group: str | None = None, progress: Progress | None = None) -> dict[str, int]:
        """Settles, as purged, every message not in flight: for ``group``, or
        for every group; a queue without groups loses its stored messages.
        In-flight deliveries stay with their consumers. Returns how many
        messages each group purged ("" for a queue without groups)."""
        groups = [check_name("group", group)] if group is not None else self.groups()
        if group is not None and group not in self.groups():
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        if not groups:
            return {"": self._purge_records(progress)}
        out: dict[str, int] = {}
        for g in groups:
            out[g] = 0
            while True:
                try:
                    purged, more = self.client.scripts.purge(
                        keys=self.group_keys(g, Settings()), args=self._group_argv(g, "", Settings(), [C.PURGE_BATCH])
                    )
                except redis.ResponseError as exc:
                    raise from_script_error(exc, queue=self.name, where=self.keys.base) from None
                out[g] += purged
                if progress is not None and purged:
                    progress(purged)
                if not more:
                    break
        return out

    def _purge_records(self, progress: Progress | None) -> int:
        r = self.client.redis
        last = int(r.hget(self.keys.meta, "seq") or 0)
        start = int(r.hget(self.keys.meta, "trimmed") or 0) + 1
        deleted = 0
        for low in range(start, last + 1, C.PURGE_BATCH):
            seqs = list(range(low, min(last, low + C.PURGE_BATCH - 1) + 1))
            pipe = r.pipeline(transaction=True)
            pipe.hdel(self.keys.msgs, *seqs)
            pipe.hset(self.keys.meta, "trimmed", seqs[-1])
            deleted += pipe.execute()[0]
            if progress is not None:
                progress(len(seqs))
        return deleted

    def delete(self) -> int:
        """Deletes the queue: its messages, groups, dead-letter queue and
        events (reading its keys from its own registry, so no SCAN is
        needed). De-duplication ids are left to expire with their window.
        Consumers still working on it get errors. Returns how many keys
        were deleted."""
        r = self.client.redis
        keys: list[str] = []
        level: QueueKeys | None = self.keys
        while level is not None:
            groups = [g.decode() for g in r.hkeys(level.floors)]
            keys += level.all_static()
            for g in groups:
                keys += level.group(g).group_only()
            # the next dead-letter level, if it was ever written
            below = level.dead_letters
            level = below if r.exists(below.meta, below.msgs) else None
        deleted = 0
        for start in range(0, len(keys), 500):
            deleted += r.delete(*keys[start : start + 500])
        r.srem(registry_key(self.client.prefix), self.name)
        self.client._registered.discard(self.name)
        return deleted

    def events_after(self, last_id: str, count: int = 100) -> list[dict[str, str]]:
        """Events newer than the stream id ``last_id`` ("0" for all), oldest first."""
        entries = self.client.redis.xrange(self.keys.events, min=f"({last_id}" if last_id != "0" else "-", count=count)
        return [{"id": i.decode(), **{k.decode(): v.decode() for k, v in f.items()}} for i, f in entries]

    def events(self, count: int = 100) -> list[dict[str, str]]:
        """The newest ``count`` events (dead-lettered, dropped, replayed,
        purged), oldest first, each with its stream id under "id"."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidInput(f"count must be a whole number >= 1, not {count!r}")
        entries = self.client.redis.xrevrange(self.keys.events, count=count)
        return [{"id": i.decode(), **{k.decode(): v.decode() for k, v in f.items()}} for i, f in reversed(entries)]

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
    ) -> PublishResult:
        """Appends one message; returns once Redis has applied it.

        ``id`` de-duplicates within the queue's dedup_window (seconds);
        ``delay`` (seconds) holds the message back; ``mandatory`` refuses the
        publish with Unroutable when the queue has no group. ``durable``
        also waits until the client's durable_replicas replicas have it and,
        where the server has WAITAOF and AOF is on, until it is fsynced;
        NotDurable is raised (the message is stored) when that falls short.
        """
        return self.publish_many(
            [payload],
            headers=[headers] if headers else None,
            ids=[id],
            delay=delay,
            mandatory=mandatory,
            durable=durable,
        )[0]

    def publish_many(
        self,
        payloads: Sequence[bytes],
        headers: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None = None,
        ids: Sequence[str | None] | None = None,
        delay: float | None = None,
        mandatory: bool = False,
        durable: bool = False,
    ) -> list[PublishResult]:
        """Appends many messages in one round trip, in order (``durable``:
        see :meth:`publish`).

        ``headers`` is one mapping for all messages or one per message;
        ``ids`` one per message (None for no id). Every message is checked
        before anything is sent: one bad message fails the whole call and
        stores nothing.
        """
        prepared = self._prepare(payloads, headers, ids, delay, mandatory, durable)
        return self._send(prepared) if prepared is not None else []

    def _prepare(
        self,
        payloads: Sequence[bytes],
        headers: Any,
        ids: Sequence[str | None] | None,
        delay: float | None,
        mandatory: bool,
        durable: bool,
        positions: Sequence[int] | None = None,
    ) -> _Prepared | None:
        """Checks every message of a publish_many call and encodes it; None
        for an empty batch. Raises before anything is sent; an error names
        the message by its index, or by ``positions[index]`` (its place in
        the caller's batch) when given."""
        if type(payloads) is not list and (isinstance(payloads, (bytes, str)) or not isinstance(payloads, Sequence)):
            raise InvalidInput("payloads must be a sequence of bytes (for one message use publish())")
        count = len(payloads)
        if count == 0:
            return None
        per_headers = self._per_message(headers, count, "headers")
        per_ids = [None] * count if ids is None else list(ids)
        if len(per_ids) != count:
            raise InvalidInput(f"ids has {len(per_ids)} entries for {count} payloads")
        if not isinstance(durable, bool):
            raise InvalidInput(f"durable must be True or False, not {durable!r}")
        delay_ms = _delay_ms(delay)
        settings = self.settings()
        args: list[Any] = []
        single = count == 1 and positions is None
        for i, payload in enumerate(payloads):
            where = i if positions is None else positions[i]
            try:
                hlen, body = encode_body(payload, per_headers[i])
                msg_id = check_message_id(per_ids[i])
            except InvalidInput as exc:
                if single:
                    raise
                raise InvalidInput(f"message {where} of the batch: {exc}") from None
            size = len(body) - hlen
            if size > settings.max_payload:
                raise PayloadTooLarge(size, settings.max_payload, None if single else where)
            args.append((msg_id, f"{delay_ms}:{hlen}" if hlen else delay_ms, body))
        head = [
            self.client.clock.script_now(),
            int(settings.dedup_window * 1000),
            "1" if mandatory else "0",
            self.keys.wake_channel,
        ]
        calls = [self._publish_call(args[start : start + C.MAX_BATCH]) for start in range(0, len(args), C.MAX_BATCH)]
        return _Prepared(
            [(keys, head + call_args) for keys, call_args in calls],
            settings,
            payloads,
            per_headers,
            per_ids,
            delay,
            durable,
        )

    def _send(self, prepared: _Prepared) -> list[PublishResult]:
        """Runs the script calls of a prepared publish; returns once Redis applied them."""
        script = self.client.scripts.publish
        calls = prepared.calls
        try:
            if prepared.durable:
                replies = publish_durably(self.client, self.keys.meta, script, calls)
            elif len(calls) == 1:
                replies = [script(keys=calls[0][0], args=calls[0][1])]
            else:
                pipe = self.client.scripts.pipeline()
                for keys, call_args in calls:
                    script(keys=keys, args=call_args, client=pipe)
                replies = pipe.execute()
        except NotDurable as exc:
            self.client._register(self.name)
            exc.results = _results(exc.results, self.partition)
            raise
        except redis.ResponseError as exc:
            err = from_script_error(exc, queue=self.name)
            alternate = prepared.settings.alternate
            if isinstance(err, Unroutable) and alternate is not None:
                return self._to_alternate(
                    alternate, prepared.payloads, prepared.headers, prepared.ids, prepared.delay, prepared.durable
                )
            raise err from None
        self.client._register(self.name)
        return _results(replies, self.partition)

    def _publish_call(self, messages: list[tuple[str, int | str, bytes]]) -> tuple[list[str], list[Any]]:
        """KEYS and per-message ARGV of one publish.lua call; a message is
        (id or "", delay_ms, or "<delay_ms>:<headers_len>" when the body
        starts with headers, body)."""
        keys = self.keys.publish_keys()
        args: list[Any] = []
        for msg_id, timing, body in messages:
            if msg_id:
                keys.append(self.keys.message_id(msg_id))
                args += [len(keys), timing, body]
            else:
                args += [0, timing, body]
        return keys, args

    def _to_alternate(
        self,
        alternate: str,
        payloads: Sequence[bytes],
        headers: list[Any],
        ids: list[Any],
        delay: float | None,
        durable: bool,
    ) -> list[PublishResult]:
        results = self.client.queue(alternate).publish_many(
            payloads, headers=headers, ids=ids, delay=delay, durable=durable
        )
        return [PublishResult(r.seq, r.duplicate, alternate) for r in results]

    @staticmethod
    def _per_message(value: Any, count: int, what: str) -> list[Any]:
        if value is None or type(value) is dict or isinstance(value, Mapping):
            return [value] * count
        values = list(value)
        if len(values) != count:
            raise InvalidInput(f"{what} has {len(values)} entries for {count} payloads")
        return values

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
        from .consumer import Consumer

        if prefetch is not None:
            settings["prefetch"] = prefetch
        return Consumer(self, group, name, settings, liveness)

    # -- inspection ---------------------------------------------------------

    def groups(self) -> list[str]:
        """Names of the queue's groups, sorted."""
        return sorted(g.decode() for g in self.client.redis.hkeys(self.keys.floors))

    def peek(self, n: int = 10, after: int = 0) -> list[Message]:
        """Up to ``n`` stored messages with seq > ``after``, oldest first,
        without claiming them."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInput(f"n must be a whole number >= 1, not {n!r}")
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise InvalidInput(f"after must be a whole number >= 0 (a seq), not {after!r}")
        r = self.client.redis
        last = int(r.hget(self.keys.meta, "seq") or 0)
        start = max(after, int(r.hget(self.keys.meta, "trimmed") or 0)) + 1
        out: list[Message] = []
        while start <= last and len(out) < n:
            seqs = list(range(start, min(last, start + 4 * n) + 1))
            for seq, rec in zip(seqs, r.hmget(self.keys.msgs, seqs)):
                if rec is not None and len(out) < n:
                    published, headers, data = decode_record(rec, f"{self.keys.msgs}[{seq}]")
                    out.append(Message(seq, data, headers, published))
            start = seqs[-1] + 1
        return out

    def peek_group(self, group: str, n: int = 10) -> list[Message]:
        """The next ``n`` messages ``group`` would be offered (due
        redeliveries first, then new ones), without claiming them. A delayed
        publish shows here until the group's cursor passes it."""
        check_name("group", group)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInput(f"n must be a whole number >= 1, not {n!r}")
        r = self.client.redis
        gk = self.group_keys(group, Settings())
        if not r.hexists(self.keys.floors, group):
            raise InvalidInput(f"queue {self.name!r} has no group {group!r}")
        ready = [int(s) for s in r.zrange(gk[6], 0, n - 1)]
        cursor = int(r.hget(gk[4], "cursor") or 0)
        out = [m for m in (self._read(seq) for seq in ready) if m is not None]
        last = int(r.hget(self.keys.meta, "seq") or 0)
        for m in self.peek(n, after=cursor) if cursor < last else []:
            if len(out) >= n:
                break
            out.append(m)
        return out[:n]

    def _read(self, seq: int) -> Message | None:
        rec = self.client.redis.hget(self.keys.msgs, seq)
        if rec is None:
            return None
        published, headers, data = decode_record(rec, f"{self.keys.msgs}[{seq}]")
        return Message(seq, data, headers, published)

    def stats(self) -> QueueStats:
        """Depth, schedule, dead letters and per-group figures."""
        r = self.client.redis
        now = self.client.clock.script_now()
        groups = []
        for g in self.groups():
            try:
                flat = self.client.scripts.stats(
                    keys=self.group_keys(g, Settings()), args=self._group_argv(g, "", Settings(), ())
                )
            except redis.ResponseError as exc:
                raise from_script_error(exc, queue=self.name, where=self.keys.base) from None
            groups.append(_group_stats(g, flat))
        # Not MULTI: Redis refuses every command queued in a transaction while
        # it is over maxmemory, and stats matter most then.
        pipe = r.pipeline(transaction=False)
        pipe.hget(self.keys.meta, "seq")
        pipe.hlen(self.keys.msgs)
        pipe.zcount(self.keys.sched, f"({now}" if now else f"({_server_ms(r)}", "+inf")
        pipe.hlen(self.dead_letter_queue.keys.msgs)
        last, depth, scheduled, dead = pipe.execute()
        return QueueStats(self.name, int(last or 0), depth, scheduled, dead, groups)

    def _settings_argv(self, settings: Settings) -> tuple[list[Any], str, str]:
        """The parts of the group ARGV that follow from ``settings`` alone:
        ARGV[4..6], and the failure policy (ARGV[7]) before and after the
        random number of each call; a consumer computes them once per
        settings object."""
        before, after = settings.failure_policy(self.name)
        return settings.argv(), before, after

    def _group_argv(
        self,
        group: str,
        consumer: str,
        settings: Settings,
        extra: Iterable[Any],
        fixed: tuple[list[Any], str, str] | None = None,
    ) -> list[Any]:
        """ARGV of a group script (lua/includes/group_args.lua); ``fixed`` is
        :meth:`_settings_argv` of ``settings`` when the caller has it."""
        head, before, after = fixed if fixed is not None else self._settings_argv(settings)
        return [
            group,
            consumer,
            self.client.clock.script_now(),
            *head,
            before + repr(self.client.randomness.unit()) + after,
            *extra,
        ]


class _Prepared(NamedTuple):
    """A checked publish_many call, ready to send: the script calls (KEYS,
    ARGV) and what a fall-back to the alternate queue needs."""

    calls: list[tuple[list[str], list[Any]]]
    settings: Settings
    payloads: Sequence[bytes]
    headers: list[Any]
    ids: list[Any]
    delay: float | None
    durable: bool


def _results(replies: list[Any], partition: int | None = None) -> list[PublishResult]:
    """PublishResults from publish.lua replies (seq, duplicate flag, ...)."""
    out: list[PublishResult] = []
    for reply in replies:
        out += [PublishResult(int(reply[j]), reply[j + 1] == 1, None, partition) for j in range(0, len(reply), 2)]
    return out


def _server_ms(r: Any) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _group_stats(name: str, flat: list[Any]) -> GroupStats:
    values: dict[str, Any] = {}
    consumers: list[ConsumerStats] = []
    now = int(flat[1])  # the script puts "now" first
    i = 0
    while i < len(flat):
        key = flat[i].decode() if isinstance(flat[i], bytes) else flat[i]
        if key == "consumer":
            deadline, live = flat[i + 3], flat[i + 4]
            beat = int(deadline) - int(live or 0) if deadline not in (b"", "") else None
            idle = None if beat is None else max(0, now - beat)
            consumers.append(ConsumerStats(flat[i + 1].decode(), int(flat[i + 2]), beat, idle))
            i += 5
        else:
            values[key] = flat[i + 1]
            i += 2

    def num(key: str) -> int:
        return int(values.get(key) or 0)

    oldest = values.get("oldest_lease_ms")
    return GroupStats(
        name=name,
        ack_floor=num("floor"),
        cursor=num("cursor"),
        pending=num("last_seq") - num("stored_floor") - num("acked_above_floor") + num("reopened_below_floor"),
        in_flight=num("in_flight"),
        expired_leases=num("expired_leases"),
        oldest_lease_age_ms=int(oldest) if oldest not in (None, b"", "") else None,
        ready=num("ready"),
        delayed=num("delayed"),
        acked=num("acked"),
        nacked=num("nacked"),
        redelivered=num("redelivered"),
        expired=num("expired"),
        dead_lettered=num("dead_lettered"),
        dropped=num("dropped"),
        consumers=sorted(consumers, key=lambda c: c.name),
    )
