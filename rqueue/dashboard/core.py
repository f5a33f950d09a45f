"""What the pages and actions share: the Dashboard object (client, access,
overview cache, templates), its rendering and the queue look-up."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse

import rqueue
from rqueue.connection.urls import mask_url
from rqueue.protocols import AnyQueue

from . import formats
from .rates import CHART_H, CHART_W
from .security import Access
from .state import Overviews

HERE = Path(__file__).parent
POLL_MS = 2000  # how often a live page asks for fresh figures


class NotFound(rqueue.RQueueError):
    """The page names a queue this prefix never wrote to."""


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is escaped unless a template says otherwise (none does)
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = lambda value: quote(str(value), safe="")
    env.filters["when"] = formats.when
    env.filters["ago"] = formats.ago
    env.filters["duration"] = formats.duration
    env.filters["rate"] = formats.rate
    env.globals["CHART_W"] = CHART_W
    env.globals["CHART_H"] = CHART_H
    return env


class Dashboard:
    """The state behind one app: its client, access settings and formats."""

    def __init__(self, client: rqueue.Client, access: Access, poll_ms: int = POLL_MS) -> None:
        self.client = client
        self.access = access
        self.poll_ms = poll_ms
        self.overviews = Overviews(client)
        self.env = environment()

    # -- rendering ------------------------------------------------------------

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        scope_state = request.scope.get("state", {})
        html = self.env.get_template(template).render(
            base=request.scope.get("root_path", ""),
            csrf=scope_state.get("csrf", ""),
            read_only=self.access.read_only,
            server=mask_url(self.client.url) if self.client.url else "",
            prefix=self.client.prefix,
            poll_ms=self.poll_ms,
            now_ms=int(time.time() * 1000),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def queue(self, name: str) -> AnyQueue:
        """The queue ``name`` (or a dead-letter queue of one) if it exists."""
        q = self.client.queue(name)
        part = q.parts[0] if isinstance(q, rqueue.PartitionedQueue) else q
        root = part.root if isinstance(part, rqueue.Queue) else q.name
        if not self.overviews.has(root):
            raise NotFound(f"queue {name!r} does not exist under prefix {self.client.prefix!r}")
        return q


async def blocking(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs a blocking rqueue call off the event loop."""
    return await run_in_threadpool(call, *args, **kwargs)
