"""A web dashboard for rqueue: see every queue, a queue's groups and
consumers, its messages and dead letters, and replay or purge dead letters,
from a browser. Needs the ``dashboard`` extra (Starlette, uvicorn, Jinja2).

``rqueue dashboard`` serves it; ``rqueue.dashboard.app(client)`` is the ASGI
app to mount in a Starlette or FastAPI service. See docs/dashboard.md.
"""

from .app import app
from .security import Access

__all__ = ["Access", "app"]
