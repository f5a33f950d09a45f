"""The one place where rqueue makes up identifiers."""

from __future__ import annotations

import os
import re
import socket

from .randomness import Randomness

_TAG = re.compile(r"([0-9]{1,15})\.([0-9]{1,15})")


def consumer_name(rng: Randomness) -> str:
    """A consumer name that says where it runs: ``host-pid-random``."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{rng.token(3)}"


def delivery_tag(seq: int, count: int) -> str:
    """The tag of the ``count``-th delivery of ``seq`` in its group."""
    return f"{seq}.{count}"


def parse_delivery_tag(tag: str) -> tuple[int, int]:
    """Splits a tag made by :func:`delivery_tag`; ValueError if it is not one."""
    match = _TAG.fullmatch(tag)
    if match is None:
        raise ValueError(f"{tag!r} is not a delivery tag of the form <seq>.<count>")
    return int(match.group(1)), int(match.group(2))
