"""The one place where rqueue makes up identifiers."""

from __future__ import annotations

import os
import socket

from .randomness import Randomness


def consumer_name(rng: Randomness) -> str:
    """A consumer name that says where it runs: ``host-pid-random``."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{rng.token(3)}"


def delivery_tag(seq: int, count: int) -> str:
    """The tag of the ``count``-th delivery of ``seq`` in its group."""
    return f"{seq}.{count}"


def parse_delivery_tag(tag: str) -> tuple[int, int]:
    """Splits a tag made by :func:`delivery_tag`; ValueError if it is not one."""
    seq, sep, count = tag.partition(".")
    if not sep or not seq.isdigit() or not count.isdigit():
        raise ValueError(f"{tag!r} is not a delivery tag of the form <seq>.<count>")
    return int(seq), int(count)
