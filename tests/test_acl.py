"""ACL: the setups of docs/ACL.md, each run as the user it describes.

- Scripts loaded by an administrator (the recommended rule, ADMIN_LOADED):
  the application's user may run rqueue's scripts by SHA-1 (EVALSHA) but
  neither load a script nor EVAL one, so it runs no Lua of its own. An
  administrator runs ``rqueue scripts load`` (as a user with ADMIN_RULE);
  until then every call that needs a script raises ScriptsNotLoaded naming
  the script and changes nothing.
- The client loads its scripts (SELF_LOADING: SCRIPT LOAD granted too),
  which lets the user run any Lua.

Every server here is private (ACL SETUSER and SCRIPT FLUSH need the default
user, and ACLs and the script cache are per server). memory:// has no ACL,
so the tests are parametrised over Redis and Valkey only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support.everything import exercise_everything, run_cli
from support.servers import missing_binary, server_binary, start_cluster, start_server, wait_for

import rqueue
from rqueue.constants import MAX_BATCH
from rqueue.embedded import EmbeddedSentinelGroup, EmbeddedServer
from rqueue.engine.loader import SCRIPT_NAMES, layout_texts, source
from rqueue.engine.scripts import Script
from rqueue.errors import ScriptsNotLoaded

ROOT = Path(__file__).resolve().parent.parent
SECRET = "Pa55-w0rd-never-shown"
ADMIN_SECRET = "4dm1n-Pa55-also-secret"
KINDS = ["redis", "valkey"]

# -- the rules -------------------------------------------------------------------

# What rqueue needs, for key prefix {prefix}, when an administrator loads the
# scripts (docs/ACL.md explains every entry and holds this same text for the
# default prefix "rq"). Commands run by the Lua scripts are checked against
# the caller's ACL too, so they are listed as well. Not granted, on purpose:
# SCRIPT LOAD and EVAL (Lua of the user's own), CONFIG GET (connect() uses it
# only to warn about maxmemory-policy and skips the check when refused) and
# CLIENT SETINFO (redis-py sends it on connect and ignores a refusal).
ADMIN_LOADED = (
    "~{prefix}:* &{prefix}:* -@all "
    "+ping +info|server +time "
    "+evalsha +script|exists "
    "+multi +exec "
    "+exists +get +set +del "
    "+hdel +hexists +hget +hgetall +hincrby +hkeys +hlen +hmget +hset +hsetnx +hvals +pexpire "
    "+sadd +sismember +smembers +srem "
    "+zadd +zcard +zcount +zmscore +zrange +zrangebyscore +zrem +zremrangebyscore +zscore "
    "+xadd +xdel +xlen +xrange +xread +xrevrange +xtrim "
    "+publish +subscribe"
)
# The same with SCRIPT LOAD: the client loads its scripts, and may load any.
SELF_LOADING = ADMIN_LOADED.replace("+evalsha ", "+evalsha +script|load ")
RULES = {"admin-loaded": ADMIN_LOADED, "self-loading": SELF_LOADING}
# The administrator who loads the scripts: no key, no channel, no data command.
ADMIN_RULE = "-@all +ping +info|server +script|load +script|exists"
# What a cluster client also sends (the slot map), and what the administrator
# also reads to find replicas the slot map leaves out.
CLUSTER_EXTRA = "+cluster|slots +cluster|shards +command"
CLUSTER_ADMIN_EXTRA = f"{CLUSTER_EXTRA} +cluster|nodes"

# Refusals the users here may cause, all harmless (docs/ACL.md).
EXPECTED_REFUSALS = {"config|get", "client|setinfo"}


def acl_rule(prefix: str, setup: str = "admin-loaded") -> str:
    return RULES[setup].format(prefix=prefix)


def create_user(admin: redis.Redis, name: str, password: str, prefix: str, setup: str = "admin-loaded") -> None:
    admin.execute_command("ACL", "SETUSER", name, "reset", "on", f">{password}", *acl_rule(prefix, setup).split())


def create_admin(admin: redis.Redis, name: str = "rq-admin", extra: str = "") -> None:
    rule = f"{ADMIN_RULE} {extra}".split()
    admin.execute_command("ACL", "SETUSER", name, "reset", "on", f">{ADMIN_SECRET}", *rule)


def granted_commands(rule: str) -> set[str]:
    return {word[1:] for word in rule.split() if word.startswith("+")}


def refusals(admin: redis.Redis) -> list[dict[str, str]]:
    """ACL LOG, as {reason, object, context, username} per entry."""
    out = []
    for e in admin.execute_command("ACL", "LOG"):
        if isinstance(e, list):  # RESP2 flat list
            e = dict(zip(e[::2], e[1::2], strict=True))
        entry = {(k.decode() if isinstance(k, bytes) else k): v for k, v in e.items()}
        out.append(
            {
                k: (v.decode() if isinstance(v, bytes) else str(v))
                for k, v in entry.items()
                if k in ("reason", "object", "context", "username")
            }
        )
    return out


def unexpected_refusals(admin: redis.Redis, allowed: set[str] = EXPECTED_REFUSALS) -> list[dict[str, str]]:
    return [e for e in refusals(admin) if e["reason"] != "command" or e["object"] not in allowed]


def snapshot(admin: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key of the prefix with its serialized value (DUMP)."""
    return {key: admin.dump(key) for key in sorted(admin.scan_iter(match=f"{prefix}:*", count=1000))}


def sha1(name: str) -> str:
    """The SHA1 of script ``name``, or of ``name@stream``: its stream layout's own text."""
    base, _, layout = name.partition("@")
    return hashlib.sha1(source(base, layout=layout or "hash").encode()).hexdigest()


# Every script text by name, as Scripts.by_name lists them: a script's
# stream-layout text, when it has one of its own, as "<name>@stream" after it.
TEXT_NAMES = [
    n for name in SCRIPT_NAMES for n in (name, f"{name}@stream") if "@" not in n or "stream" in layout_texts(name)
]


def held_everywhere(clients: list[redis.Redis]) -> list[list[bool]]:
    return [c.script_exists(*(sha1(name) for name in TEXT_NAMES)) for c in clients]


def user_url(server: EmbeddedServer, user: str = "rq-app", password: str = SECRET) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def load_as_administrator(server: EmbeddedServer, admin: redis.Redis) -> None:
    """``rqueue scripts load`` as a user of ADMIN_RULE."""
    create_admin(admin)
    loaded = run_cli("--url", user_url(server, "rq-admin", ADMIN_SECRET), "scripts", "load", "--json")
    assert loaded.exit_code == 0, loaded.text
    assert ADMIN_SECRET not in loaded.text


@pytest.fixture(params=KINDS)
def private(request: pytest.FixtureRequest) -> Iterator[tuple[EmbeddedServer, redis.Redis]]:
    """A private server of each kind and a client of its default user."""
    server = start_server(request.param)
    admin = redis.Redis(port=server.port)
    try:
        yield server, admin
    finally:
        admin.close()
        server.stop()


# -- the documented rules -------------------------------------------------------------


def test_the_rules_are_the_ones_documented():
    # docs/ACL.md holds the rules of this module for the default prefix "rq"
    text = (ROOT / "docs" / "ACL.md").read_text()
    flat = " ".join(text.split())
    for name, rule in [*RULES.items(), ("administrator", ADMIN_RULE)]:
        assert rule.format(prefix="rq") in flat, f"docs/ACL.md does not hold the {name} rule of tests/test_acl.py"
    assert CLUSTER_EXTRA in flat
    assert f"{ADMIN_RULE} {CLUSTER_ADMIN_EXTRA}" in flat
    for command in granted_commands(SELF_LOADING) | granted_commands(ADMIN_RULE):
        shown = command.upper().replace("|", "\\|")  # a | in a Markdown table is escaped
        assert f"`{shown}`" in text, f"docs/ACL.md does not explain {command.upper()}"


def _lua_code(text: str) -> str:
    text = re.sub(r"--\[(=*)\[.*?\]\1\]", "", text, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", text)


def test_the_rules_grant_every_command_the_scripts_call():
    # a command added to a script must be added to the rules (and docs/ACL.md)
    called = set()
    for path in sorted((ROOT / "rqueue" / "engine" / "lua").rglob("*.lua")):
        code = _lua_code(path.read_text())
        called |= {m.lower() for m in re.findall(r"(?:rcall|redis\.p?call|bulk)\(\s*['\"]([A-Za-z]+)['\"]", code)}
    assert called, "no redis.call found in rqueue/engine/lua/: the pattern is out of date"
    for rule in RULES.values():
        missing = called - granted_commands(rule)
        assert not missing, f"the Lua scripts call {sorted(missing)}, which the rule does not grant"


# -- both setups run everything --------------------------------------------------------


@pytest.mark.parametrize("setup", list(RULES))
def test_restricted_user_runs_everything(private, setup, prefix, caplog):
    # given a fresh script cache and a user limited to the prefix and the rule of the setup
    caplog.set_level(logging.WARNING)
    server, admin = private
    admin.script_flush()
    create_user(admin, "rq-app", SECRET, prefix, setup)
    if setup == "admin-loaded":
        # and an administrator, who may load scripts and nothing else, loads them
        load_as_administrator(server, admin)
    admin.execute_command("ACL", "LOG", "RESET")
    # when everything rqueue does is run as the user
    exercise_everything(user_url(server), prefix)
    # then it all worked (asserted inside), the server refused nothing but
    # the advice-only calls (no SCRIPT LOAD was even tried when the scripts were there)
    assert not unexpected_refusals(admin)
    # nobody logged a failure (the notifier and heartbeat threads log rather than raise)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert all(k.startswith(f"{prefix}:".encode()) for k in admin.scan_iter(count=1000))


def test_a_consumer_refused_xread_waits_on_the_channel(private, prefix, caplog):
    # given a user with the documented rule but XREAD
    server, admin = private
    admin.execute_command(
        "ACL", "SETUSER", "rq-app", "reset", "on", f">{SECRET}", *acl_rule(prefix).replace("+xread ", "").split()
    )
    load_as_administrator(server, admin)
    with rqueue.connect(user_url(server), prefix=prefix) as client:
        q = client.queue("orders")
        c = q.consumer("g", wait_in_redis=True)
        # when it waits for a message with wait_in_redis on, then the fetch still answers
        assert c.fetch(1, timeout=0.2) == []
        # and it says why, and waits on the channel from then on
        assert not c.waits_on_wakes()
        assert "XREAD" in caplog.text and "refused" in caplog.text and SECRET not in caplog.text
        q.publish(b"m")
        assert [d.data for d in c.fetch(1, timeout=2.0)] == [b"m"]
    # and the server refused XREAD only
    assert {e["object"] for e in unexpected_refusals(admin)} == {"xread"}


@pytest.mark.parametrize(("waiting", "refused"), [(1, set()), (150, {"zmscore"})], ids=["one-waiting", "150-waiting"])
def test_a_consumer_refused_zmscore_reads_past_delayed_messages_without_a_claim(private, prefix, waiting, refused):
    # given a user with the documented rule but ZMSCORE (a rule written before it was added)
    server, admin = private
    admin.execute_command(
        "ACL", "SETUSER", "rq-app", "reset", "on", f">{SECRET}", *acl_rule(prefix).replace("+zmscore ", "").split()
    )
    load_as_administrator(server, admin)
    admin.execute_command("ACL", "LOG", "RESET")
    with rqueue.connect(user_url(server), prefix=prefix) as client:
        q = client.queue("orders")
        c = q.consumer("g", ack_wait=60, prefetch=1000)
        # and delayed messages the consumer has passed, then plain ones
        q.publish_many([b"later"] * waiting, delay=600)
        assert c.fetch(10) == []
        q.publish_many([b"m%d" % i for i in range(100)])
        # when it fetches them, then they all come, in order
        got = c.fetch(100)
        assert [d.data for d in got] == [b"m%d" % i for i in range(100)]
        c.ack(got)
    # and fewer waiting than the fetch would claim are read from the schedule
    # (no ZMSCORE); more are looked up, which the server refused, and the
    # script read the records instead of claiming them
    assert {e["object"] for e in unexpected_refusals(admin)} == refused


@pytest.mark.parametrize("setup", list(RULES))
def test_restricted_user_deletes_its_queue(private, setup, prefix):
    # given a queue with a group, a dead letter and a de-duplication id, written by the user
    server, admin = private
    create_user(admin, "rq-app", SECRET, prefix, setup)
    if setup == "admin-loaded":
        load_as_administrator(server, admin)
    admin.set("other:keep", "x")
    with rqueue.connect(user_url(server), prefix=prefix) as client:
        q = client.queue("jobs")
        q.publish(b"a", id="m-1")
        with q.consumer("g") as con:
            con.fetch(1)[0].reject(reason="bad")
        admin.execute_command("ACL", "LOG", "RESET")
        # when it deletes the queue (DEL, inside its prefix; SCAN is not granted:
        # it would list key names outside the prefix)
        assert q.delete() > 0
        # then the queue is gone, nothing outside the prefix was touched, and nothing was refused
        assert "jobs" not in client.queues()
    assert not unexpected_refusals(admin)
    assert admin.get("other:keep") == b"x"


# -- the admin-loaded setup without the scripts ----------------------------------------


def _script_of(q: rqueue.Queue, name: str) -> str:
    """The name of script ``name`` as a call of ``q`` runs it: ``name@stream``
    when the queue's log is a stream and that layout's text differs
    (rqueue/engine/scripts.py, Script.for_keys), else ``name``."""
    script: Script = getattr(q.client.scripts, name)
    return script.for_keys([q.keys.msgs]).name


def _refused(call: Any, q: rqueue.Queue, *names: str) -> ScriptsNotLoaded:
    """The ScriptsNotLoaded that ``call`` raises, naming one of the scripts
    ``names`` as a call of ``q``'s layout runs it."""
    scripts = tuple(_script_of(q, name) for name in names)
    with pytest.raises(ScriptsNotLoaded) as caught:
        call()
    exc = caught.value
    assert isinstance(exc, rqueue.NotPermitted)
    assert exc.script in scripts, f"{exc.script} is not one of {scripts}"
    text = str(exc)
    assert f"'{exc.script}'" in text and exc.sha in text and "rqueue scripts load" in text, text
    return exc


def test_without_the_scripts_every_call_is_refused_until_they_are_loaded(private, prefix):
    # given the admin-loaded setup with the scripts loaded, and a queue with
    # a consumer holding two deliveries and one dead letter
    server, admin = private
    create_user(admin, "rq-app", SECRET, prefix)
    create_admin(admin)
    admin_url = user_url(server, "rq-admin", ADMIN_SECRET)
    assert run_cli("--url", admin_url, "scripts", "load").exit_code == 0
    client = rqueue.connect(user_url(server), prefix=prefix, settings_ttl=0)
    try:
        client.configure("orders", ack_wait=120)
        q = client.queue("orders")
        q.publish_many([b"a", b"b", b"c", b"d"])
        con = q.consumer("g", name="c1")
        first, second, third = con.fetch(3)
        third.reject(reason="bad")
        # when the server loses its scripts (a restart, a failover, SCRIPT FLUSH)
        admin.script_flush()
        admin.execute_command("ACL", "LOG", "RESET")
        before = snapshot(admin, prefix)
        # then every call that runs a script says which one is missing and
        # to run `rqueue scripts load`
        _refused(lambda: q.publish(b"x"), q, "publish")
        _refused(lambda: q.publish_many([b"y"] * (MAX_BATCH + 1)), q, "publish")  # pipelined
        _refused(lambda: con.fetch(1), q, "fetch")
        _refused(first.ack, q, "ack")
        _refused(lambda: con.ack([first, second]), q, "ack")
        _refused(lambda: first.nack(delay=0), q, "nack")
        _refused(lambda: second.reject(reason="no"), q, "reject")
        _refused(first.in_progress, q, "extend")
        _refused(lambda: con.heartbeat([first, second], timeout=5.0, sync=True), q, "heartbeat")
        _refused(lambda: q.consumer("g", name="c2").fetch(1), q, "join")
        _refused(lambda: q.consumer("other").fetch(1), q, "join")
        _refused(con.close, q, "leave")
        _refused(q.replay_dead_letters, q, "replay")
        _refused(q.purge, q, "purge")
        _refused(q.stats, q, "stats")
        ran: list[rqueue.Delivery] = []
        worker = rqueue.Worker(q, "g", ran.append, reconnect_timeout=1.0)
        _refused(lambda: worker.run(install_signal_handlers=False), q, "join", "fetch", "heartbeat", "leave")
        assert ran == []
        # what needs no script goes on working
        assert [m.data for m in q.peek(10)][:2] == [b"a", b"b"]
        assert [d.data for d in q.dead_letters()] == [b"c"]
        assert {e["event"] for e in q.events(10)} == {"dead-lettered"}
        assert "orders" in client.queues()
        assert q.settings().ack_wait == 120
        # the CLI prints the error, without a traceback
        cli = run_cli("--url", user_url(server), "--prefix", prefix, "stats", "orders")
        assert cli.exit_code == 1 and "rqueue scripts load" in cli.text and "Traceback" not in cli.text
        # the user may check the scripts (SCRIPT EXISTS), not load them
        check = run_cli("--url", user_url(server), "scripts", "check", "--json")
        assert check.exit_code == 1
        report = json.loads(check.text[: check.text.rindex("}") + 1])
        assert not report["ok"] and report["servers"][0]["missing"] == TEXT_NAMES
        load = run_cli("--url", user_url(server), "scripts", "load")
        assert load.exit_code == 1 and "refused" in load.text and "script|load" in load.text
        # and nothing was changed; the server refused nothing but SCRIPT LOAD
        assert snapshot(admin, prefix) == before
        assert not unexpected_refusals(admin, EXPECTED_REFUSALS | {"script|load"})
        assert {e["username"] for e in refusals(admin) if e["object"] == "script|load"} == {"rq-app"}

        # when the administrator loads the scripts
        loaded = run_cli("--url", admin_url, "scripts", "load", "--json")
        assert loaded.exit_code == 0, loaded.text
        assert json.loads(loaded.text)["servers"][0]["loaded"] == TEXT_NAMES
        # then the same handles work again: the held deliveries settle ...
        first.ack()
        assert second.nack(delay=0) == "requeued"
        assert [d.data for d in con.fetch(2, timeout=1.0)] == [b"b", b"d"]
        assert q.replay_dead_letters().replayed == 1
        # ... publishing, a worker and the CLI too
        assert q.publish(b"e").seq > 4
        done = threading.Event()
        worker = rqueue.Worker(q, "w", lambda d: done.set() if d.data == b"e" else None)
        worker.start()
        try:
            wait_for(done.is_set, timeout=10)
        finally:
            worker.stop()
            assert worker.join(10)
        assert run_cli("--url", user_url(server), "--prefix", prefix, "stats", "orders").exit_code == 0
        assert run_cli("--url", user_url(server), "scripts", "check").exit_code == 0
    finally:
        client.close()


def test_a_durable_publish_without_the_scripts_stores_nothing(private, prefix):
    # given the admin-loaded setup (with WAIT, which durable publishes send) on a server without the scripts
    server, admin = private
    create_user(admin, "rq-app", SECRET, prefix)
    admin.execute_command("ACL", "SETUSER", "rq-app", "+wait")
    admin.script_flush()
    with rqueue.connect(user_url(server), prefix=prefix, durable_replicas=0) as client:
        q = client.queue("orders")
        # when publishing durably (script calls and WAIT in one pipeline)
        _refused(lambda: q.publish(b"x", durable=True), q, "publish")
        _refused(lambda: q.publish_many([b"y", b"z"], durable=True), q, "publish")
    # then nothing was stored
    assert snapshot(admin, prefix) == {}


# -- what the users may not do -------------------------------------------------------


@pytest.mark.parametrize("setup", list(RULES))
def test_the_application_user_runs_no_lua_of_its_own(private, setup):
    # given either rule
    server, admin = private
    create_user(admin, "rq-app", SECRET, "app", setup)
    user = redis.Redis.from_url(user_url(server))
    try:
        admin.set("other:secret", "x")
        admin.set("app:doomed", "x")
        # then it may not evaluate a script nor load a function library (nor,
        # under the admin-loaded rule, load a script), nor delete outside its
        # prefix, nor read the server's configuration or memory
        refused = [
            ("EVAL", "return 1", "0"),
            ("EVAL_RO", "return 1", "0"),
            ("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('f', function() return 1 end)"),
            ("FCALL", "f", "0"),
            ("SCRIPT", "FLUSH"),
            ("SCRIPT", "KILL"),
            ("DEL", "other:secret"),
            ("UNLINK", "app:doomed"),
            ("INFO", "memory"),
            ("CONFIG", "GET", "*"),
        ]
        if setup == "admin-loaded":
            refused.append(("SCRIPT", "LOAD", "return 1"))
        for command in refused:
            with pytest.raises(redis.exceptions.NoPermissionError):
                user.execute_command(*command)
        assert admin.get("other:secret") == b"x"
        # DEL is granted inside the prefix (Queue.delete(), join.lua)
        assert user.delete("app:doomed") == 1
        # a script someone else loaded runs under this user's ACL: no key outside the prefix
        sha = admin.script_load("return redis.call('GET', 'other:secret')")
        with pytest.raises(redis.ResponseError, match="(?i)permission|acl|can't"):
            user.evalsha(sha, 0)
    finally:
        user.close()


@pytest.fixture(params=KINDS)
def acl_server(request: pytest.FixtureRequest) -> Iterator[tuple[EmbeddedServer, str]]:
    """A server with user "rq-app" restricted to prefix "app" by the self-loading rule."""
    server = start_server(request.param)
    admin = redis.Redis(port=server.port)
    create_user(admin, "rq-app", SECRET, "app", "self-loading")
    admin.close()
    yield server, user_url(server)
    server.stop()


def test_restricted_user_cannot_leave_its_prefix(acl_server):
    # given the self-loading rule, the wider of the two
    server, url = acl_server
    user = redis.Redis.from_url(url)
    admin = redis.Redis(port=server.port)
    try:
        admin.set("other:secret", "x")
        # then it may not read, write or list keys outside its prefix, nor
        # evaluate Lua, nor change the server
        for command in (
            ("GET", "other:secret"),
            ("SET", "other:x", "1"),
            ("DEL", "other:secret"),
            ("HSET", "app2:x", "f", "1"),  # a prefix that merely starts the same
            ("RENAME", "app:x", "app:y"),  # a command rqueue does not need, even inside the prefix
            ("KEYS", "*"),
            ("SCAN", "0"),
            ("FLUSHDB",),
            ("EVAL", "return redis.call('GET', KEYS[1])", "1", "app:x"),
            ("SCRIPT", "FLUSH"),
            ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
            ("PUBLISH", "other:wake", "1"),
            ("SHUTDOWN",),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                user.execute_command(*command)
        # and inside a script of its own the same holds: no key outside the prefix
        sha = user.script_load("return redis.call('HGET', 'other:secret', 'f')")
        with pytest.raises(redis.ResponseError, match="(?i)permission|acl|can't"):
            user.evalsha(sha, 0)
        # and rqueue with another prefix is refused before writing anything
        with (
            rqueue.connect(url, prefix="other") as client,
            pytest.raises(rqueue.NotPermitted, match="(?i)permission"),
        ):
            client.queue("q").publish(b"x")
        assert admin.keys("other:*") == [b"other:secret"]
    finally:
        user.close()
        admin.close()


def test_restricted_user_on_another_database_needs_select(acl_server, prefix):
    # redis-py sends SELECT for a database other than 0: the rule lacks it ...
    server, url = acl_server
    with pytest.raises(rqueue.ConnectionFailed, match="select"):
        rqueue.connect(url.replace("/0", "/1"), prefix="app")
    # ... and works with +select added (docs/ACL.md says so)
    admin = redis.Redis(port=server.port)
    try:
        create_user(admin, "rq-db1", SECRET, "app", "self-loading")
        admin.execute_command("ACL", "SETUSER", "rq-db1", "+select")
        with rqueue.connect(f"redis://rq-db1:{SECRET}@127.0.0.1:{server.port}/1", prefix="app") as client:
            assert client.queue(f"q-{prefix}").publish(b"x").seq == 1
        assert admin.keys("app:*") == []  # database 0 untouched
        db1 = redis.Redis(port=server.port, db=1)
        assert db1.keys("app:*")
        db1.close()
    finally:
        admin.close()


# -- rqueue scripts ------------------------------------------------------------------------


def test_scripts_list_shows_each_script_and_where_it_is(private):
    # given a server that holds some of rqueue's scripts
    server, admin = private
    admin.script_flush()
    admin.script_load(source("ack"))
    # when listing them
    listed = run_cli("--url", server.url, "scripts", "list")
    as_json = run_cli("--url", server.url, "scripts", "list", "--json")
    # then each script is shown with its SHA-1 and whether the server holds it
    assert listed.exit_code == 0, listed.text
    rows = {line.split()[0]: line.split()[1:] for line in listed.text.splitlines()[1:] if line.strip()}
    assert {name: rows[name] for name in ("ack", "fetch")} == {
        "ack": [sha1("ack"), "yes"],
        "fetch": [sha1("fetch"), "no"],
    }
    report = json.loads(as_json.text)
    assert report["scripts"] == [{"name": n, "sha1": sha1(n)} for n in TEXT_NAMES]
    assert report["servers"] == [
        {
            "server": f"127.0.0.1:{server.port}",
            "role": "server",
            "held": ["ack"],
            "missing": [n for n in TEXT_NAMES if n != "ack"],
            "error": None,
        }
    ]
    # and check fails naming what is missing, until load has run
    check = run_cli("--url", server.url, "scripts", "check")
    n = len(TEXT_NAMES)
    assert check.exit_code == 1 and f"lacks {n - 1} of {n}: publish, publish@stream, fetch" in check.text
    assert run_cli("--url", server.url, "scripts", "load").exit_code == 0
    check = run_cli("--url", server.url, "scripts", "check")
    assert check.exit_code == 0 and f"all {n} scripts are loaded on 127.0.0.1:{server.port}" in check.text


def test_scripts_load_covers_every_node_of_a_cluster(prefix):
    # given a cluster (3 primaries, a replica each) with an application user
    # of the admin-loaded rule on every node (ACLs are per server), and no scripts anywhere
    cluster = start_cluster()
    nodes = [redis.Redis(port=node.port) for node in cluster.nodes]
    try:
        for node in nodes:
            create_user(node, "rq-app", SECRET, prefix)
            node.execute_command("ACL", "SETUSER", "rq-app", *CLUSTER_EXTRA.split())
            create_admin(node, extra=CLUSTER_ADMIN_EXTRA)
            node.script_flush()
        app_url = f"redis+cluster://rq-app:{SECRET}@127.0.0.1:{cluster.nodes[0].port}"
        admin_url = f"redis+cluster://rq-admin:{ADMIN_SECRET}@127.0.0.1:{cluster.nodes[0].port}"
        with rqueue.connect(app_url, prefix=prefix) as client:
            q = client.queue("orders")
            # then the user's calls are refused
            _refused(lambda: q.publish(b"x"), q, "publish")
            # when the administrator may not load scripts on one replica
            replica = next(n for n in nodes if n.info("replication")["role"] == "slave")
            replica.execute_command("ACL", "SETUSER", "rq-admin", "-script|load")
            partial = run_cli("--url", admin_url, "scripts", "load", "--json")
            # then that replica is named, and every other node is loaded all the same
            assert partial.exit_code == 1
            port = replica.connection_pool.connection_kwargs["port"]
            assert f"127.0.0.1:{port} (replica): refused" in partial.text and "script|load" in partial.text
            assert sorted(map(all, held_everywhere(nodes))) == [False] + [True] * 5
            # when the administrator loads the scripts through the cluster URL
            replica.execute_command("ACL", "SETUSER", "rq-admin", "+script|load")
            loaded = run_cli("--url", admin_url, "scripts", "load", "--json")
            assert loaded.exit_code == 0, loaded.text
            report = json.loads(loaded.text)
            # then every node holds them, the replicas too (SCRIPT LOAD is not replicated)
            assert sorted(s["role"] for s in report["servers"]) == ["primary"] * 3 + ["replica"] * 3
            assert all(s["loaded"] == TEXT_NAMES for s in report["servers"])
            assert all(all(held) for held in held_everywhere(nodes))
            assert run_cli("--url", admin_url, "scripts", "check").exit_code == 0
            # and the user's calls work
            assert q.publish(b"x").seq == 1
            with q.consumer("g") as con:
                (d,) = con.fetch(1)
                d.ack()
    finally:
        for node in nodes:
            node.close()
        cluster.stop()


def test_scripts_load_covers_the_replicas_of_a_sentinel_service(prefix):
    # given a Sentinel service (a primary, two replicas) with an application
    # user of the admin-loaded rule on every server, and no scripts anywhere
    binary = server_binary("redis")
    if binary is None:
        missing_binary("redis")
    group = EmbeddedSentinelGroup(binary=binary, replicas=2).start()
    servers = [redis.Redis(port=s.port) for s in group.servers]
    try:
        for server in servers:
            create_user(server, "rq-app", SECRET, prefix)
            server.script_flush()
        # when the administrator loads the scripts through the sentinel URL
        loaded = run_cli("--url", group.url, "scripts", "load", "--json")
        assert loaded.exit_code == 0, loaded.text
        # then the primary and both replicas hold them
        report = json.loads(loaded.text)
        assert sorted(s["role"] for s in report["servers"]) == ["primary", "replica", "replica"]
        assert all(all(held) for held in held_everywhere(servers))
        # and after a failover the new primary runs the user's calls at once
        old = group.primary()
        sentinel = redis.Redis(port=group.sentinels[0].port)

        def failover() -> bool:
            try:  # refused until the sentinel has found the replicas
                return bool(sentinel.execute_command("SENTINEL", "FAILOVER", group.service))
            except redis.ResponseError:
                return False

        wait_for(failover, timeout=20, interval=0.1)
        sentinel.close()
        group.wait_for_failover(old, timeout=20)
        app_url = group.url.replace("redis+sentinel://", f"redis+sentinel://rq-app:{SECRET}@")
        with rqueue.connect(app_url, prefix=prefix) as client:
            assert client.queue("orders").publish(b"after failover").seq == 1
    finally:
        for server in servers:
            server.close()
        group.stop()
