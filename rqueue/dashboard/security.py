"""Who may use the dashboard and how its actions are protected: a token or
HTTP basic auth, required unless it listens on loopback only; a read-only
mode; and a CSRF token on every form (a cookie the page repeats in the form,
which another site can neither read nor set)."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from urllib.parse import urlencode

from starlette.requests import Request

from rqueue.errors import InvalidInput

TOKEN_COOKIE = "rqueue_dashboard_token"
CSRF_COOKIE = "rqueue_dashboard_csrf"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Access:
    """The access settings of one dashboard."""

    token: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None
    read_only: bool = False

    def __post_init__(self) -> None:
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 16):
            raise InvalidInput("the dashboard token must be a str of at least 16 characters")
        if (self.basic_user is None) != (self.basic_password is None):
            raise InvalidInput("basic auth needs both a user and a password")
        if self.basic_user is not None and (not self.basic_user or ":" in self.basic_user):
            raise InvalidInput("the basic auth user must be non-empty and hold no ':'")
        if self.basic_password is not None and not self.basic_password:
            raise InvalidInput("the basic auth password must not be empty")

    @property
    def protected(self) -> bool:
        return self.token is not None or self.basic_user is not None


def parse_basic(value: str) -> tuple[str, str]:
    """``USER:PASSWORD`` as the command line takes it."""
    user, sep, password = value.partition(":")
    if not sep:
        raise InvalidInput("--basic-auth takes USER:PASSWORD")
    return user, password


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, access: Access) -> None:
    """Refuses to listen beyond loopback without a token or basic auth."""
    if not is_loopback(host) and not access.protected:
        raise InvalidInput(
            f"the dashboard would listen on {host!r}, reachable from other machines, without auth: "
            "give --token or --basic-auth (or listen on 127.0.0.1)"
        )


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Denied(Exception):
    """The request is not allowed; ``status`` and ``headers`` say how to answer."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def who(request: Request, access: Access) -> str:
    """Who makes the request, for the action log: the basic auth user or
    "token", and the address it comes from. Raises Denied when the request
    carries no valid credentials."""
    peer = request.client.host if request.client else "?"
    if not access.protected:
        return f"anonymous@{peer}"
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if access.basic_user is not None and access.basic_password is not None and scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, password = "", ""
        if _same(user, access.basic_user) & _same(password, access.basic_password):
            return f"{user}@{peer}"
    if access.token is not None:
        given = value if scheme.lower() == "bearer" else request.cookies.get(TOKEN_COOKIE, "")
        if given and _same(given, access.token):
            return f"token@{peer}"
    if access.basic_user is not None:
        raise Denied(401, "sign in", {"WWW-Authenticate": 'Basic realm="rqueue dashboard", charset="UTF-8"'})
    raise Denied(
        401,
        "this dashboard needs its token: open its address with ?token=<the token> once (the browser then keeps "
        "it in a cookie), or send the header Authorization: Bearer <the token>",
    )


def token_in_query(request: Request, access: Access) -> str | None:
    """The token given as ``?token=`` (a link the command prints), when right."""
    given = request.query_params.get("token")
    if given is not None and access.token is not None and _same(given, access.token):
        return given
    return None


def without_token(request: Request) -> str:
    """The request's path and query without ``token``."""
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    return request.url.path + ("?" + urlencode(rest) if rest else "")


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def check_csrf(request: Request, form_value: object) -> None:
    """Raises Denied unless the form repeats the browser's CSRF cookie and,
    when the browser names the page's origin, it is this site."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not cookie or not isinstance(form_value, str) or not _same(cookie, form_value):
        raise Denied(403, "the form's CSRF token is missing or wrong: reload the page and try again")
    origin = request.headers.get("origin")
    if origin not in (None, "null"):
        host = request.headers.get("host", "")
        if origin.split("://", 1)[-1] != host:
            raise Denied(403, f"a form posted from another site ({origin}) is refused")
