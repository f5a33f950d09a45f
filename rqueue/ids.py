"""The one place where rqueue makes up identifiers."""

from __future__ import annotations

import os
import re
import socket

from .randomness import Randomness

# Numbers as delivery_tag writes them (no leading zero): one delivery, one tag.
_TAG = re.compile(r"(0|[1-9][0-9]{0,14})\.(0|[1-9][0-9]{0,14})\.([a-z][0-9a-z]{0,31})")
TOKEN_BYTES = 6  # random bytes of a fetch call's token: 12 hex digits


def consumer_name(rng: Randomness) -> str:
    """A consumer name that says where it runs: ``host-pid-random``."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{rng.token(3)}"


def fetch_token(rng: Randomness) -> str:
    """The token of one fetch call's deliveries: random, so that no tag of
    another group, queue or server incarnation names the same delivery. It
    starts with a letter, as the scripts require (a state of the format
    before tokens ends in digits)."""
    return "t" + rng.token(TOKEN_BYTES)


def incarnation_id(rng: Randomness) -> str:
    """An incarnation id a client offers for a queue whose state in Redis
    starts anew (the scripts store it with the queue's meta): 64 bits from
    the operating system, so that no two incarnations share one. It starts
    with a letter, as the scripts require."""
    return "i" + rng.unique(8)


def delivery_tag(seq: int, count: int, token: str) -> str:
    """The tag of the ``count``-th delivery of ``seq`` in its group, made by
    the fetch call whose token is ``token``."""
    return f"{seq}.{count}.{token}"


def parse_delivery_tag(tag: str) -> tuple[int, int, str]:
    """Splits a tag made by :func:`delivery_tag`; ValueError if it is not one."""
    match = _TAG.fullmatch(tag)
    if match is None:
        raise ValueError(f"{tag!r} is not a delivery tag of the form <seq>.<count>.<token>")
    return int(match.group(1)), int(match.group(2)), match.group(3)
