"""The README as a newcomer reads it: its two set-up commands are the ones CI
runs, and every other code block runs, top to bottom, against a private
server standing in for "a Redis of your own on localhost:6379". And every
``rqueue`` command line the docs show is one the CLI parses."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
from support.blocks import Session, code_blocks
from support.servers import start_server

import rqueue
from rqueue.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
YOUR_REDIS = "localhost:6379"  # what the README calls the reader's own Redis


def setup_commands() -> list[str]:
    """The README's ```sh blocks: exactly the two set-up commands."""
    return [b.code.strip() for b in code_blocks(README) if b.lang == "sh"]


def test_exactly_two_setup_commands_and_ci_runs_the_test_command():
    demo, tests = setup_commands()
    assert demo.endswith("rqueue demo") and "[embedded]" in demo
    assert tests.endswith("python -m pytest")
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci_lines


def test_readme_is_short_and_names_no_outside_files():
    assert len(README.splitlines()) <= 250
    assert "../shared" not in README and "shared/" not in README
    assert not re.search(r"\b[0-9a-f]{7,40}\b", README), "no commit hashes"


# Pages other parts of the project add to docs/ (the README's extras table
# links them); each must exist once they are merged.


def test_readme_links_point_at_files():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_demo_command_runs_as_written():
    # The README's first command, exactly, from the repository root: in CI
    # .ci/run made this .venv already, so it installs the embedded extra
    # into it and runs the demo.
    demo = setup_commands()[0]
    env = {k: v for k, v in os.environ.items() if k not in ("RQUEUE_URL", "VIRTUAL_ENV")}
    proc = subprocess.run(["bash", "-c", demo], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok: every message acked or dead-lettered" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.fixture
def your_redis():
    server = start_server("redis")
    yield server
    server.stop()


def test_every_other_block_runs_top_to_bottom(your_redis, tmp_path):
    # given a reader's shell in the repository root, with the README's venv
    # first on PATH and their Redis standing in for localhost:6379
    url = f"redis://127.0.0.1:{your_redis.port}/0"
    env = {k: v for k, v in os.environ.items() if k != "RQUEUE_URL"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    session = Session(cwd=ROOT, env=env, url=url)
    blocks = [b for b in code_blocks(README) if b.lang != "sh"]
    assert [b.lang for b in blocks] == ["bash", "python", "python", "python", "bash"]
    # The install block is the demo command's install with another extra
    # (test_demo_command_runs_as_written runs that one): not run again here,
    # to spare the suite a second build of the package.
    install, demo = blocks[0].code.strip(), setup_commands()[0]
    assert install == demo.split(" && .venv/bin/rqueue")[0].replace("[embedded]", "[metrics]")
    try:
        # when every other block runs in order
        for i, block in enumerate(blocks[1:], start=1):
            code = block.code.replace(YOUR_REDIS, f"127.0.0.1:{your_redis.port}")
            if block.lang == "python":
                session.python(code, str(tmp_path / f"readme_{i}.py"))
            else:
                session.shell(code)
        session.settle()
    finally:
        ended = session.close()
    # then each did what the README says
    for ran in session.ran:
        assert "Traceback" not in ran.stderr, ran
    assert [(r.command.split()[:2], r.returncode) for r in ended] == [
        (["rqueue", "worker"], 0),
        (["python", str(tmp_path / "readme_3.py")], 0),
    ]
    quickstart = next(r for r in session.ran if r.command.endswith("readme_1.py"))
    assert quickstart.stdout == "1 b'{\"order\": 42}'\n"
    producer = next(r for r in session.ran if r.command.endswith("readme_2.py"))
    assert "handling 1 b'{\"order\": 43}' 1" in producer.stdout
    with rqueue.connect(url) as client:
        orders = client.queue("orders").stats()  # the quickstart's message, then the shell's
        assert (orders.last_seq, orders.group("billing").ack_floor, orders.dead_letters) == (2, 2, 0)
        eu = client.queue("orders.eu").stats()
        assert (eu.last_seq, eu.group("billing").ack_floor, eu.dead_letters) == (3, 3, 0)
        [worker_log] = [r.stderr for r in ended if r.command.startswith("rqueue worker")]
        assert "order 46: charged 0" in worker_log
        final = json.loads(worker_log.strip().splitlines()[-1])
        assert final["acked"] == 1


def test_troubleshooting_names_every_error():
    # Every exception rqueue raises has its own entry, so a new one cannot
    # be added without saying what it means and what to do.
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    headings = re.findall(r"^#+ (.*)$", page, re.M)
    for name in rqueue.errors.__all__:
        error = getattr(rqueue.errors, name)
        if name == "RQueueError" or not (isinstance(error, type) and issubclass(error, BaseException)):
            continue  # the root, and what is no exception (from_script_error, LossKind)
        assert any(name in h for h in headings), f"docs/troubleshooting.md has no entry for {name}"


def test_cli_reference_is_generated_from_the_click_group():
    page = (ROOT / "docs" / "cli-reference.md").read_text()
    assert ":module: rqueue.cli" in page and ":command: cli" in page
    assert "mkdocs-click" in (ROOT / "mkdocs.yml").read_text()
    assert ".venv/bin/mkdocs build --strict" in (ROOT / ".ci" / "run").read_text()


def _doc_commands() -> list[tuple[str, str]]:
    """Every ``rqueue`` command line in a shell or console block of the docs
    (page, line), its ``$ `` and trailing comment taken off; synopsis lines
    (``[...]``, ``a|b``) are left out."""
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for block in code_blocks(page.read_text()):
            if block.lang not in ("sh", "bash", "console", "shell"):
                continue
            for line in block.code.splitlines():
                line = line.removeprefix("$ ").strip()
                if line.startswith("rqueue ") and "[" not in line and "|" not in line:
                    found.append((page.name, line))
    return found


@pytest.mark.parametrize("page,line", _doc_commands())
def test_every_cli_command_in_the_docs_parses(page, line):
    # Given a command line as a page of the docs shows it
    args = shlex.split(line, comments=True)[1:]
    # When the CLI parses it (down to its subcommand), without running it
    ctx = cli.make_context("rqueue", list(args), resilient_parsing=False)
    command: click.Command = cli
    while isinstance(command, click.Group) and _unparsed(ctx):
        name, sub, rest = command.resolve_command(ctx, _unparsed(ctx))
        assert sub is not None, f"{page}: {line}: no command {name}"
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
        command = sub
    # Then it names a command and options that exist, with values they take
    assert not isinstance(command, click.Group), f"{page}: {line} names a group, not a command"


def _unparsed(ctx) -> list[str]:
    """What a group left for its subcommand (click 8 keeps the command's name
    apart, in _protected_args; click 9 keeps it in args)."""
    return [*getattr(ctx, "_protected_args", ()), *ctx.args]
