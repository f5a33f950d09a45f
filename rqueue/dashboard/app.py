"""The dashboard's ASGI app: routes, the access guard and page rendering.
Every read and action goes through rqueue's public API (Client.overview,
Queue.stats/peek/events, dead_letters/replay_dead_letters/
purge_dead_letters), the same calls the CLI makes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import rqueue
from rqueue import validate as check

from . import actions, pages
from .core import HERE, POLL_MS, Dashboard, NotFound
from .security import (
    CSRF_COOKIE,
    TOKEN_COOKIE,
    Access,
    Denied,
    new_csrf,
    token_in_query,
    who,
    without_token,
)

log = logging.getLogger("rqueue.dashboard")

# Sent with every response. The policy allows only the dashboard's own script
# and stylesheet: should a value ever escape escaping, no inline script or
# event handler of it would run. Pages are not cached (they hold payloads)
# and cannot be framed by another site.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
Handler = Callable[[Dashboard, Request], Awaitable[Response]]


def route(dash: Dashboard, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` with rqueue's errors turned into pages."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(dash, request)
        except (NotFound, rqueue.NotMember) as exc:  # NotMember: a group that does not exist (pause, resume)
            return dash.render(request, "error.html", 404, title="Not found", message=str(exc))
        except rqueue.InvalidInput as exc:
            return dash.render(request, "error.html", 400, title="Bad request", message=str(exc))
        except Denied as exc:
            return dash.render(request, "error.html", exc.status, title="Refused", message=str(exc))
        except rqueue.RQueueError as exc:
            log.warning("dashboard: %s", exc)
            return dash.render(request, "error.html", 503, title="Redis failed", message=str(exc))

    return endpoint


class Guard:
    """Checks every request before the app sees it: credentials (a token,
    as a bearer header, a cookie or once in the query, or basic auth), the
    read-only mode (no POST at all), and a CSRF cookie for the forms."""

    def __init__(self, app: ASGIApp, dash: Dashboard) -> None:
        self.app = app
        self.dash = dash

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        access = self.dash.access
        secure = request.url.scheme == "https"
        path = scope.get("root_path", "") or "/"
        csrf = request.cookies.get(CSRF_COOKIE)
        fresh = None if csrf else new_csrf()
        extra = list(SECURITY_HEADERS)
        if fresh is not None:
            cookie = Response()
            cookie.set_cookie(CSRF_COOKIE, fresh, httponly=True, samesite="strict", secure=secure, path=path)
            extra += cookie.raw_headers[-1:]

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        token = token_in_query(request, access)
        if token is not None:  # a link with the token: keep it in a cookie, drop it from the address bar
            response: Response = RedirectResponse(without_token(request), 303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", secure=secure, path=path)
            await response(scope, receive, guarded_send)
            return
        try:
            user = who(request, access)
            if access.read_only and request.method not in ("GET", "HEAD"):
                raise Denied(403, "the dashboard is read-only")
        except Denied as exc:
            page = self.dash.render(request, "error.html", exc.status, title="Refused", message=str(exc))
            page.headers.update(exc.headers)
            await page(scope, receive, guarded_send)
            return
        scope.setdefault("state", {}).update(who=user, csrf=csrf or fresh)
        await self.app(scope, receive, guarded_send)


def app(
    client: rqueue.Client | None = None,
    *,
    url: str | None = None,
    prefix: str = "rq",
    token: str | None = None,
    basic_auth: tuple[str, str] | None = None,
    read_only: bool = False,
    poll_ms: int = POLL_MS,
) -> ASGIApp:
    """The dashboard as an ASGI app, to serve with uvicorn or to mount in a
    Starlette or FastAPI app (``api.mount("/rqueue", app(client))``).

    Give a ``client`` or a ``url`` (and ``prefix``). ``token`` or
    ``basic_auth=(user, password)`` require credentials on every request;
    ``read_only`` hides every action and refuses every POST. Whoever serves
    the app decides where it listens: ``rqueue dashboard`` refuses to listen
    beyond loopback without credentials.
    """
    check.whole_number("poll_ms", poll_ms, 200, 3_600_000)
    if client is None:
        if not url:
            raise rqueue.InvalidInput("the dashboard needs a client or a url (a Redis URL), and was given neither")
        client = rqueue.connect(url, prefix=prefix)
    user, password = basic_auth if basic_auth is not None else (None, None)
    access = Access(token=token, basic_user=user, basic_password=password, read_only=bool(read_only))
    dash = Dashboard(client, access, poll_ms)
    routes = [
        Route("/", route(dash, pages.overview)),
        Route("/fragment/overview", route(dash, pages.overview_fragment)),
        Route("/api/overview", route(dash, pages.overview_json)),
        Route("/queue", route(dash, pages.queue_page)),
        Route("/fragment/queue", route(dash, pages.queue_fragment)),
        Route("/messages", route(dash, pages.messages)),
        Route("/dead-letters", route(dash, pages.dead_letters)),
        Route("/dead-letter", route(dash, pages.dead_letter)),
        Route("/dead-letters/replay", route(dash, actions.replay), methods=["POST"]),
        Route("/dead-letters/purge", route(dash, actions.purge), methods=["POST"]),
        Route("/queue/pause", route(dash, actions.pause), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    inner = Starlette(routes=routes)
    return Guard(inner, dash)
