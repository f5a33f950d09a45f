"""URLs: the schemes rqueue takes, and keeping their passwords out of
messages and logs."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import redis

from ..errors import InvalidURL

SCHEMES = ("redis", "rediss", "unix", "memory", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}  # -> the scheme of one node's URL
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")  # rqueue.connection.sentinel
CONNECT_TIMEOUT = 5.0  # seconds to open a connection and get the first answers (connect's connect_timeout)
SOCKET_TIMEOUT = 30.0  # seconds to wait for any one reply


# Also prefixed names such as ssl_password (a TLS key's passphrase).
_SECRET_PARAM = re.compile(r"([?&;](?:\w+_)?(?:password|pass|pwd|passwd|secret|token)=)([^&;#]*)", re.IGNORECASE)


def reads_shebang(url: str) -> bool:
    """Whether the server of ``url`` reads a script's ``#!lua flags=...``
    line: every Redis and Valkey does; memory:// (fakeredis) does not, and
    has no maxmemory for the flags to matter."""
    return not url.startswith("memory:")


def split_secrets(url: str) -> tuple[str, str, str, str]:
    """``url`` as (scheme with "://", user and ":" or "", password, the rest
    from "@" or the whole authority when there is no password).

    The user info ends at the last "@" before the query; an "@" after a "?"
    still ends it when no query argument comes before it (the "?" is then
    part of the password). A password may thus hold "/", "#" or "?", which a
    URL parser would take as the end of the host.
    """
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    query = rest.find("?")
    at = rest.rfind("@", 0, query if query != -1 else len(rest))
    if query != -1:
        later = rest.rfind("@")
        if later > query and "=" not in rest[query:later]:
            at = later
    if at != -1:
        user, colon, password = rest[:at].partition(":")
        if colon:
            return head + sep, user + ":", password, rest[at:]
    return head + sep, "", "", rest


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs:
    the password of ``user:password@host`` (also without a scheme) and one
    given as a query argument (``?password=...``)."""
    head, user, password, rest = split_secrets(url)
    if password or user:
        rest = "***" + rest
    return head + user + _SECRET_PARAM.sub(r"\1***", rest)


def scrub(text: str, url: str) -> str:
    """``text`` (e.g. an error from redis-py) without any password of ``url``
    in it, nor a piece of one (a parser may have split it at a "/")."""
    secrets = [m.group(2) for m in _SECRET_PARAM.finditer(url)]
    password = split_secrets(url)[2]
    if password:
        secrets += [password, *re.split(r"[/?#@:]", password)]
    for secret in sorted({s for s in secrets if len(s) >= 3}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def check_db(shown: str) -> None:
    """redis-py quietly uses db 0 for a path that is not a number; refuse it
    (a typo must not put queues into another database)."""
    path = urlsplit(shown).path
    if path not in ("", "/") and not (path[1:].isascii() and path[1:].isdigit()):
        raise InvalidURL(shown, f"the path {path!r} is not a database number (use /0, /1, ...)")


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, redis.ConnectionError) and "Protocol" in text or isinstance(exc, redis.InvalidResponse):
        return f"the server does not speak the Redis protocol ({text})"
    if isinstance(exc, redis.AuthenticationError):
        return _authentication(text)
    if isinstance(exc, redis.ConnectionError) and "reset by peer" in text:
        return f"{text} (a TLS port? TLS needs a rediss:// URL)"
    return text


# What a server says when a client that gave no password sends a command
# (Redis 6+ to HELLO, older servers and Valkey to any command).
_NO_PASSWORD_GIVEN = ("must be called with the client already authenticated", "authentication required", "noauth")


def _authentication(text: str) -> str:
    """A refused login, saying what is missing or wrong. The server's own
    text never holds the password."""
    lowered = text.lower()
    if any(marker in lowered for marker in _NO_PASSWORD_GIVEN):
        return (
            "authentication required: the server needs a password and the URL gives none: put it in the URL "
            "(redis://:PASSWORD@HOST:PORT/0, or redis://USER:PASSWORD@HOST:PORT/0 for an ACL user)"
        )
    if "username-password" in lowered or "wrongpass" in lowered:
        return (
            "authentication failed: the server refused the URL's user name and password "
            "(a wrong password, or no such user, or a disabled one)"
        )
    return f"authentication failed ({text})"
