"""examples/fastapi: the service publishes on a request and its rqueue.aio
worker, beside it on the same loop, handles the message."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

from fastapi.testclient import TestClient
from support.servers import wait_for

APP = Path(__file__).resolve().parent.parent / "examples" / "fastapi" / "app.py"


def load_example():
    spec = importlib.util.spec_from_file_location("fastapi_example", APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_signup_is_queued_and_sent_once_by_the_worker_beside_the_app():
    example = load_example()
    app = example.create_app(f"memory://fastapi-{uuid.uuid4().hex}")
    with TestClient(app) as http:
        # when two people sign up, one of them twice, and one with a bad address
        first = http.post("/signup", params={"email": "a@example.com"}).json()
        again = http.post("/signup", params={"email": "a@example.com"}).json()
        http.post("/signup", params={"email": "b@example.com"})
        http.post("/signup", params={"email": "nobody"})
        # then each address is sent one email, the repeat is a duplicate,
        # and the bad address is dead-lettered
        assert (first["duplicate"], again["duplicate"], again["queued"]) == (False, True, first["queued"])
        wait_for(lambda: sorted(http.get("/sent").json()) == ["a@example.com", "b@example.com"])
        wait_for(lambda: http.get("/stats").json()["dead_letters"] == 1)
        worker = app.state.worker
    # and the lifespan's end stopped the worker, which left its group
    assert worker.stats.acked == 2 and worker.stats.rejected == 1
