"""The floor figures: probes that are not rqueue's scripts, driven as
rqueue drives its own, bounding what any script-based queue can reach."""

from __future__ import annotations

import time

from rqueue.cli.bench.base import BenchBase
from rqueue.cli.bench.spec import FILL_BATCH, BenchError, payload
from rqueue.connection.cluster import no_retry
from rqueue.engine.scripts import Script

# The floor probes: not rqueue's scripts, but the fewest commands a script
# must send to publish a seq-numbered message on the server's clock, and to
# claim one under a lease and ack it (no de-duplication, caps, counts, ack
# floor or dead letters). What a script call costs on top of one command per
# round trip bounds the one-per-call ratios of any script-based design.
FLOOR_EMPTY_LUA = "return 1"
# KEYS[1] meta hash, KEYS[2] msgs hash; ARGV[1] the record. Returns the seq.
FLOOR_PUBLISH_LUA = """local now = redis.call('TIME')
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[2], seq, ARGV[1])
return seq"""
# KEYS[1] meta hash (cursor), KEYS[2] msgs hash, KEYS[3] lease zset. Returns
# { seq, record }, the lease due ack_wait (30 s) from the server's clock.
FLOOR_FETCH_LUA = """local now = redis.call('TIME')
local seq = redis.call('HINCRBY', KEYS[1], 'cursor', 1)
local rec = redis.call('HGET', KEYS[2], seq)
redis.call('ZADD', KEYS[3], now[1] * 1000 + 30000, seq)
return {seq, rec}"""
# KEYS[1] lease zset; ARGV[1] seq. Returns 1 when the lease was held.
FLOOR_ACK_LUA = "return redis.call('ZREM', KEYS[1], ARGV[1])"


class FloorFigures(BenchBase):
    """The group floor: floor_eval, floor_publish and floor_fetch_ack."""

    def floor_script(self, name: str, text: str) -> Script:
        """A probe driven as rqueue drives its own scripts (the client's
        connection pool, EVALSHA, loaded on NOSCRIPT)."""
        return Script(self.client.redis, f"floor-{name}", text, no_retry, self.client.scripts.connections)

    def floor_keys(self, what: str, *names: str) -> list[str]:
        tag = "{" + self._name(what) + "}"
        return [f"{self.prefix}:floor:{tag}:{name}" for name in names]

    def floor_eval(self, n: int) -> tuple[float, float]:
        """An empty script with a queue's publish keys and arguments, and
        XADD, one per call, interleaved."""
        empty = self.floor_script("empty", FLOOR_EMPTY_LUA)
        q = self.queue("floor-eval")
        keys = q.keys
        key_list = [keys.meta, keys.msgs, keys.floors, keys.sched]
        return self.one_per_call(
            lambda i: empty(key_list, ["", "0", "0", keys.wake_channel, "0", "0", payload(i)]), "floor-eval", n
        )

    def floor_publish(self, n: int) -> tuple[float, float]:
        """FLOOR_PUBLISH_LUA and XADD, one per call, interleaved; the probe's
        records are counted afterwards, so a probe that stored nothing fails."""
        publish = self.floor_script("publish", FLOOR_PUBLISH_LUA)
        keys = self.floor_keys("floor-publish", "meta", "msgs")
        rates = self.one_per_call(lambda i: publish(keys, [payload(i)]), "floor-publish", n)
        if self.r.hlen(keys[1]) != n:
            raise BenchError(f"the floor publish probe stored {self.r.hlen(keys[1])} of {n} records")
        return rates

    def floor_fetch_ack(self, n: int) -> tuple[float, float]:
        """FLOOR_FETCH_LUA then FLOOR_ACK_LUA, and XREADGROUP COUNT 1 + XACK,
        one message at a time, interleaved, from n messages stored in each.
        Every claim must hand out the next record and every ack end a lease."""
        fetch = self.floor_script("fetch", FLOOR_FETCH_LUA)
        ack = self.floor_script("ack", FLOOR_ACK_LUA)
        keys = self.floor_keys("floor-consume", "meta", "msgs", "lease")
        records = {str(i + 1): payload(i) for i in range(n)}
        items = list(records.items())
        for start in range(0, n, FILL_BATCH):
            self.r.hset(keys[1], mapping=dict(items[start : start + FILL_BATCH]))
        stream = self.stream("floor-consume")
        self.fill_stream(stream, n)
        lease_key = [keys[2]]
        wrong = [0]

        def rq(k: int) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                seq, rec = fetch(keys, [])
                if ack(lease_key, [seq]) != 1 or rec != records.get(str(seq)):
                    wrong[0] += 1
            return time.perf_counter() - t0

        rates = self.interleaved(rq, lambda k: self.drain_stream(stream, k, 1)[0], n)
        if wrong[0] or self.r.zcard(keys[2]) or int(self.r.hget(keys[0], "cursor") or 0) != n:
            raise BenchError(f"the floor claim probe went wrong: {wrong[0]} bad claims or acks of {n}")
        return rates

    def run_floor(self) -> None:
        n = self.config.single_messages
        for _ in self.runs("floor", f"the least a script call does, one per call, {n:,} calls each"):
            self.record("floor_eval", n, *self.floor_eval(n))
            self.record("floor_publish", n, *self.floor_publish(n))
            self.record("floor_fetch_ack", n, *self.floor_fetch_ack(n))
            self.cleanup()
