"""Redis 7.0 and fakeredis side by side on what a Functions library meets:
each probe is sent to a private redis-server and to a fakeredis server, and
both replies are printed (=, or both texts).

usage: .venv/bin/python benchmarks/prototypes/functions/fakeredis_gaps.py
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from typing import Any

import fakeredis
import redis


def reply(client: Any, *args: Any) -> str:
    try:
        return repr(client.execute_command(*args))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


UPVALUES = "".join(f"local u{i} = {i}\n" for i in range(61))
PROBES: list[tuple[str, list[tuple[Any, ...]]]] = [
    (
        "redis.call read at load time",
        [("FUNCTION", "LOAD", "REPLACE", "#!lua name=a\nlocal rcall = redis.call\n")],
    ),
    ("library without a name", [("FUNCTION", "LOAD", "REPLACE", "redis.register_function('x', function() end)\n")]),
    (
        "61 upvalues in one function",
        [
            (
                "FUNCTION",
                "LOAD",
                "REPLACE",
                "#!lua name=b\n"
                + UPVALUES
                + "redis.register_function('b', function() return u0"
                + "".join(f" + u{i}" for i in range(1, 61))
                + " end)\n",
            )
        ],
    ),
    (
        "an unknown flag",
        [
            (
                "FUNCTION",
                "LOAD",
                "REPLACE",
                "#!lua name=c\nredis.register_function{function_name='c', callback=function() end, flags={'x'}}\n",
            )
        ],
    ),
    (
        "the flags rqueue would use, and FCALL_RO",
        [
            (
                "FUNCTION",
                "LOAD",
                "REPLACE",
                "#!lua name=d\n"
                "redis.register_function{function_name='d_oom', callback=function(k, a) "
                "return redis.call('SET', k[1], a[1]) end, flags={'allow-oom'}}\n"
                "redis.register_function{function_name='d_ro', callback=function(k, a) "
                "return redis.call('SET', k[1], a[1]) end, flags={'no-writes'}}\n",
            ),
            ("FCALL", "d_oom", 1, "k", "v"),
            ("FCALL", "d_ro", 1, "k", "v"),
            ("FCALL_RO", "d_oom", 1, "k", "v"),
        ],
    ),
    ("a missing function", [("FCALL", "nope", 0)]),
    (
        "a library loaded twice without REPLACE",
        [
            ("FUNCTION", "LOAD", "#!lua name=e\nredis.register_function('e', function() return 1 end)\n"),
            ("FUNCTION", "LOAD", "#!lua name=e\nredis.register_function('e', function() return 1 end)\n"),
        ],
    ),
    (
        "a function name taken by another library",
        [("FUNCTION", "LOAD", "#!lua name=e2\nredis.register_function('e', function() return 2 end)\n")],
    ),
    (
        "errors: error(), error_reply, a runtime error",
        [
            (
                "FUNCTION",
                "LOAD",
                "REPLACE",
                "#!lua name=f\n"
                "redis.register_function('f1', function() error('RQ_CORRUPT k holds x') end)\n"
                "redis.register_function('f2', function() return redis.error_reply('RQ_NOT_MEMBER c') end)\n"
                "redis.register_function('f3', function() local t = nil; return t.x end)\n"
                "redis.register_function('f4', function() x = 1 end)\n",
            ),
            ("FCALL", "f1", 0),
            ("FCALL", "f2", 0),
            ("FCALL", "f3", 0),
            ("FCALL", "f4", 0),
        ],
    ),
    (
        "module state kept between calls (what a hoisted per-call local must not rely on)",
        [
            (
                "FUNCTION",
                "LOAD",
                "REPLACE",
                "#!lua name=g\nlocal count = 0\n"
                "redis.register_function('g', function() count = count + 1; return count end)\n",
            ),
            ("FCALL", "g", 0),
            ("FCALL", "g", 0),
        ],
    ),
    (
        "redis.setresp(3) and a map reply",
        [
            ("HSET", "h", "a", "1"),
            (
                "FUNCTION",
                "LOAD",
                "REPLACE",
                "#!lua name=h\nredis.register_function('h', function(k) redis.setresp(3); "
                "local m = redis.call('HGETALL', k[1]); return m.map and 'map' or 'array' end)\n",
            ),
            ("FCALL", "h", 1, "h"),
        ],
    ),
    (
        "FUNCTION DUMP then FLUSH then RESTORE",
        [
            ("FUNCTION", "FLUSH"),
            ("FUNCTION", "LOAD", "#!lua name=i\nredis.register_function('i', function() return 7 end)\n"),
        ],
    ),
]


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", tempfile.mkdtemp(prefix="rqueue-gaps-")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        real = redis.Redis(port=port)
        fake = fakeredis.FakeRedis(version=(7, 0))
        for title, commands in PROBES:
            print(f"- {title}")
            for command in commands:
                a, b = reply(real, *command), reply(fake, *command)
                shown = " ".join(str(x) for x in command)[:70].replace("\n", "\\n")
                print(f"    {shown}")
                print(f"      redis 7.0: {a[:300]}")
                if a != b:
                    print(f"      fakeredis: {b[:300]}")
                else:
                    print("      fakeredis: the same")
        for client, name in ((real, "redis"), (fake, "fakeredis")):
            try:
                dump = client.function_dump()
                client.function_flush()
                client.function_restore(dump)
                print(f"- DUMP/FLUSH/RESTORE on {name}: FCALL i -> {client.fcall('i', 0)!r}")
            except Exception as exc:
                print(f"- DUMP/FLUSH/RESTORE on {name}: {type(exc).__name__}: {exc}")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
