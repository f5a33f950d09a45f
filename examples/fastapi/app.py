"""A FastAPI service that queues a welcome email on each sign-up, with an
rqueue.aio worker sending them beside it on the same event loop.

Run it with ``RQUEUE_URL=redis://localhost:6379/0 uvicorn examples.fastapi.app:app``
(memory:// when RQUEUE_URL is unset), then ``curl -X POST 'localhost:8000/signup?email=a@example.com'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request

import rqueue
import rqueue.aio

log = logging.getLogger("example")


async def send_welcome(d: rqueue.aio.Delivery, outbox: list[str]) -> None:
    """The handler: "sends" the email (appends it to the outbox). Raising
    would nack it (retried under the queue's policy); rqueue.Reject
    dead-letters it."""
    to = json.loads(d.data)["to"]
    if "@" not in to:
        raise rqueue.Reject(f"not an address: {to!r}")
    await asyncio.sleep(0.01)  # the mail server's round trip
    outbox.append(to)


def create_app(url: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = await rqueue.aio.connect(url)
        await client.configure("emails", max_deliveries=5, redelivery_delay=1.0)
        queue = client.queue("emails")
        outbox: list[str] = []

        async def handler(d: rqueue.aio.Delivery) -> None:
            await send_welcome(d, outbox)

        worker = rqueue.aio.Worker(queue, "senders", handler, concurrency=4, grace_period=10)
        # The server (uvicorn) handles SIGTERM and ends the lifespan; the
        # worker is stopped there, finishing the emails it is sending.
        running = asyncio.create_task(worker.run(install_signal_handlers=False))
        app.state.queue, app.state.outbox, app.state.worker = queue, outbox, worker
        try:
            yield
        finally:
            worker.stop()
            await running
            await client.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/signup")
    async def signup(email: str, request: Request) -> dict[str, object]:
        # One round trip to Redis, awaited: the loop serves other requests
        # meanwhile. The id makes a repeated sign-up a duplicate, not a second email.
        queue: rqueue.aio.Queue = request.app.state.queue
        result = await queue.publish(json.dumps({"to": email}).encode(), id=f"welcome-{email}")
        return {"queued": result.seq, "duplicate": result.duplicate}

    @app.get("/sent")
    async def sent(request: Request) -> list[str]:
        return list(request.app.state.outbox)

    @app.get("/stats")
    async def stats(request: Request) -> dict[str, int]:
        s = await request.app.state.queue.stats()
        return {"depth": s.depth, "dead_letters": s.dead_letters}

    return app


app = create_app(os.environ.get("RQUEUE_URL", "memory://fastapi-example"))
