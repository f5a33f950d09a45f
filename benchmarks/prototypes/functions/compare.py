"""Do FCALL and EVALSHA give the same replies? Runs one deterministic
rqueue session (a ManualClock, so every script is passed its time; a seeded
Randomness, incarnations included) and records every script call: name,
keys, args, reply (or error text). The session touches publish (plain,
batch, priority, keyed, delayed, with ids), fetch, ack, ack_and_fetch,
nack, reject, in_progress, heartbeat, lease expiry and redelivery, dead
letters and their replay, stats, status, pause/resume, purge,
settle_through, group reset and delete, leave, and the error paths of a
double ack, an unknown tag, a damaged record and a damaged cursor.

usage (from the clone's root):
  .venv/bin/python benchmarks/prototypes/functions/compare.py
      runs the session four times, each in a fresh process and on a fresh
      server: EVALSHA and FCALL on a private redis-server, EVALSHA and FCALL
      on memory:// (fakeredis), then compares the records
  .venv/bin/python benchmarks/prototypes/functions/compare.py run MODE URL OUT
      one session (MODE evalsha or fcall)
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]


def jsonable(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode("utf-8", "backslashreplace")
    if isinstance(x, (list, tuple)):
        return [jsonable(y) for y in x]
    if isinstance(x, BaseException):
        return {"error": type(x).__name__, "text": str(x)}
    return x


def session(url: str, record: list[Any]) -> None:
    import rqueue
    from rqueue.engine import scripts as S
    from rqueue.randomness import Randomness

    rng = Randomness(7)
    Randomness.unique = lambda self, nbytes=8: rng.token(nbytes)  # type: ignore[method-assign]
    original_call = S.Script.__call__

    def recorded(self: Any, keys: Any, args: Any, client: Any = None) -> Any:
        if client is not None:
            return original_call(self, keys, args, client)
        entry: dict[str, Any] = {"script": self.name, "keys": jsonable(list(keys)), "args": jsonable(list(args))}
        record.append(entry)
        try:
            reply = original_call(self, keys, args)
        except Exception as exc:
            entry["reply"] = jsonable(exc)
            raise
        entry["reply"] = jsonable(reply)
        return reply

    original_send = S.ScriptPipeline._send

    def recorded_send(self: Any, commands: Any) -> Any:
        replies = original_send(self, commands)
        for (script, args), reply in zip(commands, replies, strict=True):
            name = script.name if script is not None else None
            record.append({"pipelined": name, "command": jsonable([str(args[0]), *args[2:]]), "reply": jsonable(reply)})
        return replies

    S.Script.__call__ = recorded  # type: ignore[method-assign]
    S.ScriptPipeline._send = recorded_send  # type: ignore[method-assign]

    def step(what: str, fn: Any) -> None:
        record.append({"step": what})
        try:
            fn()
        except Exception as exc:
            record.append({"step-error": what, "error": type(exc).__name__, "text": str(exc)})

    clock = rqueue.ManualClock()
    client = rqueue.connect(url, prefix="cmp", clock=clock, randomness=Randomness(11))
    client.configure("q", ack_wait=30, max_deliveries=3)
    q = client.queue("q")
    c1 = q.consumer("g", "c1")
    c2 = q.consumer("g", "c2")
    held: dict[str, Any] = {}

    step("publish", lambda: q.publish(b"one", headers={"h": "v"}, id="id-1"))
    step("publish dup id", lambda: q.publish(b"one again", id="id-1"))
    step("publish_many", lambda: q.publish_many([b"m%d" % i for i in range(20)]))
    step("publish delayed", lambda: q.publish(b"later", delay=5))
    step("fetch 1", lambda: held.__setitem__("a", c1.fetch(1)))
    step("ack 1", lambda: c1.ack(held["a"]))
    step("ack again", lambda: c1.ack(held["a"]))
    step("fetch 5", lambda: held.__setitem__("b", c1.fetch(5)))
    step("ack_and_fetch", lambda: held.__setitem__("c", c1.ack_and_fetch(held["b"][:3], 2)))
    step("nack", lambda: c1.nack(held["b"][3], delay=1))
    step("nack policy", lambda: c1.nack(held["b"][4], error="boom"))
    step("reject", lambda: c1.reject(held["c"][1][0], reason="bad"))
    step("in_progress", lambda: c1.in_progress(held["c"][1][1]))
    step("heartbeat", lambda: c1.heartbeat([held["c"][1][1]], 30))
    step("fetch c2", lambda: held.__setitem__("d", c2.fetch(4)))
    step("advance past ack_wait", lambda: clock.advance(60))
    step("fetch after expiry", lambda: held.__setitem__("e", c1.fetch(10)))
    step("ack expired c2 tag", lambda: c2.ack(held["d"]))
    step("ack_available", lambda: c1.ack_available(held["e"]))
    step("stats", lambda: q.stats())
    step("status", lambda: q.status("id-1"))
    step("status seq", lambda: q.status(seq=3))
    step("priority and keys", lambda: q.publish_many([b"p"] * 6, priority=[1, 5, 9, 0, 3, 3]))
    step("keyed", lambda: q.publish_many([b"k"] * 6, key=["a", "b", "a", "c", "a", "b"]))
    step("fetch flow", lambda: held.__setitem__("f", c1.fetch(8)))
    step("ack flow", lambda: c1.ack(held["f"]))
    for i in range(4):
        step(f"dead-letter round {i}", lambda: held.__setitem__("g", c2.fetch(3)))
        step(f"nack round {i}", lambda: [c2.nack(d, delay=0) for d in held.get("g") or []])
    step("dead letters", lambda: q.dead_letters())
    step("replay dead letters", lambda: q.replay_dead_letters())
    step("fetch replayed", lambda: held.__setitem__("h", c1.fetch(10)))
    step("ack replayed", lambda: c1.ack(held["h"]))
    step("pause", lambda: q.pause("g", mode="hold"))
    step("fetch paused", lambda: c1.fetch(2))
    step("resume", lambda: q.resume("g"))
    step("publish more", lambda: held.__setitem__("p", q.publish_many([b"z"] * 10)))
    step("damaged record", lambda: client.redis.hset("cmp:{q}:msgs", str(held["p"][2].seq), "garbage"))
    step("fetch with damaged", lambda: held.__setitem__("i", c1.fetch(20)))
    step("damaged floor", lambda: client.redis.hset("cmp:{q}:floors", "g", "bad"))
    step("ack with damaged floor", lambda: c1.ack(held["i"][:2]))
    step("floor back", lambda: client.redis.hset("cmp:{q}:floors", "g", "0"))
    step("settle_through", lambda: q.settle_through("g", 30))
    step("create group", lambda: q.create_group("g2"))
    step("reset group", lambda: q.reset_group("g2", "last"))
    step("delete group", lambda: q.delete_group("g2", force=True))
    step("damaged cursor", lambda: client.redis.hset("cmp:{q}:grp:g", "cursor", "nope"))
    step("fetch with damaged cursor", lambda: c1.fetch(2))
    step("leave c2", lambda: c2.close())
    step("purge", lambda: q.purge())
    step("stats end", lambda: q.stats())
    client.close()


def run(mode: str, url: str, out: str) -> None:
    if mode == "fcall":
        import fcall

        fcall.install()
    record: list[Any] = []
    session(url, record)
    Path(out).write_text(json.dumps(record, indent=1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="rqueue-fcmp-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"redis://127.0.0.1:{port}"
        time.sleep(0.05)
    raise SystemExit("redis-server did not start")


# Where an error() stood: the EVALSHA form names the sha and @user_script,
# the FCALL form the function and @user_function, fakeredis a traceback.
_WHERE = re.compile(r" script: \w+, on @user_(script|function):\d+\.|user_(script|function):\d+: ")


def normalized(record: list[Any]) -> list[Any]:
    text = json.dumps(record)
    return json.loads(_WHERE.sub("<where> ", text))


def main() -> int:
    outs = {}
    tmp = tempfile.mkdtemp(prefix="rqueue-fcmp-")
    for backend in ("redis", "memory"):
        for mode in ("evalsha", "fcall"):
            server = None
            if backend == "redis":
                server, url = start_server()
            else:
                url = f"memory://cmp-{mode}"
            out = os.path.join(tmp, f"{backend}-{mode}.json")
            try:
                subprocess.run([sys.executable, __file__, "run", mode, url, out], check=True)
            finally:
                if server is not None:
                    server.terminate()
                    server.wait(10)
            outs[(backend, mode)] = json.loads(Path(out).read_text())
    status = 0
    for a, b in (
        (("redis", "evalsha"), ("redis", "fcall")),
        (("memory", "evalsha"), ("memory", "fcall")),
        (("redis", "evalsha"), ("memory", "fcall")),
    ):
        ra, rb = outs[a], outs[b]
        calls = sum(1 for e in ra if "script" in e or "pipelined" in e)
        exact = ra == rb
        diffs = [(x, y) for x, y in zip(normalized(ra), normalized(rb), strict=False) if x != y]
        if len(ra) != len(rb):
            diffs.append(({"length": len(ra)}, {"length": len(rb)}))
        replies = sum(1 for x, _ in diffs if "step-error" not in x)
        print(
            f"{'/'.join(a)} vs {'/'.join(b)}: {calls} script calls, {len(ra)} records; identical: {exact}; "
            f"once where-an-error-stood is set aside, {replies} script replies differ and "
            f"{len(diffs) - replies} exceptions' texts (rqueue strips a sha's location, not a function's)"
        )
        raw = [(x, y) for x, y in zip(ra, rb, strict=False) if x != y]
        for x, y in raw[:6]:
            print("   ", json.dumps(x)[:400])
            print("  vs", json.dumps(y)[:400])
        if replies:
            status = 1
    errors = [e for e in outs[("redis", "evalsha")] if "step-error" in e]
    print(f"steps that raised (the same in every run when the above match): {len(errors)}")
    for e in errors:
        print("   ", e["step-error"], e["error"], e["text"][:200])
    print(f"records in {tmp}")
    return status


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        run(*sys.argv[2:5])
    else:
        sys.exit(main())
