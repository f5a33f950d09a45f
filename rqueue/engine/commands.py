"""One typed function per script: each builds its script's KEYS and ARGV,
runs it, and returns its reply as named values. Error replies and the
driver's transport errors become rqueue exceptions in one place
(:func:`run`).

The ARGV block every group script starts with (lua/includes/group_args.lua)
is built by :class:`GroupCall`, which keeps the parts that follow from the
settings so that a consumer computes them once per settings object.

Each group command is a builder of its ARGV, a parser of its reply and the
sync call that joins them; rqueue.engine.async_commands joins the same
builders and parsers with an await.

Long because every script's builder, parser and call belong together: one
place knows each script's arguments and reply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, Protocol, TypeVar

import redis

from ..clock import Clock
from ..connection.cluster import not_run
from ..errors import ConnectionLost, CorruptRecord, DeliveryError, NotPermitted, OutOfMemory, from_script_error
from ..randomness import Randomness
from ..results import ConsumerStats, GroupMessageStatus, GroupStats, MessageState, MessageStatus, PublishResult
from .keys import (
    FETCH_PLAIN_KEYS,
    SETTLE_KEYS,
    QueueKeys,
    ack_keys,
    call_keys_of,
    fetch_plain_keys,
    settle_keys,
    side_of,
)
from .record import SplitRecord
from .scripts import Script, ScriptPipeline, Scripts, sent_stream_log

T = TypeVar("T")

# Errors of the driver that mean the call did not get an answer: the call
# may or may not have run (unless not_run proves it did not).
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
    ConnectionError,
    OSError,
)


def translate(exc: BaseException, queue: str = "", where: str = "") -> BaseException:
    """The rqueue exception for an error a Redis call raised: a script's
    error code, memory, permission or transport errors. Anything else is
    returned as it is."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return OutOfMemory(str(exc))
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return NotPermitted(where or queue, str(exc))
    if isinstance(exc, redis.ResponseError) and not isinstance(exc, redis.exceptions.ClusterError):
        mapped = from_script_error(exc, queue=queue, where=where)
        if mapped is exc and not_run(exc):  # MOVED, TRYAGAIN, ... outside a retrier's budget
            return ConnectionLost(str(exc), applied=False)
        return mapped
    if isinstance(exc, TRANSPORT_ERRORS):
        return ConnectionLost(f"{type(exc).__name__}: {exc}", applied=False if not_run(exc) else None)
    return exc


def with_memory_figures(error: BaseException, info_memory: Callable[[], Any]) -> BaseException:
    """``error``, and when it is an OutOfMemory without figures, one that
    names Redis's used memory and maxmemory (``info_memory()``: INFO memory
    of the server that refused, read once on this error path; left out when
    it cannot be read)."""
    if not lacks_memory_figures(error):
        return error
    try:
        info = info_memory()
    except Exception:  # the refusal is what matters: said without figures
        return error
    return memory_figured(error, info)


def lacks_memory_figures(error: BaseException) -> bool:
    """Whether ``error`` is an OutOfMemory that does not name the memory yet
    (the asyncio client reads INFO memory, awaited, only then)."""
    return isinstance(error, OutOfMemory) and error.used is None


def memory_figured(error: BaseException, info: Any) -> BaseException:
    """``error`` (an OutOfMemory) naming the used memory and maxmemory of
    ``info`` (a server's INFO memory); ``error`` itself when ``info`` lacks
    them."""
    try:
        used, limit = int(info["used_memory"]), int(info["maxmemory"])
    except Exception:  # the refusal is what matters: said without figures
        return error
    assert isinstance(error, OutOfMemory)
    return OutOfMemory(error.why, used, limit)


def run(
    script: Script, keys: Sequence[Any], args: Sequence[Any], queue: str, where: str, stream: bool | None = None
) -> Any:
    """``script`` called with ``keys`` and ``args``; every error it raises
    is translated (:func:`translate`), with the driver's error as cause.
    ``stream``: sent_stream_log(keys), when the caller knows it."""
    try:
        return script(keys, args, stream=stream)
    except (redis.RedisError, OSError) as exc:
        raise translate(exc, queue, where) from exc


def guarded(call: Callable[[], T], queue: str = "", where: str = "") -> T:
    """``call()`` (plain Redis commands), its errors translated as :func:`run`'s."""
    try:
        return call()
    except (redis.RedisError, OSError) as exc:
        raise translate(exc, queue, where) from exc


# -- the group scripts ---------------------------------------------------------


class GroupSettings(Protocol):
    """The settings a group script is sent (rqueue.Settings has them)."""

    @property
    def ack_wait(self) -> float: ...
    @property
    def max_inflight(self) -> int: ...
    @property
    def prefetch(self) -> int: ...
    @property
    def max_deliveries(self) -> int: ...
    @property
    def redelivery_delay(self) -> float: ...
    @property
    def redelivery_multiplier(self) -> float: ...
    @property
    def effective_max_redelivery_delay(self) -> float: ...
    @property
    def redelivery_jitter(self) -> float: ...
    @property
    def dead_letter(self) -> str: ...
    @property
    def retry_deadline(self) -> float | None: ...
    @property
    def rate_limit(self) -> int: ...
    @property
    def rate_period(self) -> float: ...
    @property
    def key_concurrency(self) -> int: ...
    @property
    def key_rate_limit(self) -> int: ...
    @property
    def key_rate_period(self) -> float: ...
    @property
    def wait_in_redis(self) -> bool: ...


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def rate_suffix(settings: GroupSettings) -> str:
    """What follows fetch's token (lua/fetch.lua, ARGV[9]): the group's rate
    limit, and the ordering key settings when they are not the defaults;
    "" for a group with neither (most), which the script parses not at all."""
    group = f":{settings.rate_limit}:{_ms(settings.rate_period)}"
    if settings.key_concurrency != 1 or settings.key_rate_limit:
        return f"{group}:{settings.key_concurrency}:{settings.key_rate_limit}:{_ms(settings.key_rate_period)}"
    return group if settings.rate_limit else ""


def failure_policy(settings: GroupSettings, queue: str) -> tuple[str, str]:
    """ARGV[7] of the group scripts, split where each call's random number
    goes: the words before it (max_deliveries, the redelivery delays in ms
    and factors, and the retry deadline in ms when one is set) and after it (the dead-letter mode and the queue's name),
    with their spaces."""
    before = " ".join(
        str(v)
        for v in (
            settings.max_deliveries,
            _ms(settings.redelivery_delay),
            repr(float(settings.redelivery_multiplier)),
            _ms(settings.effective_max_redelivery_delay),
            repr(float(settings.redelivery_jitter)),
            *(() if settings.retry_deadline is None else (_ms(settings.retry_deadline),)),
        )
    )
    return before + " ", f" {'drop' if settings.dead_letter == 'none' else 'dlq'} {queue}"


@dataclass(frozen=True)
class GroupArgs:
    """What a call of a group script needs besides its own arguments and the
    connection: the group's KEYS, and ARGV[1..7] less the clock and the
    random number, which every call adds (lua/includes/group_args.lua).
    Shared by the sync calls (:class:`GroupCall`) and the async ones
    (rqueue.engine.async_commands)."""

    clock: Clock
    randomness: Randomness
    keys: list[str]
    ack_keys: list[str]
    settle_keys: list[str]  # what the scripts :meth:`GroupCall.settle` runs are sent (keys.settle_keys)
    group: str
    consumer: str
    head: tuple[int, int, int]  # ack_wait (ms), max_inflight, prefetch
    policy: tuple[str, str]  # the failure policy's words before and after the random number
    queue: str  # for error messages
    where: str  # the queue's key base, for error messages
    # "" or ":<rate_limit>:<rate_period ms>", or with ordering key settings
    # ":<rate_limit>:<rate_period ms>:<key_concurrency>:<key_rate_limit>:<key_rate_period ms>",
    # after fetch's token (lua/fetch.lua)
    rate: str
    # fetch.lua is sent the first FETCH_PLAIN_KEYS keys until it says the queue
    # has priority or keyed messages (RQ_FLOW_KEYS, before any write); then
    # every key, from then on (flow[0] True) for this call's holder. A group
    # with a rate limit sends every key from the start.
    fetch_keys: list[str]
    flow: list[bool]
    # The consumer may wait in Redis for the queue's wake-up when idle (the
    # setting wait_in_redis, where its client can): its fetches that find
    # nothing, and whose caller would wait, ask to make it the queue's
    # waiter (a negative n, lua/fetch.lua).
    marks: bool
    # The calls this consumer fetched (a stream log's call records), by
    # which its acks go as ranges: a hint (CallSpans).
    spans: CallSpans
    # Where this consumer's next claim likely starts (ClaimGuess).
    guess: ClaimGuess
    # sent_stream_log of keys, fetch_keys, ack_keys and settle_keys: which
    # of a script's texts a call sent them runs, and so the shape of its
    # reply. Worked out here once, as the lists are fixed, not per call.
    keys_stream: bool
    fetch_keys_stream: bool
    ack_keys_stream: bool
    settle_keys_stream: bool

    @staticmethod
    def fields_of(
        clock: Clock,
        randomness: Randomness,
        keys: list[str],
        queue: str,
        where: str,
        group: str,
        consumer: str,
        settings: GroupSettings,
    ) -> dict[str, Any]:
        """The fields for ``settings``, by name."""
        fetch_keys = fetch_plain_keys(keys)
        acks, settles = ack_keys(keys), settle_keys(keys)
        return {
            "clock": clock,
            "randomness": randomness,
            "keys": keys,
            "ack_keys": acks,
            "settle_keys": settles,
            "group": group,
            "consumer": consumer,
            "head": (_ms(settings.ack_wait), settings.max_inflight, settings.prefetch),
            "policy": failure_policy(settings, queue),
            "queue": queue,
            "where": where,
            "rate": rate_suffix(settings),
            "fetch_keys": fetch_keys,
            # a rate limit (the rate window, KEYS[20]) or key settings: every key, every fetch
            "flow": [len(keys) <= FETCH_PLAIN_KEYS or rate_suffix(settings) != ""],
            "marks": settings.wait_in_redis,
            "spans": CallSpans(),
            "guess": ClaimGuess(),
            "keys_stream": sent_stream_log(keys),
            "fetch_keys_stream": sent_stream_log(fetch_keys),
            "ack_keys_stream": sent_stream_log(acks),
            "settle_keys_stream": sent_stream_log(settles),
        }

    def argv(self, extra: Sequence[Any]) -> list[Any]:
        """The group ARGV followed by the script's own arguments."""
        before, after = self.policy
        return [
            self.group,
            self.consumer,
            self.clock.script_now(),
            *self.head,
            before + repr(self.randomness.unit()) + after,
            *extra,
        ]


@dataclass(frozen=True)
class GroupCall(GroupArgs):
    """:class:`GroupArgs` with the scripts of a sync client, which run them."""

    scripts: Scripts

    @classmethod
    def of(
        cls,
        scripts: Scripts,
        clock: Clock,
        randomness: Randomness,
        keys: list[str],
        queue: str,
        where: str,
        group: str,
        consumer: str,
        settings: GroupSettings,
    ) -> GroupCall:
        fields = GroupArgs.fields_of(clock, randomness, keys, queue, where, group, consumer, settings)
        fields["marks"] = fields["marks"] and wakes_usable(scripts)
        return cls(scripts=scripts, **fields)

    def run(self, script: Script, extra: Sequence[Any]) -> Any:
        return run(script, self.keys, self.argv(extra), self.queue, self.where, self.keys_stream)

    def settle(self, script: Script, extra: Sequence[Any]) -> Any:
        """:meth:`run` for a script that reads none of the flow-control keys
        (SETTLE_KEYS)."""
        return run(script, self.settle_keys, self.argv(extra), self.queue, self.where, self.settle_keys_stream)


class FetchReply(NamedTuple):
    """fetch.lua's reply. The deliveries are ``raw[first:]`` in threes
    (seq, delivery count, record): left in the reply, not copied, as a
    fetch of 100 reads them once."""

    now_ms: int
    next_due_ms: int | None  # when a waiting message falls due (only when nothing was delivered)
    incarnation: str  # the queue's incarnation ("" when it has none)
    last_seq: int  # the queue's last seq
    floor: int  # the group's ack floor after the call's acks (-1: not a seq)
    generation: int  # the group's generation: grows at each make and reset (0: none, -1: not a number)
    ack_statuses: list[str]  # per tag acked first: "ok" or its error code
    token: str  # the token of the deliveries
    raw: list[Any]
    first: int
    # The call made its consumer the queue's waiter (lua/fetch.lua): the
    # one consumer whose idle fetch waits in Redis for the wake-up.
    waiter: bool = False
    # The seqs (first, last) of the call record this fetch wrote (a stream
    # log's, lua/fetch.lua's call field): its deliveries are the count-1
    # ones among them. None: it wrote none.
    call: tuple[int, int] | None = None
    # The seqs (first, last) this fetch claimed without reading their
    # records (lua/fetch.lua's claim), after the index in raw where their
    # triples go: the reply leaves them out, and fill_claimed puts them in.
    claim: tuple[int, int, int] | None = None
    # The claimed seqs whose record the log did not give (fill_claimed): the
    # consumer sets them aside as missing-record.
    missing: frozenset[int] = frozenset()

    def handed_out(self) -> bool:
        """Whether the call handed out any delivery (the consumer may have
        set them all aside: expired, or corrupt)."""
        return len(self.raw) > self.first

    def deliveries(self) -> Iterator[tuple[int, int, bytes]]:
        raw = self.raw
        for i in range(self.first, len(raw), 3):
            yield int(raw[i]), delivery_count(raw[i + 1])[0], raw[i + 2]


def delivery_count(raw: Any) -> tuple[int, int | None]:
    """A delivery's count in a fetch reply, and for a replayed dead letter
    the deliveries it had before its replay (None otherwise): a count is a
    number, or "<count>^<earlier>" after a replay."""
    if type(raw) is int:
        return raw, None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    count, _, earlier = text.partition("^")
    return int(count), int(earlier) if earlier else None


# A delivery tag as the scripts take it: its text "<seq>.<count>.<token>",
# seq, delivery count and token.
Tag = tuple[str, int, int, str]


def flat_tags(tags: Sequence[Tag]) -> list[int | str]:
    """seq1, count1, token1, seq2, ... of the tags."""
    return [n for _, seq, count, token in tags for n in (seq, count, token)]


# lua/fetch.lua's CLAIM_MIN and CALL_MAX: the fewest first deliveries a
# fetch claims without reading their records, and the most it claims.
CLAIM_MIN = 32
CALL_MAX = 128


class ClaimGuess:
    """Where a consumer's next claim (lua/fetch.lua's claim of first
    deliveries, whose records the client reads) starts, so that
    :func:`fetch` reads its records in the fetch's own round trip rather
    than a second one. A consumer alone on a backlog claims one run of
    seqs after another: the guess is the seq after its last claim, made
    once its claims started where the one before ended ``need`` times in a
    row, while the queue holds enough after the last for another claim. A
    wrong guess (another consumer claimed those seqs, or the fetch claimed
    none) costs Redis one XRANGE in vain, and the records are read as
    without one; it doubles ``need`` (up to NEED_MAX), so consumers that
    take turns on one backlog seldom guess, and a right one sets it back
    to 1. One per consumer (:class:`GroupArgs`); a race between threads of
    one consumer makes a guess wrong, never a record."""

    NEED_MAX = 64

    __slots__ = ("next", "run", "need", "room", "sent")

    def __init__(self) -> None:
        self.next: int | None = None  # the seq after the last claim seen
        self.run = 0  # claims in a row that started where the one before ended
        self.need = 1  # claims in a row a guess waits for
        self.room = False  # the last reply's queue held a claim's worth after the last claim
        self.sent = False  # a guess went with the last fetch

    def carry(self, before: ClaimGuess) -> None:
        """Goes on from ``before``: a consumer's view made anew for new
        settings (rqueue.consumer_core) of the same group keys."""
        self.next, self.run, self.need, self.room = before.next, before.run, before.need, before.room

    def range(self, n: int) -> tuple[int, int] | None:
        """The seqs to read with a fetch of ``n``, or None: no guess."""
        start = self.next
        if self.run < self.need or not self.room or start is None or n < CLAIM_MIN:
            return None
        self.sent = True
        return start, start + min(n, CALL_MAX) - 1

    def saw(self, reply: FetchReply) -> None:
        """Learns from a fetch's reply (parsed, not yet filled)."""
        raw, sent, self.sent = reply.raw, self.sent, False
        claim = reply.claim
        right = claim is not None and claim[1] == self.next
        if sent:
            self.need = 1 if right else min(self.need * 2, self.NEED_MAX)
        if claim is None:
            if len(raw) > reply.first:
                # handed out without a claim: the cursor may have moved
                self.next, self.run = None, 0
            return
        at, _, hi = claim
        last = hi
        if len(raw) > at:
            # The scan read first deliveries after the claim (a fetch of
            # more than CALL_MAX), in seq order: the cursor is at the last.
            seq, count = raw[-3], raw[-2]
            if type(seq) is not int or count != 1 or seq <= hi:
                self.next, self.run = None, 0
                return
            last = seq
        self.run = self.run + 1 if right else 0
        self.room = reply.last_seq - last >= CLAIM_MIN
        self.next = last + 1


class CallSpans:
    """The seqs a consumer's fetches handed out on call records (a stream
    log's, lua/includes/call_state.lua), by token, as the fetch replies'
    call field said (lua/fetch.lua): acks of two or more count-1
    deliveries of such a call go as one range (lua/includes/ack_ranges.lua,
    :func:`pack_acks`). One per consumer (:class:`GroupArgs`, carried to
    the consumer's view made for new settings), so a token drawn again by
    another consumer or for another queue is another object's. Only a
    hint: a range the call no longer holds falls back per seq in the
    script, so a forgotten token costs triples, never a wrong status.

    Bounded without a lock (a consumer is shared between threads): two
    generations of at most :attr:`MAX` tokens each; when the newer fills,
    it becomes the older and the older is dropped whole. The generations
    are one list that the views carrying them share, so that a clear is
    seen by all of them."""

    MAX = 1024  # calls per generation: far more than a consumer holds at once

    __slots__ = ("generations",)

    def __init__(self) -> None:
        self.generations: list[dict[str, tuple[int, int]]] = [{}, {}]  # newer, older

    def __bool__(self) -> bool:
        newer, older = self.generations
        return bool(newer) or bool(older)

    def note(self, token: str, span: tuple[int, int]) -> None:
        generations = self.generations
        newer = generations[0]
        if len(newer) >= self.MAX:
            generations[1] = newer
            newer = generations[0] = {}
        newer[token] = span

    def get(self, token: str) -> tuple[int, int] | None:
        newer, older = self.generations
        return newer.get(token) or older.get(token)

    def clear(self) -> None:
        """Forgets every call (the consumer left, or Redis lost its state)."""
        self.generations[:] = [{}, {}]

    def carry(self, before: CallSpans) -> None:
        """Shares ``before``'s calls from now on: a consumer's view made anew
        for new settings (rqueue.consumer_core) acks what it fetched under
        the old as ranges."""
        self.generations = before.generations


# Which tags a packed ack's statuses stand for: per status, the tags' indexes
# (a range's in seq order); None when every tag went as itself.
Slots = list[list[int]] | None


def pack_acks(tags: Sequence[Tag], spans: CallSpans) -> tuple[list[int | str], Slots]:
    """The ARGV of ``tags`` for ack.lua and fetch.lua's acks: ranges first,
    one per call of ``spans`` met with two or more of its count-1
    deliveries (as "<first seq>", "r<in>[,<gap>,<in>...]", token; each seq
    once, a repeat stays a triple), then every other tag as a triple in
    the caller's order; and the slots that map the reply's statuses back."""
    if not spans or len(tags) < 2:
        return flat_tags(tags), None
    whole = _one_run(tags, spans)
    if whole is not None:
        return whole
    groups: dict[str, dict[int, int]] = {}
    single: list[int] = []
    # The tags of one fetch come together: its token's span and group are
    # looked up when the token changes, not per tag.
    last: str | None = None
    span: tuple[int, int] | None = None
    g: dict[int, int] | None = None
    for i, (_, seq, count, token) in enumerate(tags):
        if token != last:
            last, span, g = token, spans.get(token), groups.get(token)
        if span is not None and count == 1 and span[0] <= seq <= span[1]:
            if g is None:
                g = groups[token] = {}
            if seq not in g:
                g[seq] = i
                continue
        single.append(i)
    if not groups:
        return flat_tags(tags), None
    args: list[int | str] = []
    slots: list[list[int]] = []
    for token, g in groups.items():
        if len(g) < 2:
            single.extend(g.values())
            continue
        seqs = sorted(g)
        runs: list[int] = []
        run, prev = 1, seqs[0]
        for s in seqs[1:]:
            if s == prev + 1:
                run += 1
            else:
                runs += [run, s - prev - 1]
                run = 1
            prev = s
        runs.append(run)
        args += [seqs[0], "r" + ",".join(map(str, runs)), token]
        slots.append([g[s] for s in seqs])
    if not slots:
        return flat_tags(tags), None
    single.sort()
    for i in single:
        _, seq, count, token = tags[i]
        args += [seq, count, token]
        slots.append([i])
    return args, slots


def _one_run(tags: Sequence[Tag], spans: CallSpans) -> tuple[list[int | str], Slots] | None:
    """pack_acks of the common case, the ack of one fetch's first
    deliveries in seq order without a gap: one range; None otherwise (the
    general packing then)."""
    token = tags[0][3]
    span = spans.get(token)
    if span is None:
        return None
    seqs = [t[1] for t in tags]
    n, lo = len(seqs), seqs[0]
    if not (span[0] <= lo and lo + n - 1 <= span[1]) or seqs != list(range(lo, lo + n)):
        return None
    if [t[2] for t in tags].count(1) != n or [t[3] for t in tags].count(token) != n:
        return None
    return [lo, f"r{n}", token], [list(range(n))]


# A strict ack's refusals of a tag (nothing changed), after which a packed
# ack goes again as triples.
RETRY_AS_TRIPLES = (DeliveryError, CorruptRecord)


def unpack_statuses(statuses: Sequence[Any], slots: Slots, n: int) -> list[str]:
    """Per tag, its status from a packed ack's reply (one per slot: a range's
    is "ok" for all of it, or a list per seq)."""
    if slots is None:
        if statuses.count(b"ok") == len(statuses):
            return ["ok"] * len(statuses)  # every tag's went through (the common case): none decoded one by one
        return [s.decode() for s in statuses]
    out = [""] * n
    for slot, status in zip(slots, statuses, strict=True):
        if type(status) is list:
            for i, s in zip(slot, status, strict=True):
                out[i] = s.decode()
        else:
            text = status.decode()
            for i in slot:
                out[i] = text
    return out


# Each command below is a builder of its script's own arguments (ARGV after
# the group block), a parser of its reply, and the sync call that joins them
# through GroupCall.run. rqueue.engine.async_commands joins the same builders
# and parsers through an await: only the I/O differs.


def fetch_args(
    n: int, token: str, acks: Sequence[Tag] = (), marks: bool = False, packed: Sequence[int | str] | None = None
) -> list[Any]:
    """fetch.lua's ARGV after the group block; ``marks``: a call that finds
    nothing marks the queue for a wake-up (n is sent negative); ``packed``:
    the acks as :func:`pack_acks` made them."""
    return [-n if marks else n, token, *(flat_tags(acks) if packed is None else packed)]


def stored_number(raw: Any) -> int:
    """A number a script returns as Redis stores it (an int, or the field's
    bytes): -1 for one that is not a whole number >= 0 (damaged)."""
    if type(raw) is int:
        return raw
    try:
        number = int(raw)
    except (TypeError, ValueError):
        return -1
    return number if number >= 0 else -1


# The fields fetch.lua's reply opens with, before the acks' statuses; its
# stream text (run by a call sent a stream log's keys, scripts.sent_stream_log)
# has one more, the call field.
FETCH_HEAD = 6


def parse_fetch(
    reply: Any, token: str, acks: int, slots: Slots = None, tags: int = 0, call_field: bool = False
) -> FetchReply:
    """``acks``: the statuses in the reply (one per slot, with ``slots``);
    ``tags``: the tags they stand for (with ``slots``); ``call_field``: the
    reply is of fetch.lua's stream text, whose seventh field is the call
    field ("<first seq>:<last seq>" or "")."""
    due = reply[1]
    waiter = False
    if type(due) is bytes and due[:1] == b"w":
        waiter, due = True, due[1:]
    head, call, claim = FETCH_HEAD, None, None
    if call_field:
        head += 1
        field = reply[FETCH_HEAD]
        if field:
            written, _, claimed = field.partition(b"/")
            if written:
                first, _, last = written.partition(b":")
                call = (int(first), int(last))
            if claimed:
                at, lo, hi = claimed.split(b":")
                claim = (int(at), int(lo), int(hi))
    statuses = unpack_statuses(reply[head : head + acks], slots, tags) if acks else []
    return FetchReply(
        int(reply[0]),
        None if due in (b"", None) else int(due),
        text(reply[2]),
        int(reply[3]),
        stored_number(reply[4]),
        stored_number(reply[5]),
        statuses,
        token,
        reply,
        head + acks,
        waiter,
        call,
        claim,
    )


# The head of a record that parses as none (lua/includes/log.lua's
# UNREADABLE_HEAD): a "p" entry's time past 6 bytes is no entry rqueue wrote.
_UNREADABLE_HEAD = b"\0"
_COMPACT_LIMIT = 1 << 48


def _published_at(ms: bytes) -> int | None:
    """The time of a "p" entry's id (``ms``) as a compact record's
    published_ms; None past 6 bytes or unparsable: no entry rqueue wrote."""
    try:
        number = int(ms)
    except ValueError:
        return None
    return number if 0 <= number < _COMPACT_LIMIT else None


def _split_record(ms: bytes, value: bytes) -> SplitRecord | bytes:
    """A "p" entry's record: (published_ms, payload), or a record that
    parses as none when its id's time is no compact record's."""
    published = _published_at(ms)
    return _UNREADABLE_HEAD + value if published is None else (published, value)


def fill_claimed(reply: FetchReply, entries: Sequence[Any]) -> FetchReply:
    """``reply`` with its claim's deliveries (``reply.claim``, which the
    reply leaves out) in ``raw`` at the claim's index, their records from
    ``entries``, the log's XRANGE of the claimed seqs (Scripts.read_log:
    [id, [field, value]], or (id, {field: value})), as
    lua/includes/log.lua's logReadMany makes them: a "p" entry's record as
    a SplitRecord (the id's time, the payload), an "r" entry's as stored.
    A claimed seq that has no such entry (deleted, or a stub whose record
    is elsewhere) has the record b"" and is named in ``missing``. A new
    reply: ``reply`` is not changed."""
    assert reply.claim is not None
    at, lo, hi = reply.claim
    triples = None
    if len(entries) == hi - lo + 1 and entries and type(entries[0][1]) is list:
        triples = _claimed_in_order(lo, entries)
    missing: frozenset[int] = frozenset()
    if triples is None:
        triples, missing = _claimed_by_seq(lo, hi, entries)
    raw = reply.raw
    return reply._replace(raw=[*raw[:at], *triples, *raw[at:]], missing=missing)


def _claimed_in_order(lo: int, entries: Sequence[Any]) -> list[Any] | None:
    """The claim's triples (seq, 1, record) for the common case, every
    claimed seq's entry in order from ``lo`` as Redis sent it; None when
    an entry is not (its seq, field "p" or "r")."""
    triples: list[Any] = []
    add = triples.append
    ms_before, published = b"", None
    for eid, (field, value) in entries:
        seq, _, ms = eid.partition(b"-")
        if field == b"p":
            if ms != ms_before:  # a publish's entries share one time: parsed once for them
                published, ms_before = _published_at(ms), ms
            if published is None:
                return None  # _claimed_by_seq makes it a record that parses as none
            add(int(seq))
            add(1)
            add((published, value))
        elif field == b"r":
            add(int(seq))
            add(1)
            add(value)
        else:
            return None
    # The seqs are checked, not assumed from the count: a damaged log (an
    # entry deleted, another added with a seq already there) must not
    # shift records onto other seqs.
    if triples[::3] != list(range(lo, lo + len(entries))):
        return None
    return triples


def _claimed_by_seq(lo: int, hi: int, entries: Sequence[Any]) -> tuple[list[Any], frozenset[int]]:
    """The claim's triples for any entries, each placed by its seq, the
    first one of a seq kept; and the seqs none was found for."""
    records: list[Any] = [b""] * (hi - lo + 1)
    taken: set[int] = set()
    for eid, fields in entries:
        if type(fields) is dict:
            field, value = next(iter(fields.items()), (b"", b""))
        else:
            field, value = fields[0], fields[1]
        seq_text, _, ms = eid.partition(b"-")
        seq = int(seq_text)
        if not lo <= seq <= hi or seq in taken:
            continue  # outside the claim, or a second entry of one seq: no entry rqueue wrote
        taken.add(seq)
        if field == b"p":
            records[seq - lo] = _split_record(ms, value)
        elif field == b"r":
            records[seq - lo] = value
    triples = [x for seq, record in enumerate(records, lo) for x in (seq, 1, record)]
    return triples, frozenset(seq for seq, record in enumerate(records, lo) if not record)


def filled_by_guess(reply: FetchReply, guess: tuple[int, int] | None, entries: Any) -> FetchReply | None:
    """``reply`` with its claim's records from ``entries``, the reply of
    the XRANGE of ``guess`` sent with its fetch; None when that read does
    not cover the claim (no guess, no claim, a claim from another seq or
    past the guess, no list: read apart then, claimed_filled)."""
    if guess is None or reply.claim is None or type(entries) is not list:
        return None
    _, lo, hi = reply.claim
    if lo != guess[0] or hi > guess[1]:
        return None
    return fill_claimed(reply, claim_entries(reply, entries))


def claim_entries(reply: FetchReply, entries: list[Any]) -> list[Any]:
    """The entries of ``reply``'s claim among ``entries``, an XRANGE from
    its first seq on (filled_by_guess): the first ``hi - lo + 1`` when the
    last of those is ``hi``'s; else all of them, which fill_claimed places
    by seq (a log with a seq missing or written twice)."""
    assert reply.claim is not None
    _, lo, hi = reply.claim
    part = entries[: hi - lo + 1]
    if len(part) == hi - lo + 1 and part[-1][0].partition(b"-")[0] == b"%d" % hi:
        return part
    return entries


def claimed_filled(call: GroupCall, reply: FetchReply) -> FetchReply:
    """``reply`` with its claim's records read (fill_claimed), when it has
    a claim. A failure raises, as a fetch whose reply was lost: the claimed
    deliveries' leases run out, and they are offered again."""
    if reply.claim is None:
        return reply
    _, lo, hi = reply.claim
    try:
        entries, incarnation = call.scripts.read_log(call.keys[1], lo, hi, call.keys[0])
    except (redis.RedisError, OSError) as exc:
        raise translate(exc, call.queue, call.where) from exc
    return fill_claimed(claim_of_incarnation(reply, incarnation, call.where), entries)


def claim_of_incarnation(reply: FetchReply, incarnation: str, where: str) -> FetchReply:
    """``reply``, when ``incarnation`` (the queue's, read with the claim's
    records) is the one its claim was made in. Else Redis lost the queue's
    state, or the queue was made again, between the claim and the read:
    the records read are another queue's messages, and none is handed out
    (ConnectionLost, as a fetch whose reply was lost; the next call's reply
    tells the consumer of the loss)."""
    if incarnation == reply.incarnation:
        return reply
    assert reply.claim is not None
    _, lo, hi = reply.claim
    raise ConnectionLost(
        f"{where}: the queue's incarnation went from {reply.incarnation or '(none)'} to "
        f"{incarnation or '(none)'} between the claim of seqs {lo} to {hi} and the read of their records: "
        "nothing of the claim is handed out"
    )


def noted(call: GroupArgs, reply: FetchReply) -> FetchReply:
    """``reply``, its call (if any) noted in the consumer's spans, and its
    claim (or its deliveries without one) in the consumer's guess."""
    if reply.call is not None:
        call.spans.note(reply.token, reply.call)
    call.guess.saw(reply)
    return reply


FLOW_KEYS_ERROR = "RQ_FLOW_KEYS"  # fetch.lua: sent FETCH_PLAIN_KEYS keys for a queue that needs all


def needs_flow_keys(exc: BaseException) -> bool:
    """fetch.lua's refusal of the short layout (nothing was changed)."""
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(FLOW_KEYS_ERROR)


def fetch(call: GroupCall, n: int, token: str, acks: Sequence[Tag] = (), waits: bool = False) -> FetchReply:
    """Claims up to ``n`` deliveries, their tags carrying ``token`` (a word
    of [0-9a-z] drawn at random per call), after acking ``acks`` leniently.
    ``waits``: the caller waits for news when this call brings nothing, so
    that the call may make its consumer the queue's waiter (call.marks)."""
    packed, slots = pack_acks(acks, call.spans)
    args = fetch_args(n, token + call.rate, acks, call.marks and waits, packed)
    sent = len(acks) if slots is None else len(slots)
    if not call.flow[0]:
        try:
            guess = call.guess.range(n) if call.fetch_keys_stream else None
            argv = call.argv(args)
            pair = None
            if guess is not None:
                pair = call.scripts.fetch.call_and_read(call.fetch_keys, argv, ("XRANGE", call.keys[1], *guess), True)
            reply, entries = pair or (call.scripts.fetch(call.fetch_keys, argv, stream=call.fetch_keys_stream), None)
            parsed = noted(call, parse_fetch(reply, token, sent, slots, len(acks), call.fetch_keys_stream))
            filled = filled_by_guess(parsed, guess, entries)
            return filled if filled is not None else claimed_filled(call, parsed)
        except (redis.RedisError, OSError) as exc:
            if not needs_flow_keys(exc):
                raise translate(exc, call.queue, call.where) from exc
            call.flow[0] = True
    reply = call.run(call.scripts.fetch, args)
    return noted(call, parse_fetch(reply, token, sent, slots, len(acks), call.keys_stream))


# The wake-stream id a consumer waits after before it has seen an entry:
# any entry wakes it, and that first wake-up tells it the current id.
WAKE_ANY = "0-0"


def wakes_usable(scripts: Scripts) -> bool:
    """True when the client can wait on a queue's wake stream in the
    pipeline of its fetch; a cluster's script pipelines take script calls
    only (scripts.ScriptPipeline), so its consumers wait on the channel."""
    return not isinstance(scripts.redis, redis.RedisCluster)


class WokenFetch(NamedTuple):
    """What :func:`wait_then_fetch` did."""

    since: str  # the last wake-up id seen: what the next wait waits after
    refused: str  # why Redis refused the wait (an ACL without XREAD, ...), or "": wait another way
    reply: FetchReply


def wait_then_fetch(call: GroupCall, wakes: str, since: str, block_ms: int, n: int, token: str) -> WokenFetch:
    """Waits up to ``block_ms`` ms for an entry after ``since`` in the wake
    stream ``wakes``, then claims up to ``n`` deliveries as :func:`fetch`;
    one round trip: Redis runs the fetch as soon as the XREAD returns
    (lua/includes/wake.lua)."""
    pipe = call.scripts.pipeline()
    pipe.command("XREAD", "BLOCK", max(1, block_ms), "STREAMS", wakes, since)
    args = fetch_args(n, token + call.rate, marks=True)
    keys = call.keys if call.flow[0] else call.fetch_keys
    call.scripts.fetch(keys, call.argv(args), client=pipe)
    try:
        woke, reply = pipe.execute(raise_on_error=False)
    except (redis.RedisError, OSError) as exc:
        raise translate(exc, call.queue, call.where) from exc
    except MEMORY_WRONG_TYPE as exc:
        # memory:// (fakeredis) fails an XREAD of a key of another type
        # with a Python error, before the fetch runs, where Redis answers
        # WRONGTYPE: a refusal all the same.
        return WokenFetch(since, f"{type(exc).__name__}: {exc}", fetch(call, n, token, waits=True))
    refused = str(woke) or type(woke).__name__ if isinstance(woke, BaseException) else ""
    if not refused:
        since = last_wake_id(woke, since)
    if isinstance(reply, BaseException):
        if not needs_flow_keys(reply):
            raise translate(reply, call.queue, call.where) from reply
        call.flow[0] = True  # nothing was changed: the fetch again, with every key
        return WokenFetch(since, refused, fetch(call, n, token, waits=True))
    stream = call.keys_stream if call.flow[0] else call.fetch_keys_stream
    parsed = noted(call, parse_fetch(reply, token, 0, call_field=stream))
    return WokenFetch(since, refused, claimed_filled(call, parsed))


# What memory:// (fakeredis) raises for an XREAD of a key that is no stream.
MEMORY_WRONG_TYPE = (AttributeError, TypeError)


def last_wake_id(reply: Any, since: str) -> str:
    """The id of the newest entry in an XREAD reply of one stream, or
    ``since`` when it timed out. redis-py shapes the reply by its protocol
    and version (RESP2 [[key, entries]], RESP3 {key: entries} or {key:
    [entries]}; memory:// answers [] for a timeout): the entries are found
    by their ids, the first item of each."""
    if not reply:
        return since
    entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    while entries and not isinstance(entries[-1][0], (bytes, str)):
        entries = entries[-1]
    if not entries:
        return since
    newest = entries[-1][0]
    return newest.decode() if isinstance(newest, bytes) else str(newest)


def newest_wake_id(reply: Any) -> str | None:
    """The id of the newest entry of an XREVRANGE <wakes> + - COUNT 1
    reply, or None when the stream is empty (or no stream)."""
    if not reply:
        return None
    newest = reply[0][0]
    return newest.decode() if isinstance(newest, bytes) else str(newest)


def wake_id_after(a: str, b: str) -> bool:
    """True when stream id ``a`` comes after ``b`` (both "<ms>-<seq>")."""
    ams, _, aseq = a.partition("-")
    bms, _, bseq = b.partition("-")
    return (int(ams), int(aseq or 0)) > (int(bms), int(bseq or 0))


def ack_args(
    call: GroupArgs, tags: Sequence[Tag], strict: bool, packed: Sequence[int | str] | None = None
) -> list[Any]:
    """ack.lua's whole ARGV: the group and consumer names alone of the group
    arguments (it reads no clock and no setting), the mode, the tags (or
    ``packed``, as :func:`pack_acks` made them)."""
    return [call.group, call.consumer, "1" if strict else "0", *(flat_tags(tags) if packed is None else packed)]


def parse_ack(reply: Any, strict: bool, slots: Slots = None, tags: int = 0) -> list[str]:
    if strict:
        return []
    if slots is None:
        return [s.decode() for s in reply]
    return unpack_statuses(reply, slots, tags)


def text(value: Any) -> str:
    """A reply's value as str: bytes (from a client that does not decode
    replies) as UTF-8, bytes that are not kept as surrogates (a name as it
    was stored); anything else through str()."""
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else str(value)


def ack(call: GroupCall, tags: Sequence[Tag], strict: bool, ranges: bool = True) -> list[str]:
    """Acks ``tags``. Strict: all or none, raising the first bad tag's error
    (returns []); else one status per tag ("ok" or its error code).
    ``ranges``: False sends every tag as a triple (after :func:`ack_run`
    was refused, so that the error names the first bad tag)."""
    packed: list[int | str] | None
    packed, slots = pack_acks(tags, call.spans) if ranges else (None, None)
    if strict and slots is not None:
        try:
            run(
                call.scripts.ack,
                call.ack_keys,
                ack_args(call, tags, strict, packed),
                call.queue,
                call.where,
                call.ack_keys_stream,
            )
            return []
        except RETRY_AS_TRIPLES:
            # Refused, nothing changed: again as triples, so that the error
            # names the first bad tag in the caller's order (the ranges'
            # fallbacks are checked after the other tags).
            packed, slots = None, None
    args = ack_args(call, tags, strict, packed)
    reply = run(call.scripts.ack, call.ack_keys, args, call.queue, call.where, call.ack_keys_stream)
    return parse_ack(reply, strict, slots, len(tags))


def run_ack_args(call: GroupArgs, lo: int, n: int, token: str) -> list[Any] | None:
    """ack.lua's whole ARGV for a strict ack of the first deliveries of
    seqs ``lo`` to ``lo + n - 1`` that the fetch of ``token`` made, as one
    range (as :func:`pack_acks` packs them); None when ``call.spans`` does
    not know a call of that fetch covering them."""
    span = call.spans.get(token)
    if span is None or lo < span[0] or lo + n - 1 > span[1]:
        return None
    return [call.group, call.consumer, "1", lo, f"r{n}", token]


def ack_run(call: GroupCall, lo: int, n: int, token: str) -> bool:
    """Acks, all or none, the first deliveries of seqs ``lo`` to ``lo + n -
    1`` that the fetch of ``token`` made, as one range, without a tag each
    (the consumer's ack of a fetch's whole claim). False when not sent
    (:func:`run_ack_args`) or refused, nothing changed: the caller then
    acks the tags as triples (:func:`ack` with ``ranges`` False), whose
    error names the first bad one."""
    args = run_ack_args(call, lo, n, token)
    if args is None:
        return False
    try:
        run(call.scripts.ack, call.ack_keys, args, call.queue, call.where, call.ack_keys_stream)
    except RETRY_AS_TRIPLES:
        return False
    return True


def ack_results_keys(call: GroupArgs, result_keys: Sequence[str]) -> list[str]:
    """ack_result.lua's KEYS: the group's, then each tag's result key; with
    no result kept, the meta key stands in for them (same slot, not written)."""
    return [*call.keys, *(result_keys or call.keys[:1])]


def ack_results_args(
    tags: Sequence[Tag], ttl_ms: int | None, results: Sequence[bytes], event: bool, strict: bool
) -> list[Any]:
    """ack_result.lua's arguments after the group block: each tag's result
    (in the tags' order) kept for ``ttl_ms`` (None: none kept), with
    ``event`` a completed event per message settled."""
    packed = b"".join(b"%d:%s" % (len(r), r) for r in results)
    mode = ("1" if event else "0") + ("" if strict else "l")
    return ["" if ttl_ms is None else str(ttl_ms), packed, mode, *flat_tags(tags)]


# The most bytes of results one lenient ack_results call carries (a result
# larger than this goes alone): a round of large results never becomes one
# huge script argument.
RESULTS_PER_CALL_BYTES = 1 << 20


def results_chunks(results: Sequence[bytes]) -> list[tuple[int, int]]:
    """The [start, end) ranges of ``results`` that lenient ack_results calls
    send, each of at most RESULTS_PER_CALL_BYTES (or one result)."""
    chunks: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, r in enumerate(results):
        if i > start and size + len(r) > RESULTS_PER_CALL_BYTES:
            chunks.append((start, i))
            start, size = i, 0
        size += len(r)
    if start < len(results):
        chunks.append((start, len(results)))
    return chunks


def ack_results(
    call: GroupCall,
    tags: Sequence[Tag],
    result_keys: Sequence[str],
    ttl_ms: int | None,
    results: Sequence[bytes],
    event: bool,
    strict: bool,
) -> list[str]:
    """Acks ``tags`` as :func:`ack` does and in the same call
    (ack_result.lua) keeps each one's result (``results``) under its key
    (``result_keys``, both in the tags' order; none with ``ttl_ms`` None) for
    ``ttl_ms``, and with ``event`` records a completed event per message
    settled. Strict: all or none (returns []); else one status per tag, a
    result kept and an event recorded for each "ok"."""
    reply = run(
        call.scripts.ack_result,
        ack_results_keys(call, result_keys),
        call.argv(ack_results_args(tags, ttl_ms, results, event, strict)),
        call.queue,
        call.where,
    )
    return parse_ack(reply, strict)


def ack_completed(call: GroupCall, tags: Sequence[Tag], strict: bool) -> list[str]:
    """Acks ``tags`` as :func:`ack` does and records a completed event for
    each message settled, in the same call: the ack of a queue whose events
    setting names completed."""
    return ack_results(call, tags, [], None, [], True, strict)


class NackReply(NamedTuple):
    dead: bool  # dead-lettered (max_deliveries reached) rather than requeued
    where: int  # due time (ms) when requeued; dead-letter seq when dead (0: dropped)


def nack_args(tag: Tag, delay_ms: int | None, error: str, event: str = "") -> list[Any]:
    _, seq, count, token = tag
    return [seq, count, token, "" if delay_ms is None else str(delay_ms), error, event]


def parse_nack(reply: Any) -> NackReply:
    status, where = reply
    return NackReply(status == b"dead", int(where))


def nack(call: GroupCall, tag: Tag, delay_ms: int | None, error: str, event: str = "") -> NackReply:
    """Nacks one delivery; ``event`` ("failed", "timeout" or "") is the
    lifecycle event recorded with it."""
    return parse_nack(call.settle(call.scripts.nack, nack_args(tag, delay_ms, error, event)))


def nack_many_args(tags: Sequence[Tag], delay_ms: int | None, error: str, event: str) -> list[Any]:
    # Every tag after an empty first one (ARGV[14..]): the script answers
    # per tag, even for one.
    return ["", "", "", "" if delay_ms is None else str(delay_ms), error, event, *flat_tags(tags)]


def parse_nack_many(reply: Any) -> list[NackReply | str]:
    """Per tag, its NackReply or its error code."""
    out: list[NackReply | str] = []
    for i in range(0, len(reply), 2):
        status = reply[i]
        if status in (b"requeued", b"dead"):
            out.append(NackReply(status == b"dead", int(reply[i + 1])))
        else:
            out.append(status.decode())
    return out


def nack_many(
    call: GroupCall, tags: Sequence[Tag], delay_ms: int | None, error: str, event: str
) -> list[NackReply | str]:
    """Nacks deliveries with the same delay, error text and event, each on
    its own (one refused does not keep the others); per tag its NackReply or
    its error code (also for one tag: never a tag's error raised)."""
    return parse_nack_many(call.settle(call.scripts.nack, nack_many_args(tags, delay_ms, error, event)))


def reject_args(tag: Tag, reason: str, text: str, event: str = "") -> list[Any]:
    _, seq, count, token = tag
    return [seq, count, token, reason, text, event]


def reject(call: GroupCall, tag: Tag, reason: str, text: str, event: str = "") -> int:
    """Dead-letters one delivery; its seq in the dead-letter queue, 0 when
    dropped. ``event`` ("failed" or "") is the lifecycle event recorded."""
    return int(call.settle(call.scripts.reject, reject_args(tag, reason, text, event)))


# A delivery a fetch's client sets aside unrun (set_aside.lua): its tag, the
# reason and error text of its dead letter, and the event to record ("" none).
AsideTag = tuple[Tag, str, str, str]


def set_aside_keys(call: GroupArgs, result_keys: Sequence[str]) -> list[str]:
    """set_aside.lua's KEYS: the group's first 17 and a stream log's call
    keys, then each tag's result key, then a stream log's side hash, last."""
    return [*call.keys[:SETTLE_KEYS], *call_keys_of(call.keys), *result_keys, *side_of(call.keys)]


def set_aside_args(items: Sequence[AsideTag], ttl_ms: int | None) -> list[Any]:
    out: list[Any] = ["" if ttl_ms is None else ttl_ms]
    for (_, seq, count, token), reason, error, event in items:
        out += (seq, count, token, reason, error, event)
    return out


def parse_set_aside(reply: Any) -> list[int | str]:
    """Per item its dead letter's seq (0: dropped), or its error code."""
    return [v if type(v) is int else text(v) for v in reply]


def set_aside(
    call: GroupCall, items: Sequence[AsideTag], result_keys: Sequence[str], ttl_ms: int | None
) -> list[int | str]:
    """Dead-letters deliveries set aside unrun, in one call, keeping each
    one's failure (its dead letter's reason and text) under its key of
    ``result_keys`` for ``ttl_ms`` (None: none kept); see
    :func:`parse_set_aside`."""
    args = call.argv(set_aside_args(items, ttl_ms))
    return parse_set_aside(run(call.scripts.set_aside, set_aside_keys(call, result_keys), args, call.queue, call.where))


class ExtendReply(NamedTuple):
    deadline_ms: int
    statuses: list[str]  # per tag: "ok" or its error code


def parse_extend(reply: Any) -> ExtendReply:
    return ExtendReply(int(reply[0]), [s.decode() for s in reply[1:]])


def extend(call: GroupCall, tags: Sequence[Tag]) -> ExtendReply:
    return parse_extend(call.settle(call.scripts.extend, flat_tags(tags)))


class HeartbeatReply(NamedTuple):
    deadline_ms: int
    removed: int  # silent members removed
    returned: int  # their deliveries offered again
    dead_lettered: int  # their deliveries that had reached max_deliveries
    handed_back: int  # (sync) deliveries held in Redis that the caller did not list
    incarnation: str  # the queue's incarnation ("" when it has none)
    statuses: list[str]  # per tag: "ok" or its error code


def heartbeat_args(timeout_ms: int, sync: bool, tags: Sequence[Tag]) -> list[Any]:
    return [timeout_ms, "1" if sync else "0", *flat_tags(tags)]


def parse_heartbeat(reply: Any) -> HeartbeatReply:
    return HeartbeatReply(
        int(reply[0]),
        int(reply[1]),
        int(reply[2]),
        int(reply[3]),
        int(reply[4]),
        text(reply[5]),
        [s.decode() for s in reply[6:]],
    )


def heartbeat(call: GroupCall, timeout_ms: int, sync: bool, tags: Sequence[Tag]) -> HeartbeatReply:
    return parse_heartbeat(call.settle(call.scripts.heartbeat, heartbeat_args(timeout_ms, sync, tags)))


class JoinReply(NamedTuple):
    group_created: bool
    consumer_created: bool
    incarnation: str  # the queue's: the one offered when the queue had none


def join_args(liveness_ms: int, incarnation: str) -> list[Any]:
    return [liveness_ms, incarnation]


def parse_join(reply: Any) -> JoinReply:
    group_created, consumer_created, inc = reply
    return JoinReply(int(group_created) == 1, int(consumer_created) == 1, text(inc))


def join(call: GroupCall, liveness_ms: int, incarnation: str) -> JoinReply:
    """Joins the group; ``incarnation`` (random) becomes the queue's when
    it has none."""
    return parse_join(call.settle(call.scripts.join, join_args(liveness_ms, incarnation)))


class LeaveReply(NamedTuple):
    returned: int
    dead_lettered: int


def leave_args(consumer: str, graceful: bool) -> list[Any]:
    return [consumer, "graceful" if graceful else "dead"]


def parse_leave(reply: Any) -> LeaveReply:
    returned, dead = reply
    return LeaveReply(int(returned), int(dead))


def leave(call: GroupCall, consumer: str, graceful: bool) -> LeaveReply:
    """Takes ``consumer`` out of the group (leave.lua); when it is the
    call's own, its calls are forgotten (CallSpans): what it held is
    offered again."""
    reply = parse_leave(call.settle(call.scripts.leave, leave_args(consumer, graceful)))
    if consumer == call.consumer:
        call.spans.clear()
    return reply


class PurgeReply(NamedTuple):
    purged: int
    more: bool  # the group still has a backlog: call again


def parse_purge(reply: Any) -> PurgeReply:
    purged, more = reply
    return PurgeReply(int(purged), int(more) == 1)


def purge(call: GroupCall, batch: int) -> PurgeReply:
    return parse_purge(call.run(call.scripts.purge, [batch]))


def parse_replay(reply: Any) -> list[str]:
    return [s.decode() for s in reply]


class SettleToReply(NamedTuple):
    settled: int
    reached: int  # the last seq looked at: the next call's ``after``
    more: bool  # reached is below the target: call again


def settle_to(call: GroupCall, target: int, after: int, batch: int) -> SettleToReply:
    """Settles, for the group, up to ``batch`` seqs above ``after`` and up
    to ``target`` that are not in flight (lua/settle_to.lua)."""
    settled, reached, more = call.settle(call.scripts.settle_to, [target, after, batch])
    return SettleToReply(int(settled), int(reached), int(more) == 1)


def replay_keys(call: GroupArgs, result_keys: Sequence[str]) -> list[str]:
    """replay.lua's KEYS: the group's first 17 and a stream log's call keys
    (a reset back hands a dead-lettered seq out again, maybe on a call),
    then per dead-letter seq the result key of the message it holds
    (deleted when it is replayed), then a stream log's side hash."""
    return [*call.keys[:SETTLE_KEYS], *call_keys_of(call.keys), *result_keys, *side_of(call.keys)]


def replay(call: GroupCall, dead_letter_seqs: Sequence[int], result_keys: Sequence[str]) -> list[str]:
    """Per dead-letter seq: "replayed", "missing", "other-group", "other-incarnation", "corrupt",
    "pending", "unread" or "lost" (lua/replay.lua).
    ``result_keys``: per dead-letter seq, its message's result key for the
    group (deleted with the replay), or the meta key when its seq is not known."""
    keys = replay_keys(call, result_keys)
    return parse_replay(run(call.scripts.replay, keys, call.argv(list(dead_letter_seqs)), call.queue, call.where))


def stats(call: GroupCall) -> GroupStats:
    return group_stats(call.group, call.run(call.scripts.stats, []))


def group_stats(name: str, flat: list[Any]) -> GroupStats:
    """GroupStats from stats.lua's flat list of name, value pairs."""
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
        paused=values.get("paused") not in (None, b"", ""),
        keys_ready=num("keys_ready"),
        keys_busy=num("keys_busy"),
    )


# -- publishing ----------------------------------------------------------------


# One encoded message of a publish call: its id (or None), its timing (the
# delay in ms, or "<delay_ms>:<headers_len>" when the body starts with
# headers, or "<delay_ms>:<headers_len>:<priority>" for a priority of 1 to 9,
# or "<delay_ms>:<headers_len>::<key>" for an ordering key: see :func:`timing`)
# and its body. A plain tuple: a publish makes one per message.
PublishMessage = tuple[str | None, int | str, bytes]


def timing(delay_ms: int, headers_len: int, priority: int = 0, key: str | None = None) -> int | str:
    """A message's timing argument of publish.lua: the plain delay when it
    has no headers, no priority and no ordering key (most messages)."""
    if key is not None:
        return f"{delay_ms}:{headers_len}::{key}"
    if priority:
        return f"{delay_ms}:{headers_len}:{priority}"
    return f"{delay_ms}:{headers_len}" if headers_len else delay_ms


class PublishCall(NamedTuple):
    keys: list[str]
    args: list[Any]


def publish_calls(
    keys: QueueKeys,
    now: int | str,
    dedup_window_ms: int,
    mandatory: bool,
    messages: Sequence[PublishMessage],
    batch: int,
    incarnation: str,
) -> list[PublishCall]:
    """The publish.lua calls that store ``messages`` in order, ``batch`` a
    call: KEYS are the queue's five, then one key per message with an id,
    then the flow keys when a message has a priority or a key;
    ARGV the call's head (with ``incarnation``, random, which becomes the
    queue's when it has none), then per message its id key's index (0:
    none), timing and body; or, when no message of the call has an id or a
    timing, "" and the bodies alone (a bare call: one argument a message)."""
    head = [now, dedup_window_ms, "1" if mandatory else "0", keys.wake_channel, incarnation]
    calls = []
    for start in range(0, len(messages), batch):
        call_keys = keys.publish_keys()
        chunk = messages[start : start + batch]
        if all(not msg_id and timing == 0 for msg_id, timing, _ in chunk):
            calls.append(PublishCall(call_keys, [*head, "", *(body for _, _, body in chunk)]))
            continue
        args: list[Any] = list(head)
        prioritized = False
        for msg_id, timing, body in chunk:
            if msg_id:
                call_keys.append(keys.message_id(msg_id))
                args += [len(call_keys), timing, body]
            else:
                args += [0, timing, body]
            if type(timing) is str and timing.count(":") >= 2:
                prioritized = True
        if prioritized:
            call_keys += keys.publish_flow_keys  # the priority log (and the side hash), last
        calls.append(PublishCall(call_keys, args))
    return calls


def publish(scripts: Scripts, calls: Sequence[PublishCall], queue: str) -> list[Any]:
    """Runs publish calls in one round trip; the raw replies (see
    :func:`publish_results`)."""
    script = scripts.publish
    try:
        if len(calls) == 1:
            return [script(calls[0].keys, calls[0].args)]
        pipe: ScriptPipeline = scripts.pipeline()
        for keys, args in calls:
            script(keys, args, client=pipe)
        return pipe.execute()
    except (redis.RedisError, OSError) as exc:
        raise with_memory_figures(translate(exc, queue), lambda: scripts.redis.info("memory")) from exc


def publish_each(scripts: Scripts, calls: Sequence[PublishCall], queue: str) -> list[Any]:
    """Runs publish calls (of different queues) in one round trip; per call
    its raw reply or its error, translated (every call is tried whatever
    the others did)."""
    pipe: ScriptPipeline = scripts.pipeline()
    for keys, args in calls:
        scripts.publish(keys, args, client=pipe)
    try:
        replies = pipe.execute(raise_on_error=False)
    except (redis.RedisError, OSError) as exc:
        raise translate(exc, queue) from exc
    return [
        with_memory_figures(translate(r, queue), lambda: scripts.redis.info("memory"))
        if isinstance(r, BaseException)
        else r
        for r in replies
    ]


# A message of publish_tracked: its content key (bytes, or None in position
# mode), timing and body as in PublishMessage.
TrackedMessage = tuple[str | bytes | None, int | str, bytes]


def publish_tracked(
    scripts: Scripts,
    keys: QueueKeys,
    writer: str,
    now: int | str,
    window_ms: int,
    mode: str,
    offset: int,
    messages: Sequence[TrackedMessage],
    queue: str,
) -> list[Any]:
    """Stores ``messages`` with what ``writer`` stored kept in its tracker
    hash (lua/publish_tracked.lua): ``mode`` "position" (``offset`` is the
    row number of the first message) or "content" (each message's id is its
    content key). One script call; its raw reply (:func:`publish_results`)."""
    args: list[Any] = [now, window_ms, "0", keys.wake_channel, mode, offset]
    for key, timing, body in messages:
        args += [key or "", timing, body]
    return list(run(scripts.publish_tracked, [*keys.publish_keys(), keys.tracker(writer)], args, queue, keys.base))


def save_report(r: Any, key: str, fields: dict[str, int | str], ttl_ms: int) -> None:
    """Writes a small hash of figures that expires after ``ttl_ms`` (what a
    Spark write did, for the driver that started it)."""

    def write() -> None:
        pipe = r.pipeline(transaction=False)
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, ttl_ms)
        pipe.execute()

    guarded(write, where=key)


def load_report(r: Any, key: str) -> dict[str, str]:
    """The hash :func:`save_report` wrote ({} when there is none)."""
    raw = guarded(lambda: r.hgetall(key), where=key)
    return {k.decode(): v.decode() for k, v in raw.items()}


def bare_range(reply: Sequence[Any]) -> range | None:
    """The seqs a bare publish call's reply (incarnation, "range", first,
    last) says its messages took; None for any other reply (incarnation,
    then seq and duplicate flag per message)."""
    if len(reply) == 4 and reply[1] in (b"range", "range"):
        return range(int(reply[2]), int(reply[3]) + 1)
    return None


def publish_results(replies: Sequence[Any], partition: int | None = None) -> list[PublishResult]:
    """PublishResults from publish.lua replies (:func:`bare_range`)."""
    out: list[PublishResult] = []
    for reply in replies:
        inc = text(reply[0]) or None
        seqs = bare_range(reply)
        if seqs is not None:
            out += [PublishResult(seq, False, None, partition, inc) for seq in seqs]
        else:
            out += [
                PublishResult(int(reply[j]), reply[j + 1] == 1, None, partition, inc) for j in range(1, len(reply), 2)
            ]
    return out


def publish_duplicates(replies: Sequence[Any]) -> int:
    """How many messages publish.lua replies say were duplicates."""
    return sum(reply[2::2].count(1) for reply in replies if bare_range(reply) is None)


# -- recurring schedules -------------------------------------------------------


class FireStatus(Enum):
    """What schedule_fire.lua found."""

    OK = "ok"  # the ticks were handled (published, skipped, or already handled)
    GONE = "gone"  # no such schedule
    CHANGED = "changed"  # the schedule's timing changed since its ticks were computed
    PAUSED = "paused"


class FireReply(NamedTuple):
    status: FireStatus
    last_tick_ms: int | None  # the schedule's latest tick handled (None: none yet)
    published: int
    skipped: int  # ticks handled without a publish (too late)
    first_seq: int | None  # seq of the first message published


def schedule_fire(
    scripts: Scripts,
    schedule_key: str,
    queue_keys: QueueKeys,
    now: str,
    version: str,
    lateness_ms: int | None,
    ticks: Sequence[int],
    queue: str,
    event: bool = False,
) -> FireReply:
    """Publishes ``ticks`` (ms, ascending) of the schedule at
    ``schedule_key`` to the queue of ``queue_keys``, each at most once ever;
    ticks later than ``lateness_ms`` are skipped (None: never). With
    ``event``, each message published records a "scheduled" event."""
    keys = [schedule_key, queue_keys.meta, queue_keys.msgs, queue_keys.floors, queue_keys.wakes]
    if event:
        keys.append(queue_keys.events)
    reply = run(
        scripts.schedule_fire,
        keys,
        [now, version, "" if lateness_ms is None else lateness_ms, queue_keys.wake_channel, *ticks],
        queue,
        schedule_key,
    )
    status, last, published, skipped, first = reply
    return FireReply(
        FireStatus(status.decode() if isinstance(status, bytes) else status),
        int(last) or None,
        int(published),
        int(skipped),
        int(first) or None,
    )


class RepairReply(NamedTuple):
    """repair.lua's reply: whether it changed something, and what."""

    done: bool  # False: what the doctor saw is no longer so; nothing was changed
    detail: str


def repair(call: GroupCall, what: str, args: Sequence[Any] = ()) -> RepairReply:
    """Repairs one finding of the doctor in the group of ``call``
    (lua/repair.lua lists ``what`` and its arguments)."""
    done, detail = call.run(call.scripts.repair, [what, *args])
    return RepairReply(text(done) == "done", text(detail))


def still_so(call: GroupCall, what: str, args: Sequence[Any] = ()) -> bool:
    """Whether a finding of the doctor is still so, in one atomic look that
    changes nothing (repair.lua's "check:" form of ``what``)."""
    answer, _ = call.run(call.scripts.repair, [f"check:{what}", *args])
    return text(answer) == "holds"


class PauseReply(NamedTuple):
    changed: bool  # False: it was already so
    state: str  # after the call: "" running, "paused" (a group), "refuse" or "hold" (a queue)


def pause(
    scripts: Scripts,
    keys: QueueKeys,
    group: str | None,
    pause: bool,
    mode: str,
    queue: str,
    record: bool = False,
    now: str = "",
) -> PauseReply:
    """Pauses or resumes ``group``, or the queue when None (lua/pause.lua);
    ``mode`` ("refuse" or "hold") is the queue's way of pausing."""
    return parse_pause(run(scripts.pause, *pause_call(keys, group, pause, mode, record, now), queue, keys.base))


def pause_call(
    keys: QueueKeys, group: str | None, pause: bool, mode: str, record: bool = False, now: str = ""
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of lua/pause.lua; ``record``: a change is a "paused"
    event (at ``now``, "" for the server's time)."""
    group_key = keys.group(group).state if group is not None else keys.meta
    return [keys.meta, keys.floors, group_key, keys.events, keys.wakes], [
        "queue" if group is None else "group",
        "pause" if pause else "resume",
        group or "",
        mode,
        keys.wake_channel,
        "1" if record else "0",
        now,
    ]


def parse_pause(reply: Sequence[Any]) -> PauseReply:
    return PauseReply(int(reply[0]) == 1, text(reply[1]))


class PublishSeen(NamedTuple):
    """What one publish reply tells of the queue's state: its incarnation
    and the seqs it assigned (duplicates left out), which one call assigns
    in one run: the first and the last (0, -1: none)."""

    incarnation: str
    first: int
    last: int


def publish_seen(reply: Sequence[Any]) -> PublishSeen:
    """The incarnation and new seqs of one publish.lua reply."""
    seqs = bare_range(reply)
    if seqs is not None:
        return PublishSeen(text(reply[0]), seqs.start, seqs.stop - 1) if seqs else PublishSeen(text(reply[0]), 0, -1)
    flags = reply[2::2]
    new = flags.count(0)
    if new == len(flags):  # no duplicate: the common case, read without a loop
        return PublishSeen(text(reply[0]), int(reply[1]), int(reply[-2]))
    if new == 0:
        return PublishSeen(text(reply[0]), 0, -1)
    first = int(reply[1 + 2 * flags.index(0)])
    return PublishSeen(text(reply[0]), first, first + new - 1)


# -- retention and group positions ------------------------------------------


class RetainReply(NamedTuple):
    retained: bool  # the queue is in retention mode (lua/includes/retain_mark.lua)
    trimmed: int  # the trim point: records at or below it are deleted
    passed: int  # seqs the trim point moved over in this call


def retain(
    scripts: Scripts,
    keys: QueueKeys,
    now: int | str,
    max_age_ms: int | None,
    max_length: int | None,
    apply: bool,
    limit: int,
    queue: str,
) -> RetainReply:
    """One call of retain.lua: stores the retention (when ``apply``) and
    runs one trim step of at most ``limit`` seqs."""
    args = retain_args(now, max_age_ms, max_length, apply, limit)
    return parse_retain(run(scripts.retain, keys.retain_keys(), args, queue, keys.base))


def retain_args(now: int | str, max_age_ms: int | None, max_length: int | None, apply: bool, limit: int) -> list[Any]:
    return [
        now,
        "-" if max_age_ms is None else max_age_ms,
        "-" if max_length is None else max_length,
        "1" if apply else "0",
        limit,
    ]


def parse_retain(reply: Any) -> RetainReply:
    return RetainReply(bool(int(reply[0])), int(reply[1]), int(reply[2]))


class GroupStartReply(NamedTuple):
    floor: int  # the group is handed the seqs above it
    last: int  # the last seq published when it was made


def group_create(call: GroupCall, mode: str, value: str) -> GroupStartReply:
    """Creates ``call.group`` at a position (lua/includes/group_position.lua)."""
    reply = call.run(call.scripts.group_create, [mode, value])
    return GroupStartReply(int(reply[0]), int(reply[1]))


class ResetReply(NamedTuple):
    previous: int  # the ack floor before
    floor: int  # the ack floor now
    cancelled: int  # deliveries taken back from consumers


def group_reset(call: GroupCall, mode: str, value: str, force: bool) -> ResetReply:
    """Moves ``call.group`` to a position; takes back what it had in flight."""
    reply = call.run(call.scripts.group_reset, [mode, value, "1" if force else "0"])
    return ResetReply(int(reply[0]), int(reply[1]), int(reply[2]))


def group_delete(call: GroupCall, force: bool) -> int:
    """Deletes ``call.group``; how many deliveries were taken back."""
    reply = call.run(call.scripts.group_delete, ["1" if force else "0"])
    return int(reply[0])


STATUS_EVENTS = 10_000  # events status.lua reads at most, newest first (the stream's cap)
_GROUP_STATES = {
    "pending": MessageState.PUBLISHED,
    "delayed": MessageState.DELAYED,
    "in-flight": MessageState.IN_FLIGHT,
    "waiting": MessageState.WAITING,
    "acked": MessageState.ACKED,
    "dead-lettered": MessageState.DEAD_LETTERED,
    "dropped": MessageState.DROPPED,
}


def status_args(now: int | str, seq: int | None, groups: Sequence[str]) -> list[Any]:
    return [now, "" if seq is None else seq, STATUS_EVENTS, *groups]


def parse_status(reply: Any) -> MessageStatus:
    """status.lua's reply as a MessageStatus."""
    if not int(reply[0]):
        return MessageStatus(None, MessageState.UNKNOWN, None, None)
    seq, published, not_before = int(reply[1]), text(reply[3]), text(reply[4])
    groups: dict[str, GroupMessageStatus] = {}
    rest = reply[5:]
    for i in range(0, len(rest), 5):
        name, state = text(rest[i]), _GROUP_STATES.get(text(rest[i + 1]))
        if state is None:  # the group was deleted between the listing and the call
            continue
        consumer, reason = text(rest[i + 2]), text(rest[i + 4])
        groups[name] = GroupMessageStatus(state, consumer or None, int(rest[i + 3]), reason or None)
    settled = (MessageState.ACKED, MessageState.DEAD_LETTERED, MessageState.DROPPED)
    if groups and all(g.state in settled for g in groups.values()):
        overall = MessageState.SETTLED
    else:
        overall = MessageState.DELAYED if not_before else MessageState.PUBLISHED
    return MessageStatus(
        seq, overall, int(published) if published else None, int(not_before) if not_before else None, groups
    )


def status(
    scripts: Scripts,
    keys: QueueKeys,
    now: int | str,
    msg_id: str | None,
    seq: int | None,
    groups: Sequence[str],
    queue: str,
) -> MessageStatus:
    """One call of status.lua."""
    reply = run(scripts.status, keys.status_keys(msg_id, groups), status_args(now, seq, groups), queue, keys.base)
    return parse_status(reply)


class MarkStatus(Enum):
    """What partition.lua did."""

    STORED = "stored"  # the layout asked for is stored now
    KEPT = "kept"  # another layout was stored: nothing changed
    IN_USE = "in-use"  # the plain queue has messages or groups: nothing stored


def mark_partitioned(
    scripts: Scripts, keys: QueueKeys, layout: str, expected: str, queue: str
) -> tuple[MarkStatus, str]:
    """Stores ``layout`` in the plain queue's meta (lua/partition.lua):
    to create (``expected`` ""), or in place of ``expected`` (a grow).
    Returns what the script did and the layout stored now."""
    return parse_mark(run(scripts.partition, mark_keys(keys), [layout, expected], queue, keys.base))


def mark_keys(keys: QueueKeys) -> list[str]:
    """KEYS of partition.lua."""
    return [keys.meta, keys.msgs, keys.floors]


def parse_mark(reply: Sequence[Any]) -> tuple[MarkStatus, str]:
    """partition.lua's reply: what it did, and the layout stored now."""
    status, stored = reply
    return MarkStatus(text(status)), text(stored)
