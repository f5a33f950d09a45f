"""``rqueue dashboard``: serve the web dashboard (the ``dashboard`` extra)."""

from __future__ import annotations

import json
import logging
from typing import Any

import click

import rqueue
from rqueue.cli.common import connection


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8700, show_default=True, help="Port to listen on.")
@click.option(
    "--token",
    envvar="RQUEUE_DASHBOARD_TOKEN",
    default=None,
    help="Require this token (16+ characters; env RQUEUE_DASHBOARD_TOKEN): as a bearer header, or once as "
    "?token= in a link, which the browser then keeps in a cookie.",
)
@click.option(
    "--basic-auth",
    envvar="RQUEUE_DASHBOARD_BASIC_AUTH",
    default=None,
    metavar="USER:PASSWORD",
    help="Require HTTP basic auth (env RQUEUE_DASHBOARD_BASIC_AUTH).",
)
@click.option("--read-only", is_flag=True, help="Hide every action and refuse every POST.")
@click.option("--json", "as_json", is_flag=True, help='Print {"url": ..., "read_only": ..., "auth": ...} on start.')
@click.pass_obj
def dashboard(
    obj: dict[str, Any], host: str, port: int, token: str | None, basic_auth: str | None, read_only: bool, as_json: bool
) -> None:
    """Serve the web dashboard: every queue, their groups, messages and
    dead letters, with replay and purge. Listens on 127.0.0.1 unless
    --host is given, which then needs --token or --basic-auth."""
    try:
        import uvicorn

        from rqueue.dashboard import Access, app
        from rqueue.dashboard.security import check_bind, parse_basic
    except ImportError as exc:
        missing = (exc.name or "?").split(".")[0]
        raise rqueue.RQueueError(
            f"the dashboard needs the dashboard extra: pip install 'rqueue[dashboard]' ({missing} is missing)"
        ) from None
    user, password = parse_basic(basic_auth) if basic_auth is not None else (None, None)
    check_bind(host, Access(token=token, basic_user=user, basic_password=password, read_only=read_only))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{port}/"
    with connection(obj["url"], obj["prefix"]) as client:
        served = app(
            client,
            token=token,
            basic_auth=(user, password) if user is not None and password is not None else None,
            read_only=read_only,
        )
        auth = "token" if token else "basic" if basic_auth else "none"
        if as_json:
            click.echo(json.dumps({"url": url, "read_only": read_only, "auth": auth}))
        else:
            click.echo(f"rqueue dashboard on {url} (auth: {auth}{', read-only' if read_only else ''}); Ctrl-C to stop")
        uvicorn.run(served, host=host, port=port, log_level="warning")
