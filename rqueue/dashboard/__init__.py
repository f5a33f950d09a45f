"""A web dashboard for rqueue: see every queue, a queue's groups and
consumers, its messages and dead letters, and replay or purge dead letters,
from a browser. Needs the ``dashboard`` extra (Starlette, uvicorn, Jinja2).

``rqueue dashboard`` serves it; ``rqueue.dashboard.app(client)`` is the ASGI
app to mount in a Starlette or FastAPI service. See docs/dashboard.md.
"""

try:
    from .app import app
    from .security import Access
except ImportError as exc:  # the extra is not installed: say which and how to get it
    missing = (exc.name or "?").split(".")[0]
    raise ImportError(
        f"rqueue.dashboard needs the dashboard extra: pip install 'rqueue[dashboard]' ({missing} is missing)",
        name=exc.name,
    ) from exc

__all__ = ["Access", "app"]
