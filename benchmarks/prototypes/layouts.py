"""The layouts the prototype benchmark drives, each behind the same four
calls (join, publish_many, fetch, ack) plus what it says about its Redis
CPU (the commands whose INFO commandstats usec it spends).

- ``streams``: raw Redis Streams with redis-py, the ceiling (XADD
  pipelined, XREADGROUP COUNT n, XACK of the ids);
- ``rqueue``: the current layout through rqueue's public client, imported
  from this checkout;
- ``stream_pel``: prototype (b), the log in a stream and the in-flight
  state in its consumer group's PEL (stream_pel/*.lua);
- ``wide_hash``: prototype (c), the current log with one delivery-state
  hash per group and per-fetch-call lease records (wide_hash/*.lua);
- ``stream_calls``, ``stream_calls_2rt``: prototype (d), the log in a
  stream and one in-flight record per fetch call (stream_calls/*.lua), the
  entries read by the script or, in two round trips, by the client;
- ``stream_calls_2rt_dlv``: the same with today's client work per message
  (``rqueue.Delivery`` objects).
"""

from __future__ import annotations

import secrets
import string
from pathlib import Path
from typing import Any

import redis

import rqueue
from rqueue.delivery import Delivery
from rqueue.ids import delivery_tag

HERE = Path(__file__).resolve().parent
GROUP = "g"
CONSUMER = "c1"
ACK_WAIT_MS = 3_600_000  # an hour: no lease runs out inside a figure
MAX_DELIVERIES = 5
BIG = 10**9  # max_inflight and prefetch: never the limit in the benchmark
SCRIPT_COMMANDS = ("evalsha", "eval")
PIN = "pin:" + "x" * 64  # a value over 64 bytes: the hash is a hash table from the first delivery on

Tag = tuple[bytes, int, str]  # id or seq, delivery count, token
# The last field of a (d) delivery tuple: True when it came by its call's
# range, IN_SPAN when by the per-message path from inside that range (a
# parked seq), False when by that path from outside it (a redelivery).
IN_SPAN = 2


def bridging(ranged: list[int], parked: Any) -> set[int]:
    """The parked seqs of a call (each also sent as seq=count) that its
    ranges span in an ack: those next to a seq acked by range, so that
    they join ranges instead of splitting them (stream_calls/ack.lua). A
    lone one is sent as seq=count only, and is named by its own status."""
    near = set(ranged)
    return {seq for seq in parked if seq - 1 in near or seq + 1 in near}


def token() -> str:
    """A fetch call's token: a lowercase letter, then letters and digits."""
    return secrets.choice(string.ascii_lowercase) + secrets.token_hex(6)


class Layout:
    name = ""
    publish_cmds: tuple[str, ...] = SCRIPT_COMMANDS
    fetch_cmds: tuple[str, ...] = SCRIPT_COMMANDS
    ack_cmds: tuple[str, ...] = SCRIPT_COMMANDS

    def __init__(self, r: redis.Redis, url: str, queue: str) -> None:
        self.r = r
        self.url = url
        self.queue = queue
        self.conn: Any = None

    def go_direct(self) -> None:
        """The calls this layout times go on one connection of its own,
        sent and read without redis-py's per-call pool checkout and
        response callbacks, as rqueue's client sends its scripts
        (rqueue.engine.scripts): at fetch(1) that client-side cost per
        round trip is as large as the layouts' differences. Before join."""
        self.conn = self.r.connection_pool.make_connection()

    def cmd(self, *args: Any) -> Any:
        """One command on the direct connection, its reply as the server
        sent it."""
        self.conn.send_command(*args)
        return self.conn.read_response()

    def join(self) -> None:
        raise NotImplementedError

    def publish_many(self, payloads: list[bytes]) -> None:
        raise NotImplementedError

    def fetch(self, n: int) -> list[Any]:
        raise NotImplementedError

    def ack(self, deliveries: list[Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self.conn is not None:
            self.conn.disconnect()


class Streams(Layout):
    name = "streams"
    publish_cmds = ("xadd",)
    fetch_cmds = ("xreadgroup",)
    ack_cmds = ("xack",)

    def join(self) -> None:
        self.key = f"st:{{{self.queue}}}"
        self.r.xgroup_create(self.key, GROUP, id="0", mkstream=True)

    def publish_many(self, payloads: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for p in payloads:
            pipe.xadd(self.key, {"p": p})
        pipe.execute()

    def fetch(self, n: int) -> list[Any]:
        if self.conn is not None:
            raw = self.cmd("XREADGROUP", "GROUP", GROUP, CONSUMER, "COUNT", n, "STREAMS", self.key, ">")
            if not raw:
                return []
            entries = next(iter(raw.values())) if isinstance(raw, dict) else raw[0][1]  # RESP3: a map
            return [(e[0], e[1][1]) for e in entries]
        reply = self.r.xreadgroup(GROUP, CONSUMER, {self.key: ">"}, count=n)
        if not reply:
            return []
        return [(i, fields[b"p"]) for i, fields in reply[0][1]]

    def ack(self, deliveries: list[Any]) -> None:
        if self.conn is not None:
            self.cmd("XACK", self.key, GROUP, *[d[0] for d in deliveries])
            return
        self.r.xack(self.key, GROUP, *[d[0] for d in deliveries])


class Rqueue(Layout):
    """The current layout through rqueue's public client.

    ``every`` (0: off) publishes every message whose place in the queue is
    a multiple of it with priority 5, the rest with none: the current
    layout's flow-control path (the priority log and set, acks out of seq
    order), the reference for (d)'s per-message path."""

    name = "rqueue"
    every = 0
    published = 0

    def join(self) -> None:
        self.client = rqueue.connect(self.url, prefix="rq")
        q = self.client.queue(self.queue)
        assert isinstance(q, rqueue.Queue)
        self.q = q
        self.c = q.consumer(GROUP, name=CONSUMER, prefetch=BIG, max_inflight=BIG, ack_wait=ACK_WAIT_MS / 1000)

    def go_direct(self) -> None:
        pass  # rqueue's client sends its scripts so already

    def publish_many(self, payloads: list[bytes]) -> None:
        if not self.every:
            self.q.publish_many(payloads)
            return
        first = self.published + 1
        self.published += len(payloads)
        priority = [5 if (first + i) % self.every == 0 else 0 for i in range(len(payloads))]
        self.q.publish_many(payloads, priority=priority)

    def fetch(self, n: int) -> list[Any]:
        ds = self.c.fetch(n)
        for d in ds:
            d.data  # noqa: B018 - read the payload, as every consumer does
        return ds

    def ack(self, deliveries: list[Any]) -> None:
        self.c.ack(deliveries)

    def close(self) -> None:
        self.c.close()
        self.client.close()


class Scripted(Layout):
    """A prototype: its three scripts loaded once, called by EVALSHA."""

    folder = ""

    def load(self) -> None:
        self.sha = {}
        for what in ("publish", "fetch", "ack"):
            text = (HERE / self.folder / f"{what}.lua").read_text()
            self.sha[what] = self.r.script_load(text)
        self.call = self.cmd if self.conn is not None else self.r.execute_command

    def publish_many(self, payloads: list[bytes]) -> None:
        args: list[Any] = [0, ""]
        for p in payloads:
            args += (b"0", p)
        self.call("EVALSHA", self.sha["publish"], len(self.publish_keys), *self.publish_keys, *args)

    def fetch(self, n: int, ack_wait: int = ACK_WAIT_MS) -> list[Any]:
        tok = token()
        reply = self.call(
            "EVALSHA",
            self.sha["fetch"],
            len(self.fetch_keys),
            *self.fetch_keys,
            GROUP,
            CONSUMER,
            ack_wait,
            BIG,
            BIG,
            MAX_DELIVERIES,
            n,
            tok,
        )
        out = []
        for k in range(1, len(reply), 3):
            out.append((reply[k], int(reply[k + 1]), tok, self.payload(reply[k + 2])))
        return out

    @staticmethod
    def payload(raw: bytes) -> bytes:
        return raw


class StreamPel(Scripted):
    name = "stream_pel"
    folder = "stream_pel"

    def join(self) -> None:
        base = f"pb:{{{self.queue}}}"
        s, g = f"{base}:log", f"{base}:g:{GROUP}"
        exp, calls = f"{base}:exp:{GROUP}", f"{base}:calls:{GROUP}"
        self.publish_keys = [s]
        self.fetch_keys = [s, g, exp, calls, f"{base}:dlq"]
        self.ack_keys = [s, g, exp, calls, f"{base}:floors"]
        self.r.xgroup_create(s, GROUP, id="0", mkstream=True)
        self.r.hset(g, f"m:{CONSUMER}", "1")
        self.load()

    def ack(self, deliveries: list[Any]) -> None:
        if not deliveries:
            return
        order = sorted(deliveries, key=lambda d: tuple(int(x) for x in d[0].split(b"-")))
        args: list[Any] = [GROUP, CONSUMER, order[0][0], order[-1][0]]
        for d in deliveries:
            args += (d[0], d[1], d[2])
        statuses = self.call("EVALSHA", self.sha["ack"], len(self.ack_keys), *self.ack_keys, *args)
        if any(s != b"ok" for s in statuses):
            raise AssertionError(f"stream_pel ack: {statuses[:3]}")


class WideHash(Scripted):
    name = "wide_hash"
    folder = "wide_hash"

    def join(self) -> None:
        base = f"pc:{{{self.queue}}}"
        meta, msgs, g = f"{base}:meta", f"{base}:msgs", f"{base}:g:{GROUP}"
        dlv, exp, calls = f"{base}:dlv:{GROUP}", f"{base}:exp:{GROUP}", f"{base}:calls:{GROUP}"
        self.publish_keys = [meta, msgs]
        self.fetch_keys = [meta, msgs, g, dlv, exp, calls, f"{base}:ready:{GROUP}", f"{base}:dlq"]
        self.ack_keys = [msgs, g, dlv, exp, calls, f"{base}:acked:{GROUP}"]
        self.r.hset(g, f"m:{CONSUMER}", "1")
        self.r.hset(dlv, "pin", PIN)
        self.load()

    @staticmethod
    def payload(raw: bytes) -> bytes:
        return raw[7:]  # the compact record's head: "~" and 6 bytes of publish ms

    def ack(self, deliveries: list[Any]) -> None:
        if not deliveries:
            return
        args: list[Any] = [GROUP, CONSUMER]
        for d in deliveries:
            args += (d[0], d[1], d[2])
        statuses = self.call("EVALSHA", self.sha["ack"], len(self.ack_keys), *self.ack_keys, *args)
        if any(s != b"ok" for s in statuses):
            raise AssertionError(f"wide_hash ack: {statuses[:3]}")


class StreamCalls(Scripted):
    """Prototype (d): the script reads the new entries (one round trip).

    ``every`` (0: off) sends every seq that is a multiple of it through the
    per-message path instead of the call's range (fetch.lua's ARGV[10]):
    the cost of flow control, whose deliveries are not contiguous."""

    name = "stream_calls"
    folder = "stream_calls"
    mode = "read"
    every = 0

    def join(self) -> None:
        base = f"pd:{{{self.queue}}}"
        s, meta, g = f"{base}:log", f"{base}:meta", f"{base}:g:{GROUP}"
        exp, calls, dlv = f"{base}:exp:{GROUP}", f"{base}:calls:{GROUP}", f"{base}:dlv:{GROUP}"
        acked = f"{base}:acked:{GROUP}"
        self.stream_key = s
        self.dlq = f"{base}:dlq"
        self.publish_keys = [s, meta]
        self.fetch_keys = [s, g, exp, calls, dlv, f"{base}:ready:{GROUP}", self.dlq, meta]
        self.ack_keys = [s, g, exp, calls, dlv, acked, f"{base}:floors"]
        self.r.hset(g, f"m:{CONSUMER}", "1")
        self.load()

    def fetch(self, n: int, ack_wait: int = ACK_WAIT_MS) -> list[Any]:
        tok = token()
        reply = self.call(
            "EVALSHA",
            self.sha["fetch"],
            len(self.fetch_keys),
            *self.fetch_keys,
            GROUP,
            CONSUMER,
            ack_wait,
            BIG,
            BIG,
            MAX_DELIVERIES,
            n,
            tok,
            self.mode,
            self.every,
        )
        # (id, count, token, payload, seq, by range): the per-message path
        # (redeliveries, parked seqs) first, then the call's range
        entries = reply[1]
        if self.mode == "claim":
            return self.claimed(reply, tok)
        out = [
            (reply[k], int(reply[k + 1]), tok, reply[k + 2], int(reply[k].split(b"-")[0]), False)
            for k in range(2, len(reply), 3)
        ]
        if not entries:
            return out
        if self.every:  # the range has holes where seqs were parked: each id names its seq
            out += [(e[0], 1, tok, e[1][1], int(e[0].split(b"-")[0]), True) for e in entries]
        else:  # a call's range: contiguous seqs
            first = int(entries[0][0].split(b"-")[0])
            out += [(e[0], 1, tok, e[1][1], first + i, True) for i, e in enumerate(entries)]
        return out

    def claimed(self, reply: list[Any], tok: str) -> list[Any]:
        """The deliveries of a claim: the claimed range read with one
        XRANGE; the per-message path's seqs (seq, count pairs) taken from
        that read when they lie in the range, else read one XRANGE per run
        of consecutive seqs, in the same round trip."""
        claim = reply[1]
        per = [(int(reply[k]), int(reply[k + 1])) for k in range(2, len(reply), 2)]
        first = int(claim[0]) if claim else 0
        end = first + int(claim[1]) if claim else 0
        outside = sorted(seq for seq, _ in per if not first <= seq < end)
        runs: list[tuple[int, int]] = []
        for seq in outside:
            if runs and runs[-1][1] == seq - 1:
                runs[-1] = (runs[-1][0], seq)
            else:
                runs.append((seq, seq))
        reads: list[tuple[Any, ...]] = [("XRANGE", self.stream_key, lo, hi) for lo, hi in runs]
        if claim:
            reads.insert(0, ("XRANGE", self.stream_key, claim[0], "+", "COUNT", claim[1]))
        if not reads:
            return []
        if len(reads) == 1:
            replies = [self.call(*reads[0])]
        else:
            pipe = self.r.pipeline(transaction=False)
            for cmd in reads:
                pipe.execute_command(*cmd)  # type: ignore[no-untyped-call]
            replies = pipe.execute()
        ranged = replies[0] if claim else []
        found = {int(e[0].split(b"-")[0]): e for batch in replies[1 if claim else 0 :] for e in batch}
        out = []
        for seq, count in per:
            e = ranged[seq - first] if first <= seq < end else found.get(seq)
            if e is not None:  # a real build dead-letters a record that is gone ("missing-record")
                out.append((e[0], count, tok, e[1][1], seq, IN_SPAN if first <= seq < end else False))
        if not claim:
            return out
        parked = {int(x) for x in claim[2].split(b",")} if len(claim) > 2 else set()
        out += [(e[0], 1, tok, e[1][1], first + i, True) for i, e in enumerate(ranged) if first + i not in parked]
        return out

    def ack_raw(self, deliveries: list[Any]) -> list[bytes]:
        """One argument triple per fetch call: what it handed out by range
        as ranges of seqs, what it handed out by the per-message path
        (redeliveries, parked seqs) as seq=count."""
        calls: dict[str, tuple[list[int], list[str]]] = {}
        spans: dict[str, list[int]] = {}  # per call, its parked seqs acked here
        for d in deliveries:
            seqs, again = calls.setdefault(d[2], ([], []))
            if d[5] is True and d[1] == 1:  # a tag with another count is checked against the dlv state
                seqs.append(d[4])
            else:
                again.append(f"{d[4]}={d[1]}")
                if d[5] == IN_SPAN and d[1] == 1:
                    spans.setdefault(d[2], []).append(d[4])
        args: list[Any] = [GROUP, CONSUMER]
        for tok, (seqs, again) in calls.items():
            seqs = sorted(set(seqs) | bridging(seqs, spans.get(tok, ())))
            again.sort(key=lambda a: int(a.partition("=")[0]))  # the script merges both lists in seq order
            ranges = []
            k = 0
            while k < len(seqs):
                j = k
                while j + 1 < len(seqs) and seqs[j + 1] == seqs[j] + 1:
                    j += 1
                ranges.append(f"{seqs[k]}-{seqs[j]}")
                k = j + 1
            args += (tok, ",".join(ranges), ",".join(again))
        return self.call("EVALSHA", self.sha["ack"], len(self.ack_keys), *self.ack_keys, *args)  # type: ignore[no-any-return]

    def ack(self, deliveries: list[Any]) -> None:
        if not deliveries:
            return
        statuses = self.ack_raw(deliveries)
        if any(s != b"ok" for s in statuses):
            raise AssertionError(f"{self.name} ack: {statuses[:3]}")


class StreamCallsClaim(StreamCalls):
    """Prototype (d), two round trips: the script claims, XRANGE reads."""

    name = "stream_calls_2rt"
    mode = "claim"
    fetch_cmds = (*SCRIPT_COMMANDS, "xrange")

    def __init__(self, r: redis.Redis, url: str, queue: str) -> None:
        # A client of its own whose XRANGE replies stay as the server sent
        # them (redis-py's callback makes a dict of every entry's fields).
        own = redis.Redis(connection_pool=r.connection_pool)
        own.set_response_callback("XRANGE", lambda response, **options: response)
        super().__init__(own, url, queue)


class StreamCallsDeliveries(StreamCallsClaim):
    """Prototype (d), two round trips, with today's client work per
    message: each delivery is an ``rqueue.Delivery`` made as
    ``ConsumerCore._parse`` makes it (its tag, deadline, publish time from
    the entry id, held by tag), and an ack takes Delivery objects, drops
    them from the held ones and groups them into ranges per call."""

    name = "stream_calls_2rt_dlv"

    def join(self) -> None:
        super().join()
        self.held: dict[str, Delivery] = {}

    def claimed(self, reply: list[Any], tok: str) -> list[Any]:
        claim = reply[1]
        self.deadline = int(reply[0]) + self.ack_wait
        if len(reply) > 2 or len(claim) != 2:  # the per-message path, or parked seqs: through the tuples
            return [self.delivery(*t) for t in super().claimed(reply, tok)]
        # A call's range and nothing else (the common case): each entry
        # becomes a Delivery straight from the XRANGE reply.
        first = int(claim[0])
        new = Delivery.__new__
        held = self.held
        deadline = self.deadline
        out = []
        seq = first
        for entry_id, fields in self.call("XRANGE", self.stream_key, claim[0], "+", "COUNT", claim[1]):
            d = new(Delivery)
            d.consumer = self  # type: ignore[assignment]
            d.seq = seq
            d.delivery_count = 1
            d.data = fields[1]
            d.headers = {}
            d.published_ms = int(entry_id[entry_id.index(b"-") + 1 :])
            d.deadline_ms = deadline
            d.token = tok
            d.tag = tag = f"{seq}.1.{tok}"
            d.epoch = 0
            d.replayed = True  # a slot of the right type: here, that it came by the call's range
            held[tag] = d
            out.append(d)
            seq += 1
        return out

    def fetch(self, n: int, ack_wait: int = ACK_WAIT_MS) -> list[Any]:
        self.ack_wait = ack_wait
        return super().fetch(n, ack_wait)

    def delivery(self, entry_id: bytes, count: int, tok: str, data: bytes, seq: int, by_range: bool) -> Delivery:
        d = Delivery.__new__(Delivery)
        d.consumer = self  # type: ignore[assignment]
        d.seq = seq
        d.delivery_count = count
        d.data = data
        d.headers = {}
        d.published_ms = int(entry_id[entry_id.index(b"-") + 1 :])
        d.deadline_ms = self.deadline
        d.token = tok
        d.tag = tag = delivery_tag(seq, count, tok)
        d.epoch = 0
        d.replayed = by_range
        self.held[tag] = d
        return d

    def ack(self, deliveries: list[Any]) -> None:
        """Per fetch call, its range deliveries as ranges of seqs (in the
        order fetched: a call's range comes in seq order, so a sort is
        needed only when they do not) and the rest as seq=count."""
        if not deliveries:
            return
        held = self.held
        calls: dict[str, tuple[list[int], list[Delivery]]] = {}
        spans: dict[str, list[int]] = {}  # per call, its parked seqs acked here
        for d in deliveries:
            if d.consumer is not self:
                raise AssertionError("another consumer's delivery")
            held.pop(d.tag, None)
            seqs, again = calls.get(d.token) or calls.setdefault(d.token, ([], []))
            if d.replayed is True and d.delivery_count == 1:
                seqs.append(d.seq)
            else:
                again.append(d)
                if d.replayed == IN_SPAN and d.delivery_count == 1:
                    spans.setdefault(d.token, []).append(d.seq)
        args: list[Any] = [GROUP, CONSUMER]
        for tok, (seqs, again) in calls.items():
            if tok in spans:
                seqs = sorted(set(seqs) | bridging(seqs, spans[tok]))
            elif any(a >= b for a, b in zip(seqs, seqs[1:])):
                seqs.sort()
            if any(a.seq >= b.seq for a, b in zip(again, again[1:])):
                again.sort(key=lambda d: d.seq)  # the script merges both lists in seq order
            ranges = []
            lo = prev = seqs[0] if seqs else 0
            for seq in seqs[1:]:
                if seq != prev + 1:
                    ranges.append(f"{lo}-{prev}")
                    lo = seq
                prev = seq
            if seqs:
                ranges.append(f"{lo}-{prev}")
            args += (tok, ",".join(ranges), ",".join([f"{d.seq}={d.delivery_count}" for d in again]))
        statuses = self.call("EVALSHA", self.sha["ack"], len(self.ack_keys), *self.ack_keys, *args)
        if any(s != b"ok" for s in statuses):
            raise AssertionError(f"{self.name} ack: {statuses[:3]}")


LAYOUTS: dict[str, type[Layout]] = {
    k.name: k for k in (Streams, Rqueue, StreamPel, WideHash, StreamCalls, StreamCallsClaim, StreamCallsDeliveries)
}
