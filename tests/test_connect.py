"""Connecting: the URLs rqueue takes (redis://, rediss://, unix://,
memory://, redis+cluster://); a non-Redis or unreachable URL and a server too
old for the scripts get a clear error naming the URL (never its password;
docs/guarantees.md, "Bad input"); a server that may evict queue data gets a
warning.

Every server used here is started by this module on a free port and stopped
at its end; the machine's shared Redis on 6379 is never contacted.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from support.refusals import everything_shown
from support.servers import start_server, wait_for

import rqueue
import rqueue.aio
import rqueue.client
from rqueue import ConnectionFailed, InvalidInput, InvalidURL, ServerTooOld
from rqueue.connection.memory import CompiledOnce
from rqueue.embedded import EmbeddedServer, free_port

SECRET = "s3cret"
KINDS = ("redis", "valkey")


# -- servers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_servers() -> Iterator[dict[str, EmbeddedServer]]:
    """Private servers of this module, started on first use: "redis",
    "valkey", and "<kind>-lru" with maxmemory-policy allkeys-lru."""
    started: dict[str, EmbeddedServer] = {}
    yield started
    for server in started.values():
        server.stop()


def _server(own_servers: dict[str, EmbeddedServer], kind: str, lru: bool = False) -> EmbeddedServer:
    key = f"{kind}-lru" if lru else kind
    if key not in own_servers:
        extra = ["--maxmemory-policy", "allkeys-lru"] if lru else []
        own_servers[key] = start_server(kind, extra_args=extra)
    return own_servers[key]


@pytest.fixture(params=KINDS)
def server(request: pytest.FixtureRequest, own_servers: dict[str, EmbeddedServer]) -> EmbeddedServer:
    """A real server (Redis or Valkey) with the default noeviction policy."""
    return _server(own_servers, request.param)


@pytest.fixture(params=KINDS)
def lru_server(request: pytest.FixtureRequest, own_servers: dict[str, EmbeddedServer]) -> EmbeddedServer:
    """A real server whose maxmemory-policy may evict keys."""
    return _server(own_servers, request.param, lru=True)


@pytest.fixture
def acl_user(server: EmbeddedServer) -> Iterator[tuple[str, EmbeddedServer]]:
    """A user "rq-user" with password "right" that may run everything but
    CONFIG (as a managed Redis often has it)."""
    admin = redis.Redis(port=server.port)
    admin.acl_setuser(
        "rq-user", enabled=True, passwords=["+right"], keys=["~*"], channels=["*"], commands=["+@all", "-config"]
    )
    yield "rq-user", server
    admin.acl_deluser("rq-user")
    admin.close()


class _Answer(socketserver.BaseRequestHandler):
    reply = b""

    def handle(self) -> None:
        if self.reply:
            self.request.sendall(self.reply)
        # returning closes the connection


NOT_REDIS = {
    # reply -> what the error must say
    b"HTTP/1.1 400 Bad Request\r\n\r\n": "does not speak the Redis protocol",
    b"": "closed",
}


@pytest.fixture(params=list(NOT_REDIS), ids=["http-400", "closes-at-once"])
def not_redis(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a TCP server on 127.0.0.1 that answers any connection with
    an HTTP error (or nothing) and closes it."""
    handler = type("Handler", (_Answer,), {"reply": request.param})
    request.node.expected_reason = NOT_REDIS[request.param]
    tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    tcp.daemon_threads = True
    thread = threading.Thread(target=tcp.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{tcp.server_address[1]}/0"
    tcp.shutdown()
    tcp.server_close()
    thread.join(5)


def _connected_clients(server: EmbeddedServer) -> int:
    """Connections to ``server`` other than the one asking."""
    probe = redis.Redis(port=server.port)
    try:
        return len(probe.client_list()) - 1
    finally:
        probe.close()


# -- URLs -----------------------------------------------------


@pytest.mark.parametrize(
    "url, why",
    [
        pytest.param(
            "http://x", "scheme must be one of redis://, rediss://, unix://, memory://, redis+cluster://", id="http"
        ),
        pytest.param("ftp://127.0.0.1/0", "scheme must be one of", id="ftp"),
        pytest.param("redis+cluster://127.0.0.1:7000/1", "a Redis Cluster has only database 0, not 1", id="cluster-db"),
        pytest.param("redis+cluster://127.0.0.1:7000/x", "the path '/x' is not a database number", id="cluster-path"),
        pytest.param("localhost:6379", "scheme must be one of", id="no-scheme"),
        pytest.param("redis:/127.0.0.1:1/0", "scheme must be one of", id="one-slash"),
        pytest.param("", "scheme must be one of", id="empty"),
        pytest.param("redis://127.0.0.1:notaport/0", "Port could not be cast to integer", id="bad-port"),
        pytest.param("redis://127.0.0.1:1/abc", "the path '/abc' is not a database number", id="db-not-a-number"),
        pytest.param("redis://127.0.0.1:1/0/1", "the path '/0/1' is not a database number", id="db-path"),
        pytest.param("memory://[x", "Invalid IPv6 URL", id="memory-unparseable"),
    ],
)
def test_url_rqueue_cannot_use(url, why):
    # given a URL of a kind rqueue does not work with
    # when connecting
    with pytest.raises(InvalidURL) as exc:
        rqueue.connect(url)
    # then the URL and the reason are named (nothing was contacted)
    assert exc.value.url == url
    assert f"invalid URL {url}: " in str(exc.value)
    assert why in str(exc.value)


@pytest.mark.parametrize(
    "url, shown",
    [
        pytest.param(None, "<NoneType>", id="none"),
        pytest.param(6379, "<int>", id="int"),
        pytest.param(["redis://127.0.0.1:1/0"], "<list>", id="list"),
        pytest.param(b"redis://u:s3cret@127.0.0.1:1/0", "redis://u:***@127.0.0.1:1/0", id="bytes"),
    ],
)
def test_url_that_is_not_a_str(url, shown, caplog):
    # given a URL that is not a str
    # when connecting
    with pytest.raises(InvalidURL) as exc:
        rqueue.connect(url)
    # then its type is named (a bytes URL is shown masked)
    assert exc.value.url == shown
    assert f"must be a str, not {type(url).__name__}" in str(exc.value)
    assert SECRET not in everything_shown(exc.value, caplog)


def test_memory_url_works():
    # given no server at all
    # when connecting to memory://
    with rqueue.connect("memory://test-connect") as client:
        # then it works
        assert client.queue("q").publish(b"x").seq == 1


def test_memory_urls_with_the_same_name_share_data(prefix):
    a = rqueue.connect("memory://shared-test", prefix=prefix)
    b = rqueue.connect("memory://shared-test", prefix=prefix)
    a.queue("q").publish(b"x")
    assert b.queue("q").stats().last_seq == 1


def test_a_memory_server_compiles_each_script_once(prefix):
    # given a memory:// server whose scripts have run once, from a sync and an asyncio client
    url = f"memory://compile-{prefix}"
    sync = rqueue.connect(url, prefix=prefix)
    q = sync.queue("q")
    q.publish_many([b"a", b"b", b"c"])
    consumer = q.consumer("g", name="w")
    consumer.ack(consumer.fetch(1))
    runtime = sync.redis.connection_pool.connection_kwargs["server"]._lua_runtime
    assert isinstance(runtime, CompiledOnce)
    compiled = dict(runtime.chunks)

    async def from_asyncio() -> None:
        async with await rqueue.aio.connect(url, prefix=prefix) as client:
            aq = client.queue("q")
            await aq.publish(b"d")
            c = aq.consumer("g", name="w")
            await c.ack(await c.fetch(1))

    # when the same calls run again on both
    consumer.ack(consumer.fetch(1))
    q.publish(b"e")
    asyncio.run(from_asyncio())
    # then they ran on the chunks compiled the first time
    assert compiled and all(runtime.chunks[text] is chunk for text, chunk in compiled.items())
    assert consumer.fetch(5) and q.stats().last_seq == 5
    sync.close()


def test_a_compiled_script_starts_afresh_at_each_call():
    # given a memory:// server and a script that fills a table of its own, or fails
    r = rqueue.connect("memory://afresh").redis
    fill = "local t = {} for i = 1, tonumber(ARGV[1]) do t[#t + 1] = i end return #t"
    # when it runs again and again, with a failing run between
    assert [r.eval(fill, 0, n) for n in (3, 1, 2)] == [3, 1, 2]
    with pytest.raises(redis.ResponseError, match="boom"):
        r.eval("return redis.error_reply('boom')", 0)
    # then each run saw its own locals and its own ARGV
    assert r.eval(fill, 0, 4) == 4
    assert r.eval("return ARGV[1] .. KEYS[1]", 1, "k", "a") == b"ak"


def test_unix_socket_url(tmp_path, prefix):
    sock = tmp_path / "redis.sock"
    server = start_server("redis", extra_args=["--unixsocket", str(sock), "--unixsocketperm", "700"])
    try:
        client = rqueue.connect(f"unix://{sock}", prefix=prefix)
        client.queue("q").publish(b"x")
        assert [d.data for d in client.queue("q").consumer("g").fetch()] == [b"x"]
        client.close()
    finally:
        server.stop()


# -- servers rqueue cannot use --------------------------------------------------


def test_unreachable_server(caplog):
    # given a port nobody listens on
    url = f"redis://127.0.0.1:{free_port()}/0"
    # when connecting
    with pytest.raises(ConnectionFailed) as exc:
        rqueue.connect(url)
    # then the URL is named with the reason
    assert exc.value.url == url
    assert f"cannot use {url}: " in str(exc.value)
    assert "refused" in str(exc.value).lower()


def test_unreachable_cluster():
    # given a cluster URL whose node nobody listens on
    url = f"redis+cluster://127.0.0.1:{free_port()}"
    # when connecting
    with pytest.raises(ConnectionFailed) as exc:
        rqueue.connect(url)
    # then the URL is named with the reason
    assert exc.value.url == url
    assert f"cannot use {url}: " in str(exc.value)


def test_cluster_url_of_a_single_server(server):
    # given a server that is not part of a cluster
    url = f"redis+cluster://127.0.0.1:{server.port}"
    # when connecting to it as a cluster
    with pytest.raises(ConnectionFailed) as exc:
        rqueue.connect(url)
    # then the error says what is wrong and what to use instead
    assert "not a Redis Cluster (use redis:// for a single server)" in str(exc.value)


@pytest.mark.parametrize(
    "option, value, why",
    [
        ("failover_timeout", 0, "failover_timeout must be a number of seconds"),
        ("durable_timeout", -1, "durable_timeout must be a number of seconds"),
        ("durable_timeout", "5", "durable_timeout must be a number of seconds"),
        ("durable_replicas", -1, "durable_replicas must be a whole number from 0 to 100"),
        ("durable_replicas", 1.5, "durable_replicas must be a whole number"),
        ("durable_replicas", True, "durable_replicas must be a whole number"),
    ],
)
def test_bad_cluster_and_durability_options(option, value, why):
    # given an option out of range, when connecting
    with pytest.raises(InvalidInput, match=why):
        rqueue.connect("memory://bad-options", **{option: value})


def test_missing_unix_socket():
    # given a socket path that does not exist
    url = "unix:///nonexistent/rqueue-test.sock"
    # when connecting
    with pytest.raises(ConnectionFailed) as exc:
        rqueue.connect(url)
    # then the URL is named
    assert exc.value.url == url
    assert "cannot use unix:///nonexistent/rqueue-test.sock: " in str(exc.value)


def test_server_that_does_not_speak_redis(not_redis, request):
    # given a TCP server that answers with HTTP (or nothing) and hangs up
    # when connecting to it
    with pytest.raises(ConnectionFailed) as exc:
        rqueue.connect(not_redis)
    # then the URL is named with the reason: an answer that is not Redis is
    # called so, a connection closed without an answer too
    assert exc.value.url == not_redis
    assert f"cannot use {not_redis}: " in str(exc.value)
    assert request.node.expected_reason.lower() in str(exc.value).lower()


def test_password_of_a_server_that_does_not_speak_redis_is_not_shown(not_redis, caplog):
    # given a non-Redis server and a URL with a password (sent with AUTH)
    url = not_redis.replace("redis://", f"redis://user:{SECRET}@")
    # when connecting
    with pytest.raises(ConnectionFailed) as exc:
        rqueue.connect(url)
    # then the password is masked
    assert exc.value.url == not_redis.replace("redis://", "redis://user:***@")
    assert SECRET not in everything_shown(exc.value, caplog)


@pytest.fixture
def silent() -> Iterator[str]:
    """The URL of a TCP port on 127.0.0.1 that accepts connections (the
    kernel completes them) and never answers, as a paused Redis does."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    listener.close()


@pytest.mark.parametrize("timeout, within", [(1.0, 1.9), (None, 6.0)], ids=["connect_timeout=1", "default"])
def test_server_that_never_answers(silent, timeout, within):
    # given a server that accepts connections and never answers
    options = {} if timeout is None else {"connect_timeout": timeout}
    # when connecting
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as exc:
        rqueue.connect(silent, **options)
    took = time.monotonic() - started
    # then connecting fails after the connect timeout (default 5 s), not the
    # 30 s a reply may take once connected, and the error says why
    assert (timeout or 5.0) <= took < within, took
    assert exc.value.url == silent
    assert f"no answer within {timeout or 5.0:g} s (connect_timeout)" in str(exc.value)
    # and a connect timeout that is not a positive number of seconds is
    # refused, named, before anything is opened
    for bad in (0, -1, "5", True, float("nan"), float("inf")):
        with pytest.raises(InvalidInput, match=r"connect_timeout must be a positive number of seconds"):
            rqueue.connect(silent, connect_timeout=bad)


@pytest.mark.parametrize(
    "template, shown",
    [
        pytest.param(
            "redis://user:s3cret@127.0.0.1:{port}/0", "redis://user:***@127.0.0.1:{port}/0", id="user-and-password"
        ),
        pytest.param("redis://:s3cret@127.0.0.1:{port}/0", "redis://:***@127.0.0.1:{port}/0", id="password-only"),
        pytest.param("rediss://user:s3cret@127.0.0.1:{port}/0", "rediss://user:***@127.0.0.1:{port}/0", id="tls"),
        pytest.param(
            "redis://127.0.0.1:{port}/0?password=s3cret", "redis://127.0.0.1:{port}/0?password=***", id="query-argument"
        ),
        pytest.param(
            "redis://user:ab/s3cret@127.0.0.1:{port}/0", "redis://user:***@127.0.0.1:{port}/0", id="slash-in-password"
        ),
        pytest.param(
            "redis://user:ab#s3cret@127.0.0.1:{port}/0", "redis://user:***@127.0.0.1:{port}/0", id="hash-in-password"
        ),
        pytest.param("redis://user:s3cret@127.0.0.1:{port}/abc", "redis://user:***@127.0.0.1:{port}/abc", id="bad-db"),
        pytest.param(
            "redis://user:s3cret@127.0.0.1:notaport/0", "redis://user:***@127.0.0.1:notaport/0", id="bad-port"
        ),
        pytest.param("http://user:s3cret@x", "http://user:***@x", id="other-scheme"),
        pytest.param(
            "redis+cluster://user:s3cret@127.0.0.1:{port}", "redis+cluster://user:***@127.0.0.1:{port}", id="cluster"
        ),
        pytest.param("user:s3cret@localhost:6379", "user:***@localhost:6379", id="no-scheme"),
    ],
)
def test_password_in_the_url_is_never_shown(template, shown, caplog):
    # given a URL with a password that cannot be used (nobody listens on port)
    port = free_port()
    url = template.format(port=port)
    # when connecting
    with pytest.raises((InvalidURL, ConnectionFailed)) as exc:
        rqueue.connect(url)
    # then the URL is shown with the password masked, and nowhere else
    assert exc.value.url == shown.format(port=port)
    assert SECRET not in everything_shown(exc.value, caplog)


def test_wrong_password(acl_user, caplog):
    # given a server with a user whose password is "right"
    user, server = acl_user
    url = f"redis://{user}:{SECRET}@127.0.0.1:{server.port}/0"
    # when connecting with another password
    with pytest.raises(ConnectionFailed) as exc:
        rqueue.connect(url)
    # then authentication is named as the cause, and the password is not shown
    assert "authentication failed" in str(exc.value)
    assert exc.value.url == f"redis://{user}:***@127.0.0.1:{server.port}/0"
    assert SECRET not in everything_shown(exc.value, caplog)


# -- server versions --------------------------------------------------------------


@pytest.mark.parametrize("version", ["6.0.9", "5.0.14", "6.1.99", "garbage"])
def test_server_too_old(server, monkeypatch, version):
    # given a real server that reports an old version
    monkeypatch.setattr(rqueue.connection.open, "server_version", lambda r: version)
    before = _connected_clients(server)
    # when connecting
    with pytest.raises(ServerTooOld) as exc:
        rqueue.connect(server.url, prefix="too-old")
    # then the version and the one needed are named, no connection is left
    # open and nothing was written
    assert exc.value.version == version
    assert f"server version {version} is too old: rqueue needs 6.2 or later" in str(exc.value)
    wait_for(lambda: _connected_clients(server) <= before, timeout=5)
    with redis.Redis(port=server.port) as probe:
        assert probe.keys("too-old:*") == []


@pytest.mark.parametrize("version", ["6.2.0", "7.0.15", "8.0.0-rc1"])
def test_server_new_enough(server, monkeypatch, prefix, version):
    # given a real server that reports a version of 6.2 or later
    monkeypatch.setattr(rqueue.connection.open, "server_version", lambda r: version)
    # when connecting
    with rqueue.connect(server.url, prefix=prefix) as client:
        # then it works
        assert client.queue("q").publish(b"x").seq == 1


# -- eviction policy --------------------------------------------------------------


def _eviction_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "rqueue" and "noeviction" in r.getMessage()]


def test_an_evicting_server_is_refused_unless_allowed(lru_server, prefix):
    # given a server whose maxmemory-policy may evict queue data, and a URL with a password
    url = lru_server.url.replace("redis://", f"redis://default:{SECRET}@")
    # when connecting without accepting that
    # then it is refused, naming the policy, the fix and the opt-in, with the password masked
    with pytest.raises(rqueue.EvictionPolicy) as caught:
        rqueue.connect(url, prefix=prefix)
    message = str(caught.value)
    assert "maxmemory-policy allkeys-lru" in message and "noeviction" in message and "allow_eviction" in message
    assert caught.value.policy == "allkeys-lru"
    assert lru_server.url.replace("redis://", "redis://default:***@") in message and SECRET not in message
    # and nothing was written
    assert redis.Redis(port=lru_server.port).keys(f"{prefix}:*") == []


def test_an_evicting_server_is_warned_about_when_allowed(lru_server, prefix, caplog):
    # given a server whose maxmemory-policy may evict queue data, and a URL
    # with a password (the default user takes any)
    caplog.set_level(logging.WARNING, logger="rqueue")
    url = lru_server.url.replace("redis://", f"redis://default:{SECRET}@")
    # when connecting with allow_eviction=True
    with rqueue.connect(url, prefix=prefix, allow_eviction=True) as client:
        # then it works, with one warning naming the policy and the masked URL
        assert client.queue("q").publish(b"x").seq == 1
    [record] = _eviction_warnings(caplog)
    assert record.levelno == logging.WARNING
    assert "maxmemory-policy allkeys-lru" in record.getMessage()
    assert lru_server.url.replace("redis://", "redis://default:***@") in record.getMessage()
    assert SECRET not in caplog.text


def test_noeviction_gets_no_warning(server, prefix, caplog):
    # given a server with the default noeviction policy
    caplog.set_level(logging.WARNING, logger="rqueue")
    # when connecting
    with rqueue.connect(server.url, prefix=prefix):
        pass
    # then nothing is logged about eviction
    assert _eviction_warnings(caplog) == []


def test_policy_check_is_skipped_when_config_is_refused(acl_user, prefix, caplog):
    # given a user that may not run CONFIG
    user, server = acl_user
    caplog.set_level(logging.WARNING, logger="rqueue")
    # when connecting as that user
    with rqueue.connect(f"redis://{user}:right@127.0.0.1:{server.port}/0", prefix=prefix) as client:
        # then connecting works (the policy check is advice only)
        assert client.queue("q").publish(b"x").seq == 1
    assert _eviction_warnings(caplog) == []
