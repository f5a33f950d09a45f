"""Loading of the Lua scripts in lua/, one per command.

A line ``--@include name`` pulls in ``lua/includes/name.lua`` (once per
script). Scripts are registered redis-py style: EVALSHA first, SCRIPT LOAD and
retry on NOSCRIPT, so a server restart or SCRIPT FLUSH is harmless.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from redis.commands.core import Script

_INCLUDE = re.compile(r"^--@include\s+(\w+)\s*$", re.MULTILINE)

SCRIPT_NAMES = ("publish", "fetch", "ack", "nack", "reject", "extend", "heartbeat", "join", "leave", "purge", "replay", "stats")


def lua_dir() -> Path:
    """The scripts' folder: ``rqueue/lua`` in an installed wheel (the
    top-level ``lua/`` is packaged there), ``lua/`` in a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "fetch.lua").is_file():
            return candidate
    raise FileNotFoundError(f"rqueue's Lua scripts are missing (looked in {here / 'lua'} and {here.parent / 'lua'})")


@cache
def source(name: str) -> str:
    """The full text of script ``name`` with its includes expanded."""
    root = lua_dir()
    seen: set[str] = set()

    def expand(match: re.Match[str]) -> str:
        inc = match.group(1)
        if inc in seen:
            return ""
        seen.add(inc)
        text = root.joinpath("includes", f"{inc}.lua").read_text()
        return _INCLUDE.sub(expand, text)

    return _INCLUDE.sub(expand, root.joinpath(f"{name}.lua").read_text())


class Scripts:
    """The registered scripts of one Redis connection, as attributes."""

    publish: Script
    fetch: Script
    ack: Script
    nack: Script
    reject: Script
    extend: Script
    heartbeat: Script
    join: Script
    leave: Script
    purge: Script
    replay: Script
    stats: Script

    def __init__(self, redis: Any) -> None:
        for name in SCRIPT_NAMES:
            setattr(self, name, redis.register_script(source(name)))
