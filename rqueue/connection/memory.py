"""memory://'s servers: fakeredis servers in this process, by name, whose
Lua runtime compiles each script text once.

fakeredis compiles a script's text again at every EVAL and EVALSHA. rqueue's
scripts carry their includes (the fetch script is over 250 kB), so that
compile took about 4 ms of each call, many times the script's own run.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidURL

_servers: dict[str, Any] = {}
_lock = threading.Lock()

# Distinct texts kept compiled per server: rqueue's scripts in both layouts
# and the few a user or the bench sends. Past it the cache starts again, so
# that a caller sending ever new texts costs compiles, not memory.
CHUNKS_MAX = 512


class CompiledOnce:
    """A fakeredis server's Lua runtime that compiles each text it is given
    to execute once, and calls the compiled chunk after that. A chunk's
    locals are its own at each call, as a script's are in Redis; KEYS and
    ARGV are globals that fakeredis sets before each call."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.chunks: dict[bytes | str, Any] = {}

    def execute(self, code: bytes | str) -> Any:
        chunk = self.chunks.get(code)
        if chunk is None:
            if len(self.chunks) >= CHUNKS_MAX:
                self.chunks.clear()
            chunk = self.chunks[code] = self.runtime.compile(code)
        return chunk()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runtime, name)


def memory_redis(url: str) -> Any:
    """A client of the fakeredis server that ``url`` (memory://<name>)
    names, the server made on first use. InvalidURL when fakeredis is not
    installed."""
    try:
        import fakeredis
    except ImportError:  # pragma: no cover - depends on the install
        raise InvalidURL(
            url, "memory:// needs the memory extra (fakeredis with Lua): pip install 'rqueue[memory]'"
        ) from None
    name = urlsplit(url).netloc or "default"
    with _lock:
        server = _servers.get(name)
        if server is None:
            server = _servers[name] = fakeredis.FakeServer()
            _compile_once(fakeredis.FakeRedis(server=server), server)
    return fakeredis.FakeRedis(server=server)


def _compile_once(client: Any, server: Any) -> None:
    """Makes ``server`` (fresh) build its Lua runtime, then puts CompiledOnce
    around it. A fakeredis that keeps its runtime elsewhere is left as it
    is: slower, not wrong (tests/test_connect.py fails then, to say so)."""
    client.eval("return 1", 0)
    runtime = getattr(server, "_lua_runtime", None)
    if runtime is not None and hasattr(runtime, "compile") and hasattr(runtime, "execute"):
        server._lua_runtime = CompiledOnce(runtime)
    client.close()
