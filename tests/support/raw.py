"""A queue's raw Redis state, for tests that look under the public API: every
key under a prefix, and a group's keys by the names of the KEYS layout in
rqueue/engine/lua/includes/group_keys.lua."""

from __future__ import annotations

from typing import Any

import rqueue

_GROUP_KEYS = {"lease": "lease", "delay": "delay", "dlv": "deliveries", "acked": "acked"}


def group_key(queue: rqueue.Queue, group: str, name: str) -> str:
    """The key ``name`` of ``group`` of ``queue``: "lease" (in-flight seqs
    by deadline), "delay" (waiting seqs by due time), "dlv" (delivery states)
    or "acked" (runs of seqs settled above the ack floor)."""
    key: str = getattr(queue.keys.group(group), _GROUP_KEYS[name])
    return key


def dump(client: rqueue.Client, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every key under the client's prefix (but those ending with one of
    ``skip``) with its type and full value."""
    r = client.redis
    out: dict[str, Any] = {}
    for raw in r.scan_iter(match=f"{client.prefix}:*", count=1000):
        key = raw.decode()
        if skip and key.endswith(skip):
            continue
        kind = r.type(raw).decode()
        if kind == "hash":
            value: Any = r.hgetall(raw)
        elif kind == "set":
            value = r.smembers(raw)
        elif kind == "zset":
            value = r.zrange(raw, 0, -1, withscores=True)
        elif kind == "list":
            value = r.lrange(raw, 0, -1)
        elif kind == "stream":
            value = r.xrange(raw)
        else:
            value = r.get(raw)
        out[key] = (kind, value)
    return out
