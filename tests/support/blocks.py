"""Runs the code blocks of a Markdown file as a reader would: shell lines
one after the other (``export`` lines carry over), a line ending in
``# Ctrl-C to stop`` (or a Python block whose last line ends in ``# until
Ctrl-C or SIGTERM``) started in the background as in a terminal of its
own, and Python blocks each as a script of their own.

Before each foreground command that follows a background one, the session
waits for the work in hand to be done (every queue but the dead-letter
queues has a group, and no group has anything pending) so that what the reader would see by then is there; at the end
each background process is stopped with SIGTERM, as Ctrl-C would, newest
first, and must exit 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import rqueue
from support.servers import wait_for

BACKGROUND_SHELL = "# Ctrl-C to stop"
BACKGROUND_PYTHON = "# until Ctrl-C or SIGTERM"
COMMAND_TIMEOUT = 120.0  # seconds one foreground command may take


@dataclass
class Block:
    lang: str
    code: str


def code_blocks(markdown: str) -> list[Block]:
    """The fenced code blocks of ``markdown``, in order."""
    return [Block(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", markdown, re.S | re.M)]


@dataclass
class Ran:
    command: str
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Session:
    """One reader's terminals: ``cwd``, environment ``env``, and the URL of
    the server whose queues must be idle before the next command."""

    cwd: Path
    env: dict[str, str]
    url: str | None = None
    background: list[tuple[str, subprocess.Popen[str]]] = field(default_factory=list)
    ran: list[Ran] = field(default_factory=list)

    def shell(self, code: str) -> None:
        for line in code.splitlines():
            command = line.strip()
            if not command or command.startswith("#"):
                continue
            export = re.fullmatch(r"export (\w+)=(\S+)", command.split("  #")[0].strip())
            if export:
                self.env[export.group(1)] = export.group(2)
                continue
            if command.endswith(BACKGROUND_SHELL):
                self.start(command, ["bash", "-c", command])
            else:
                self.settle()
                self.run(command, ["bash", "-c", command])

    def python(self, code: str, name: str) -> None:
        script = self.cwd / name
        script.write_text(textwrap.dedent(code))
        argv = [sys.executable, str(script)]
        if code.rstrip().endswith(BACKGROUND_PYTHON):
            self.start(f"python {name}", argv)
        else:
            self.settle()
            self.run(f"python {name}", argv)

    def run(self, command: str, argv: list[str]) -> Ran:
        proc = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        ran = Ran(command, proc.returncode, proc.stdout, proc.stderr)
        self.ran.append(ran)
        assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return ran

    def start(self, command: str, argv: list[str]) -> None:
        proc = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a signal to its group reaches bash's child too
        )
        self.background.append((command, proc))
        if command.startswith("redis-server"):
            wait_for(lambda: self._answers(), timeout=15)

    def _answers(self) -> bool:
        assert self.url is not None
        try:
            with rqueue.connect(self.url, connect_timeout=1):
                return True
        except rqueue.ConnectionFailed:
            return False

    def settle(self, timeout: float = 60.0) -> None:
        """Waits until every background process is alive and the work in
        hand is done: every queue but the dead-letter queues has a group,
        and no group has anything pending."""
        if not self.background or self.url is None:
            return

        def idle() -> bool:
            for command, proc in self.background:
                assert proc.poll() is None, f"`{command}` exited {proc.returncode}:\n{proc.communicate()}"
            with rqueue.connect(self.url) as client:
                queues = [client.queue(name).stats() for name in client.queues() if not name.startswith("DLQ.")]
            # A queue without a group has not been read yet.
            return all(s.groups and all(g.pending == 0 for g in s.groups) for s in queues)

        wait_for(idle, timeout=timeout, interval=0.1)

    def close(self) -> list[Ran]:
        """Stops the background processes, newest first, as Ctrl-C would;
        returns how each ended."""
        ended = []
        for command, proc in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            ended.append(Ran(command, proc.returncode, out, err))
        self.background.clear()
        return ended
