"""The dashboard's write actions and the CLI's positions with bad input:
each is refused with a page (or an error) naming it, never a 500 or a
traceback, and changes nothing."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

import rqueue
from rqueue.cli import cli
from rqueue.dashboard import app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # as tests/test_dashboard.py
    from starlette.testclient import TestClient

NOT_INT = ["\u00b2", "9" * 5000]  # str.isdigit takes both; int() refuses both


@pytest.fixture
def mem() -> Iterator[rqueue.Client]:
    c = rqueue.connect(f"memory://{uuid.uuid4().hex}", prefix="dash", settings_ttl=0)
    yield c
    c.close()


@pytest.fixture
def web(mem: rqueue.Client) -> TestClient:
    """A dashboard over queue orders with two dead letters, its CSRF cookie set."""
    q = mem.queue("orders")
    q.publish_many([b"a", b"b"])
    for d in q.consumer("billing", "w1").fetch(2):
        d.reject()
    client = TestClient(app(mem), raise_server_exceptions=False)
    client.get("/")
    return client


@pytest.mark.parametrize("raw", NOT_INT)
@pytest.mark.parametrize(
    ("path", "form", "named"),
    [
        ("/dead-letters/replay", {"scope": "picked", "pick": "{}"}, "chosen dead letter"),
        ("/dead-letters/replay", {"scope": "picked", "pick": "0:{}"}, "chosen dead letter"),
        ("/dead-letters/replay", {"scope": "filtered", "limit": "{}"}, "limit"),
        ("/dead-letters/purge", {"scope": "filtered", "confirm": "yes", "expect": "{}", "upto": "1"}, "expect"),
        ("/dead-letters/purge", {"scope": "filtered", "confirm": "yes", "expect": "1", "upto": "{}"}, "upto"),
    ],
)
def test_a_number_int_cannot_read_is_a_bad_request_naming_it(mem, web, path, form, named, raw):
    # when an action is posted with a field that is digits to str.isdigit but no int
    sent = {k: v.format(raw) for k, v in form.items()}
    page = web.post(path, data={"name": "orders", "csrf": web.cookies.get("rqueue_dashboard_csrf"), **sent})
    # then the page says so, and nothing changed
    assert page.status_code == 400 and named in page.text
    assert len(mem.queue("orders").dead_letters()) == 2


def test_pausing_a_group_that_does_not_exist_is_not_found_not_a_redis_failure(mem, web):
    # when the pause of a group that does not exist is posted
    page = web.post(
        "/queue/pause",
        data={"name": "orders", "group": "nope", "action": "pause", "csrf": web.cookies.get("rqueue_dashboard_csrf")},
    )
    # then it is not found (a 503 "Redis failed" sends the operator to look at Redis)
    assert page.status_code == 404 and "group nope does not exist" in page.text
    assert mem.queue("orders").stats().group("billing").paused is False


@pytest.mark.parametrize("raw", NOT_INT)
def test_the_cli_names_a_position_int_cannot_read(mem, raw):
    # given a queue with a group, when a reset to such a position is asked
    mem.queue("orders").publish(b"a")
    mem.queue("orders").consumer("g").close()
    result = CliRunner().invoke(
        cli, ["--url", mem.url, "--prefix", "dash", "group", "reset", "orders", "g", "--to", raw]
    )
    # then it is an error naming the position, not a traceback
    assert result.exit_code != 0 and "is not one" in result.output
    assert not isinstance(result.exception, ValueError)
