"""Reads a stream-layout group's call records (rqueue/engine/lua/includes/
call_state.lua): which seqs are out on a call, and to whom."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rqueue.engine.keys import call_keys_of


def calls_of(r: Any, keys: Sequence[str]) -> dict[int, tuple[str, str]]:
    """seq -> (token, holder) of every seq out on a call of the group whose
    GroupKeys.as_list is ``keys`` (none in the hash layout)."""
    found: dict[int, tuple[str, str]] = {}
    call_keys = call_keys_of(keys)
    if not call_keys:
        return found
    for token, raw in r.hgetall(call_keys[0]).items():
        first, _, _, bytes_, holder = raw.decode().split(" ")
        for i, b in enumerate(bytes_):
            if b == "1":
                found[int(first) + i] = (token.decode(), holder)
    return found


def out_on_call(r: Any, keys: Sequence[str], seq: int) -> bool:
    return seq in calls_of(r, keys)


def as_split(r: Any, keys: Sequence[str]) -> tuple[dict[int, str], dict[int, int]]:
    """The delivery state and the lease deadline a split would give every
    seq out on a call (seq -> state, seq -> deadline), as includes/
    call_state.lua splits them: readers that compare states and leases see
    call deliveries as per-message ones."""
    states: dict[int, str] = {}
    leases: dict[int, int] = {}
    call_keys = call_keys_of(keys)
    if not call_keys:
        return states, leases
    # the member at +inf is the set's pin (includes/group_keys.lua, SKIPLIST_PIN), no call
    raw = r.zrange(call_keys[1], 0, -1, withscores=True)
    deadlines = {m.decode(): int(s) for m, s in raw if s != float("inf")}
    for token, raw in r.hgetall(call_keys[0]).items():
        first, ms, _, bytes_, holder = raw.decode().split(" ")
        for i, b in enumerate(bytes_):
            if b == "1":
                states[int(first) + i] = f"1:{holder}:{ms}:{ms}:{token.decode()}"
                leases[int(first) + i] = deadlines.get(token.decode(), int(ms))
    return states, leases


CALL_MIN_LINE = "local CALL_MIN = 16\n"  # fetch.lua's
CLAIM_MIN_LINE = "local CLAIM_MIN = 32\n"  # fetch.lua's


def with_call_min(monkeypatch: Any, n: int, claim_min: int | None = None) -> None:
    """Clients made from now on load fetch.lua's stream text with CALL_MIN
    ``n``: with 1, every fetch from the cursor writes a call record, so a
    test of small fetches (the model test's) meets the call paths; and with
    CLAIM_MIN ``claim_min`` when given: with 1, every such fetch claims its
    seqs without reading their records (the client reads them)."""
    from rqueue.engine import async_scripts, loader, scripts

    def texts(name: str, shebang: bool = True) -> dict[str, str]:
        found = dict(loader.layout_texts(name, shebang))
        if name == "fetch":
            assert CALL_MIN_LINE in found["stream"], "fetch.lua's CALL_MIN line changed"
            found["stream"] = found["stream"].replace(CALL_MIN_LINE, f"local CALL_MIN = {n}\n")
            if claim_min is not None:
                assert CLAIM_MIN_LINE in found["stream"], "fetch.lua's CLAIM_MIN line changed"
                found["stream"] = found["stream"].replace(CLAIM_MIN_LINE, f"local CLAIM_MIN = {claim_min}\n")
        return found

    monkeypatch.setattr(scripts, "cached_texts", texts)
    monkeypatch.setattr(async_scripts, "cached_texts", texts)
