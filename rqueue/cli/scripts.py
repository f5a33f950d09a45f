"""``rqueue scripts load|list|check``: rqueue's Lua scripts on the server,
for the setup where an administrator loads them and the application's user
may only run them (EVALSHA without SCRIPT LOAD, docs/ACL.md).

Every server the URL reaches is covered: each node of a cluster and a
Sentinel service's replicas too, since SCRIPT LOAD is not replicated and a
promoted replica starts without the scripts. The script cache is the
server's, shared by every key prefix, so ``--prefix`` changes nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from rqueue.cli.common import EXIT_ERROR, connection, emit_json, table
from rqueue.engine.script_admin import ServerScripts, load_everywhere, where_held

HINT = "run `rqueue scripts load` as an administrator (a user allowed SCRIPT LOAD); see docs/ACL.md"


def _scripts(client: Any) -> list[dict[str, str]]:
    return [{"name": name, "sha1": script.sha} for name, script in client.scripts.by_name().items()]


def _server_json(entry: ServerScripts, names: Sequence[str], key: str) -> dict[str, Any]:
    return {
        "server": entry.server,
        "role": entry.role,
        key: list(entry.held),
        # None: not known (the server could not be asked, or refused)
        "missing": None if entry.error and not entry.held else [n for n in names if n not in entry.held],
        "error": entry.error,
    }


def _label(entry: ServerScripts) -> str:
    return entry.server if entry.role == "server" else f"{entry.server} ({entry.role})"


def _report_errors(entries: Sequence[ServerScripts]) -> bool:
    """Prints each server's error on stderr; True when there was one."""
    failed = [e for e in entries if e.error]
    for entry in failed:
        click.echo(f"error: {_label(entry)}: {entry.error}", err=True)
    return bool(failed)


@click.group()
def scripts() -> None:
    """rqueue's Lua scripts on the server: load them as an administrator, list or check them (docs/ACL.md)."""


@scripts.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"scripts": [{name, sha1}], "servers": [{server, role, loaded, missing, error}]}.',
)
@click.pass_context
def load(ctx: click.Context, as_json: bool) -> None:
    """Load every script on every server the URL reaches (SCRIPT LOAD: run it as an administrator)."""
    obj = ctx.obj
    with connection(obj["url"], obj["prefix"]) as client:
        listed = _scripts(client)
        entries = load_everywhere(client.redis, client.scripts.by_name())
    names = [s["name"] for s in listed]
    if as_json:
        emit_json({"scripts": listed, "servers": [_server_json(e, names, "loaded") for e in entries]})
    else:
        for entry in entries:
            if not entry.error:
                click.echo(f"{_label(entry)}: loaded {len(entry.held)} scripts")
    if _report_errors(entries):
        click.echo(f"error: some scripts are not loaded: {HINT}", err=True)
        ctx.exit(EXIT_ERROR)


def _held(ctx: click.Context) -> tuple[list[dict[str, str]], list[ServerScripts]]:
    obj = ctx.obj
    with connection(obj["url"], obj["prefix"]) as client:
        return _scripts(client), where_held(client.redis, client.scripts.by_name())


def _missing(entries: Sequence[ServerScripts], names: Sequence[str]) -> list[tuple[ServerScripts, list[str]]]:
    return [(e, [n for n in names if n not in e.held]) for e in entries if not e.error and len(e.held) < len(names)]


@scripts.command("list")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"scripts": [{name, sha1}], "servers": [{server, role, held, missing, error}]}.',
)
@click.pass_context
def list_scripts(ctx: click.Context, as_json: bool) -> None:
    """Show rqueue's scripts (name, SHA-1) and which server holds each (SCRIPT EXISTS)."""
    listed, entries = _held(ctx)
    names = [s["name"] for s in listed]
    if as_json:
        emit_json({"scripts": listed, "servers": [_server_json(e, names, "held") for e in entries]})
    else:
        headers = ["script", "sha1", *(_label(e) for e in entries)]
        rows = [
            [s["name"], s["sha1"], *("?" if e.error else "yes" if s["name"] in e.held else "no" for e in entries)]
            for s in listed
        ]
        click.echo(table(headers, rows))
    if _report_errors(entries):
        ctx.exit(EXIT_ERROR)


@scripts.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"ok": bool, "scripts": [{name, sha1}], "servers": [{server, role, held, missing, error}]}.',
)
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Exit 0 when every server holds every script; else name what is missing and exit 1."""
    listed, entries = _held(ctx)
    names = [s["name"] for s in listed]
    missing = _missing(entries, names)
    ok = not missing and not any(e.error for e in entries)
    if as_json:
        emit_json({"ok": ok, "scripts": listed, "servers": [_server_json(e, names, "held") for e in entries]})
    elif ok:
        where = entries[0].server if len(entries) == 1 else f"all {len(entries)} servers"
        click.echo(f"all {len(names)} scripts are loaded on {where}")
    failed = _report_errors(entries)
    for entry, lacking in missing:
        click.echo(f"error: {_label(entry)} lacks {len(lacking)} of {len(names)}: {', '.join(lacking)}", err=True)
    if missing or failed:
        if missing:
            click.echo(f"error: {HINT}", err=True)
        ctx.exit(EXIT_ERROR)
