"""The rule that a Lua script is sent (in KEYS) every key it touches, checked
as the scripts run: each script's text gets a prelude that shadows the
global ``redis`` with a local table whose ``call`` and ``pcall`` check the
key arguments of each command against KEYS, and raise an error naming the
script, the command and the key when one is not among them. A local, not
a change of the global: Redis 7 makes the global table read-only, and the
same prelude runs on a real server and on memory:// (fakeredis and lupa).

Use :func:`checked_scripts` around the making of a client: its scripts
(sync and asyncio) are the checked ones. A script whose text differs has
another SHA, so a server that ran the unchecked one keeps both apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from rqueue.engine import async_scripts, loader, scripts

# The error code of a key the script was not sent.
UNSENT = "RQ_UNSENT_KEY"

# Which arguments of a command are keys: "all" (every argument), "none",
# or the first (any command not listed). A command the scripts never send
# that takes its keys elsewhere (XREAD's STREAMS, ZUNIONSTORE's numkeys)
# is refused by the prelude rather than guessed (UNKNOWN below).
_ALL_KEYS = ("DEL", "UNLINK", "EXISTS", "MGET", "TOUCH")
_NO_KEYS = ("PUBLISH", "TIME", "PING", "ECHO", "INFO")
_UNKNOWN = (
    "XREAD",
    "XREADGROUP",
    "ZUNIONSTORE",
    "ZINTERSTORE",
    "ZDIFFSTORE",
    "SUNIONSTORE",
    "SINTERSTORE",
    "SDIFFSTORE",
    "EVAL",
    "EVALSHA",
    "FCALL",
    "MSET",
    "SORT",
    "KEYS",
    "SCAN",
    "RENAME",
    "RENAMENX",
    "COPY",
    "SMOVE",
    "LMOVE",
    "RPOPLPUSH",
    "BLMOVE",
    "ZRANGESTORE",
    "GEORADIUS",
    "OBJECT",
    "MEMORY",
    "DEBUG",
    "MIGRATE",
)


def _lua_set(names: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"[{name!r}] = true" for name in names) + "}"


def prelude(name: str) -> str:
    """The Lua put before script ``name``'s text: one local, ``redis``."""
    return f"""local redis = (function()
  local real = redis
  local sent = {{}}
  for _, k in ipairs(KEYS) do
    sent[k] = true
  end
  local allKeys, noKeys, unknown = {_lua_set(_ALL_KEYS)}, {_lua_set(_NO_KEYS)}, {_lua_set(_UNKNOWN)}
  local function check(cmd, ...)
    local up = string.upper(cmd)
    if noKeys[up] then
      return
    end
    if unknown[up] then
      error('{UNSENT} {name}.lua: ' .. up .. ' takes keys the checker does not find (tests/support/keycheck.py)')
    end
    local args = {{...}}
    local last = allKeys[up] and #args or 1
    for i = 1, last do
      local key = tostring(args[i])
      if not sent[key] then
        error('{UNSENT} {name}.lua: ' .. up .. ' touched ' .. key .. ', which is not in its KEYS')
      end
    end
  end
  return setmetatable({{
    call = function(cmd, ...)
      check(cmd, ...)
      return real.call(cmd, ...)
    end,
    pcall = function(cmd, ...)
      check(cmd, ...)
      return real.pcall(cmd, ...)
    end,
  }}, {{__index = real}})
end)()
"""


def with_prelude(name: str, text: str) -> str:
    """``text`` (script ``name``'s, perhaps with a ``#!lua`` first line)
    with the prelude after that line."""
    if text.startswith("#!"):
        first, _, rest = text.partition("\n")
        return f"{first}\n{prelude(name)}{rest}"
    return prelude(name) + text


@contextmanager
def checked_scripts() -> Iterator[None]:
    """While open, clients made get scripts that check their keys."""

    def checked_texts(name: str, shebang: bool = True) -> dict[str, str]:
        # each layout's text (loader.layout_texts), checked alike
        return {layout: with_prelude(name, text) for layout, text in loader.layout_texts(name, shebang).items()}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scripts, "cached_texts", checked_texts)
        mp.setattr(async_scripts, "cached_texts", checked_texts)
        yield
