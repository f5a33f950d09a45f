"""The dashboard's HTTP layer (Starlette's TestClient) and Client.overview():
pages, escaping, the actions with CSRF, read-only mode, auth, mounting, and
the bounded number of round trips of the overview. The real browser tests
are in test_dashboard_browser.py."""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.routing import Mount
from support.servers import start_server, wait_for

import rqueue
from rqueue.cli import cli
from rqueue.dashboard import Access, app
from rqueue.dashboard.payload import Kind, view
from rqueue.dashboard.security import check_bind

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # newer Starlette asks for httpx2 (a warning of its own class); httpx works alike
    from starlette.testclient import TestClient

HOSTILE_NAME = '"><img/src=x/onerror=alert(1)>'
HOSTILE_PAYLOAD = b"<script>alert(1)</script>"
HOSTILE_HEADER = '"><img src=x onerror=alert(2)>'
TOKEN = "a-token-of-at-least-16"


@pytest.fixture
def mem() -> Iterator[rqueue.Client]:
    c = rqueue.connect(f"memory://{uuid.uuid4().hex}", prefix="dash", settings_ttl=0)
    yield c
    c.close()


def dead_lettered(client: rqueue.Client, name: str, payloads: list[bytes], group: str = "billing") -> None:
    """``payloads`` published to ``name`` and rejected by ``group`` (dead letters)."""
    q = client.queue(name)
    q.publish_many(payloads)
    consumer = q.consumer(group, "w1")
    for d in consumer.fetch(len(payloads)):
        d.reject()


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


# -- Client.overview -----------------------------------------------------------------


def test_overview_matches_stats(client: rqueue.Client) -> None:
    # given a plain queue with a dead letter, an unread message and one in flight, and a partitioned queue
    q = client.queue("orders")
    q.publish_many([b"a", b"b", b"c"])
    c = q.consumer("billing", "w1")
    first, second = c.fetch(2)
    first.reject()
    p = client.queue("parted", partitions=2)
    p.publish_many([b"x", b"y", b"z"])
    p.consumer("audit", "w2").fetch(1)
    # when the overview is read
    found = {s.name: s for s in client.overview()}
    # then it holds the queues (not their dead-letter queues) with the figures stats() gives
    assert sorted(found) == ["orders", "parted"]
    stats = q.stats()
    o = found["orders"]
    assert (o.last_seq, o.depth, o.dead_letters, o.groups, o.consumers) == (3, stats.depth, 1, 1, 1)
    assert o.in_flight == stats.group("billing").in_flight == 1
    parted = found["parted"]
    assert [s.partition for s in parted.partitions] == [0, 1]
    assert parted.last_seq == sum(s.last_seq for s in parted.partitions) == 3
    assert parted.in_flight == 1 and parted.groups == 1
    second.ack()
    assert {s.name: s for s in client.overview()}["orders"].acked == 1


def test_overview_lists_a_queue_it_cannot_read(mem: rqueue.Client) -> None:
    # given a name in the list of queues that this client refuses (another client wrote it)
    mem.queue("orders").publish(b"x")
    mem.redis.sadd(f"{mem.prefix}:queues", "bad{name}")
    # when the overview is read, then that queue has its error and the others their figures
    found = {s.name: s for s in mem.overview()}
    assert found["orders"].depth == 1 and found["bad{name}"].error and "bad{name}" in found["bad{name}"].error
    page = TestClient(app(mem)).get("/")
    assert page.status_code == 200 and "cannot be read" in page.text


def count_round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts what redis-py sends to the server: one call per round trip
    (a command, or a whole pipeline)."""
    sent = [0]
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: object, command: object, check_health: bool = True) -> None:
        sent[0] += 1
        original(self, command, check_health)  # type: ignore[arg-type]

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


@pytest.fixture(scope="module")
def redis_server() -> Iterator[str]:
    server = start_server("redis")
    yield server.url
    server.stop()


def test_overview_round_trips_do_not_grow_with_queues(redis_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # given two prefixes, with 5 and 200 queues (each with a group and a consumer)
    trips = []
    for n in (5, 200):
        # settings cached for the test's length: a re-read after the cache time would be one trip more
        client = rqueue.connect(redis_server, prefix=f"rt{uuid.uuid4().hex[:6]}", settings_ttl=3600)
        pipe = client.redis.pipeline(transaction=False)
        for i in range(n):
            pipe.sadd(f"{client.prefix}:queues", f"q{i}")
        pipe.execute()
        for i in range(0, n, 50):
            q = client.queue(f"q{i}")
            q.publish(b"m")
            q.consumer("g", "w").fetch(1)
        client.overview()  # scripts loaded, settings read: what a running dashboard has
        # when the overview is read, and the dashboard's page rendered
        sent = count_round_trips(monkeypatch)
        summaries = client.overview()
        overview_trips = sent[0]
        page = TestClient(app(client)).get("/")
        page_trips = sent[0] - overview_trips
        monkeypatch.undo()
        # then every queue is there, in the same few round trips
        assert len(summaries) == n and page.status_code == 200 and page.text.count("data-queue=") == n
        trips.append((overview_trips, page_trips))
        client.close()
    assert trips[0] == trips[1], trips
    assert trips[1][0] <= 5 and trips[1][1] <= 5, trips


# -- pages --------------------------------------------------------------------------


def test_every_page_renders(mem: rqueue.Client) -> None:
    # given a queue with messages, a group, a dead letter and events, and a partitioned queue
    dead_lettered(mem, "orders", [b"first", b"plain text"])
    mem.queue("orders").publish(b'{"id": 7, "items": [1, 2]}')
    mem.queue("orders").publish(b"\x00\x01\xfe binary", headers={"kind": "blob"})
    mem.queue("parted", partitions=2).publish_many([b"p1", b"p2"])
    mem.configure("orders", ack_wait=45)
    web = TestClient(app(mem))
    # when each page is asked for, then it answers with the figures
    overview = web.get("/")
    assert overview.status_code == 200 and 'data-queue="orders"' in overview.text
    assert "2 partitions" in overview.text and "<svg" in overview.text
    queue = web.get("/queue", params={"name": "orders"})
    assert queue.status_code == 200
    assert 'data-group="billing"' in queue.text and "<td>rejected</td>" in queue.text  # the events
    assert re.search(r"<td>ack_wait</td><td>45(\.0)?</td><td>orders</td>", queue.text)
    assert "w1" in queue.text  # the consumer
    messages = web.get("/messages", params={"name": "orders"})
    assert messages.status_code == 200
    assert "&#34;items&#34;: [\n    1," in messages.text  # pretty JSON
    assert "00 01 fe 20 62 69 6e" in messages.text  # hex of the binary payload
    ranged = web.get("/messages", params={"name": "orders", "from": "3", "to": "3"})
    assert "seq 3" in ranged.text and "seq 4" not in ranged.text and "&#34;items" in ranged.text
    assert web.get("/messages", params={"name": "parted", "partition": "1"}).status_code == 200
    listing = web.get("/dead-letters", params={"name": "orders"})
    assert listing.status_code == 200 and listing.text.count('class="pick"') == 2
    filtered = web.get("/dead-letters", params={"name": "orders", "seq_from": "2"})
    assert filtered.text.count('class="pick"') == 1
    one = web.get("/dead-letter", params={"name": "orders", "dlq_seq": "1"})
    assert one.status_code == 200 and "rejected" in one.text
    assert web.get("/api/overview").json()["queues"][0]["name"] == "orders"


def test_bad_input_and_unknown_queues_are_named(mem: rqueue.Client) -> None:
    mem.queue("orders").publish(b"x")
    web = TestClient(app(mem))
    missing = web.get("/queue", params={"name": "nope"})
    assert missing.status_code == 404 and "&#39;nope&#39; does not exist" in missing.text
    bad = web.get("/messages", params={"name": "orders", "from": "-1"})
    assert bad.status_code == 400 and "from &#39;-1&#39; must be a whole number" in bad.text
    assert web.get("/messages", params={"name": "orders", "partition": "0"}).status_code == 400
    assert web.get("/queue").status_code == 400
    assert web.get("/queue", params={"name": "bad{name"}).status_code == 400
    assert web.get("/dead-letter", params={"name": "orders", "dlq_seq": "9"}).status_code == 400


def test_payload_view() -> None:
    assert view(b'{"a":1}').kind is Kind.JSON and view(b'{"a":1}').text == '{\n  "a": 1\n}'
    assert view(b"hello\nworld").kind is Kind.TEXT
    assert view(b"").kind is Kind.EMPTY
    binary = view(bytes(range(256)) * 10)
    assert binary.kind is Kind.BINARY and binary.truncated and binary.size == 2560
    assert binary.text.startswith("00000000  00 01 02")
    big = view(b"x" * 100_000, text_limit=1000)
    assert big.truncated and len(big.text) == 1000 and big.size == 100_000
    assert view(b"a\x1b[31mred").kind is Kind.BINARY  # terminal escapes are not shown as text


def test_hostile_names_and_payloads_are_escaped(mem: rqueue.Client) -> None:
    # given a queue and a group named with markup, a payload and a header that are markup
    q = mem.queue(HOSTILE_NAME)
    q.publish_many([HOSTILE_PAYLOAD] * 2, headers={"x": HOSTILE_HEADER})
    q.consumer(HOSTILE_NAME, "w1").fetch(1)[0].reject()  # one dead letter, one stored message
    web = TestClient(app(mem))
    pages = [
        web.get("/"),
        web.get("/fragment/overview"),
        web.get("/queue", params={"name": HOSTILE_NAME}),
        web.get("/messages", params={"name": HOSTILE_NAME}),
        web.get("/dead-letters", params={"name": HOSTILE_NAME}),
        web.get("/dead-letter", params={"name": HOSTILE_NAME, "dlq_seq": "1"}),
    ]
    # then every page shows them as text
    for page in pages:
        assert page.status_code == 200, page.text
        for raw in (HOSTILE_NAME, HOSTILE_PAYLOAD.decode(), HOSTILE_HEADER, "<img", "<script>alert"):
            assert raw not in page.text, (page.url, raw)
    for shown in (pages[3], pages[5]):
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown.text
        assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in shown.text
    assert "name=%22%3E%3Cimg%2Fsrc%3Dx%2Fonerror%3Dalert%281%29%3E" in pages[0].text  # links quote the name


def test_every_response_forbids_inline_scripts_and_framing(mem: rqueue.Client) -> None:
    web = TestClient(app(mem, token=TOKEN))
    for response in (web.get("/"), web.get("/", headers={"Authorization": f"Bearer {TOKEN}"})):
        policy = response.headers["content-security-policy"]
        assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
        assert response.headers["x-frame-options"] == "DENY" and response.headers["cache-control"] == "no-store"


def test_password_of_the_url_is_never_shown(mem: rqueue.Client) -> None:
    mem.url = "redis://user:hunter2-secret@db.example:6379/0"
    page = TestClient(app(mem)).get("/")
    assert "hunter2" not in page.text and "redis://user:***@db.example:6379/0" in page.text


# -- actions ----------------------------------------------------------------------------


def test_replay_chosen_and_filtered_with_dry_run(mem: rqueue.Client, caplog: pytest.LogCaptureFixture) -> None:
    # given three dead letters of group billing
    dead_lettered(mem, "orders", [b"a", b"b", b"c"])
    web = TestClient(app(mem))
    csrf = csrf_of(web.get("/dead-letters", params={"name": "orders"}).text)
    # when a dry run of the filter is asked for, then nothing changes
    dry = web.post(
        "/dead-letters/replay",
        data={"csrf": csrf, "name": "orders", "scope": "filtered", "seq_from": "2", "dry_run": "1"},
    )
    assert dry.status_code == 200 and "Dry run: would replay 2 selected" in dry.text
    assert len(mem.queue("orders").dead_letters()) == 3
    # when dead letter 2 is chosen and replayed, twice (exactly once)
    with caplog.at_level(logging.INFO, logger="rqueue.dashboard"):
        done = web.post("/dead-letters/replay", data={"csrf": csrf, "name": "orders", "scope": "picked", "pick": "2"})
        again = web.post("/dead-letters/replay", data={"csrf": csrf, "name": "orders", "scope": "picked", "pick": "2"})
    # then it is back with its group, once, and the action is logged with who did it
    assert "Replayed 1 of 1 selected" in done.text and "billing: 1" in done.text
    assert "Replayed 0 of 1 selected (missing 1" in again.text
    assert [d.seq for d in mem.queue("orders").dead_letters()] == [1, 3]
    (delivery,) = mem.queue("orders").consumer("billing", "w2").fetch(5)
    assert delivery.data == b"b"
    assert any(
        "anonymous@testclient replayed 1 of 1 chosen dead letters 2 of queue 'orders'" in r.message
        for r in caplog.records
    )
    # when the rest is replayed by the filter
    rest = web.post("/dead-letters/replay", data={"csrf": csrf, "name": "orders", "scope": "filtered"})
    assert "Replayed 2 of 2 selected" in rest.text and mem.queue("orders").dead_letters() == []


def test_purge_asks_first_and_deletes_only_what_it_showed(mem: rqueue.Client) -> None:
    dead_lettered(mem, "orders", [b"a", b"b", b"c"])
    web = TestClient(app(mem))
    csrf = csrf_of(web.get("/dead-letters", params={"name": "orders"}).text)
    # when purge by the filter is asked for, then a confirmation is shown and nothing is deleted
    ask = web.post("/dead-letters/purge", data={"csrf": csrf, "name": "orders", "scope": "filtered"})
    assert ask.status_code == 200 and 'id="purge-count">3<' in ask.text
    assert len(mem.queue("orders").dead_letters()) == 3
    # when a dead letter arrives before the confirmation, then the confirmation deletes the 3 it showed
    dead_lettered(mem, "orders", [b"d"])
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', ask.text))
    done = web.post("/dead-letters/purge", data=fields)
    assert "Purged 3 dead letter(s)" in done.text
    assert [d.data for d in mem.queue("orders").dead_letters()] == [b"d"]
    # a chosen one, confirmed
    pick = web.post(
        "/dead-letters/purge",
        data={"csrf": csrf, "name": "orders", "scope": "picked", "pick": "4", "confirm": "yes", "expect": "1"},
    )
    assert "Purged 1 dead letter(s)" in pick.text and mem.queue("orders").dead_letters() == []


@pytest.mark.parametrize("action", ["replay", "purge"])
def test_a_chosen_dead_letter_is_the_one_acted_on_when_its_seq_was_dead_lettered_before(
    mem: rqueue.Client, action: str
) -> None:
    # given seq 1 dead-lettered, its group reset back (group audit keeps the record stored), and
    # seq 1 dead-lettered again: two dead letters of one group and seq
    q = mem.queue("orders")
    q.create_group("billing")
    q.create_group("audit")
    q.publish(b"a")
    c = q.consumer("billing", "w1")
    c.reject(c.fetch(1)[0], reason="first")
    q.reset_group("billing", "first")
    c.reject(c.fetch(1)[0], reason="second")
    assert [(d.dlq_seq, d.seq, d.error) for d in q.dead_letters()] == [(1, 1, "first"), (2, 1, "second")]
    web = TestClient(app(mem))
    csrf = csrf_of(web.get("/dead-letters", params={"name": "orders"}).text)
    # when the second alone is chosen and replayed, or purged
    data = {"csrf": csrf, "name": "orders", "scope": "picked", "pick": "2"}
    if action == "purge":
        data.update(confirm="yes", expect="1")
    done = web.post(f"/dead-letters/{action}", data=data)
    # then the second is the one that went, and the first stays
    assert done.status_code == 200
    assert [(d.dlq_seq, d.error) for d in q.dead_letters()] == [(1, "first")]
    if action == "replay":
        assert [d.data for d in c.fetch(5)] == [b"a"]


def test_a_confirmed_purge_leaves_dead_letters_newer_than_it_showed(clock: rqueue.ManualClock) -> None:
    # given three dead letters, and the confirmation page of a purge by the filter
    c = rqueue.connect(f"memory://{uuid.uuid4().hex}", prefix="dash", settings_ttl=0, clock=clock)
    dead_lettered(c, "orders", [b"a", b"b", b"c"])
    web = TestClient(app(c))
    csrf = csrf_of(web.get("/dead-letters", params={"name": "orders"}).text)
    ask = web.post("/dead-letters/purge", data={"csrf": csrf, "name": "orders", "scope": "filtered"})
    assert 'id="purge-count">3<' in ask.text
    # when, before it is confirmed, one of the three is purged elsewhere and a new one arrives
    assert c.queue("orders").purge_dead_letters(seq_to=1) == 1
    clock.advance(1)
    dead_lettered(c, "orders", [b"d"])
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', ask.text))
    done = web.post("/dead-letters/purge", data=fields)
    # then the confirmation deletes the two it showed that are left, not the new one
    assert "Purged 2 dead letter(s)" in done.text
    assert [d.data for d in c.queue("orders").dead_letters()] == [b"d"]
    # and a confirmation without its time changes nothing
    fields.pop("upto")
    refused = web.post("/dead-letters/purge", data=fields)
    assert refused.status_code == 400
    assert "the confirmation&#39;s upto is &#39;&#39;, not a whole number" in refused.text
    assert len(c.queue("orders").dead_letters()) == 1
    c.close()


def test_posts_without_the_csrf_token_change_nothing(mem: rqueue.Client) -> None:
    dead_lettered(mem, "orders", [b"a"])
    web = TestClient(app(mem))
    csrf = csrf_of(web.get("/dead-letters", params={"name": "orders"}).text)
    form = {"name": "orders", "scope": "filtered", "confirm": "yes", "expect": "1"}
    assert web.post("/dead-letters/purge", data=form).status_code == 403
    assert web.post("/dead-letters/purge", data={**form, "csrf": "forged"}).status_code == 403
    cross = web.post("/dead-letters/replay", data={**form, "csrf": csrf}, headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403 and "another site" in cross.text
    no_scope = web.post("/dead-letters/purge", data={**form, "csrf": csrf, "scope": ""})
    assert no_scope.status_code == 400 and "choose the ticked dead letters or the filter" in no_scope.text
    fresh = TestClient(app(mem))  # another browser: its own cookie
    assert fresh.post("/dead-letters/replay", data={**form, "csrf": csrf}).status_code == 403
    assert len(mem.queue("orders").dead_letters()) == 1


def test_read_only_hides_actions_and_refuses_posts(mem: rqueue.Client) -> None:
    dead_lettered(mem, "orders", [b"a"])
    web = TestClient(app(mem, read_only=True))
    for path in ("/dead-letters", "/dead-letter"):
        page = web.get(path, params={"name": "orders", "dlq_seq": "1"})
        assert page.status_code == 200 and "read-only" in page.text
        assert '<form method="post"' not in page.text and "<button" not in page.text.split("</form>", 1)[-1]
        assert 'class="pick"' not in page.text
    csrf = web.cookies.get("rqueue_dashboard_csrf")
    for action in ("replay", "purge"):
        refused = web.post(
            f"/dead-letters/{action}",
            data={"csrf": csrf, "name": "orders", "scope": "filtered", "confirm": "yes", "expect": "1"},
        )
        assert refused.status_code == 403 and "read-only" in refused.text
    assert len(mem.queue("orders").dead_letters()) == 1


# -- access --------------------------------------------------------------------------


def test_token_auth(mem: rqueue.Client) -> None:
    web = TestClient(app(mem, token=TOKEN), follow_redirects=False)
    assert web.get("/").status_code == 401
    assert web.get("/", headers={"Authorization": "Bearer wrong-token-of-16-chars"}).status_code == 401
    assert web.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert web.get("/static/app.js").status_code == 401
    # a link with the token sets a cookie and drops the token from the address
    link = web.get("/queue", params={"name": "x", "token": TOKEN})
    assert link.status_code == 303 and link.headers["location"] == "/queue?name=x"
    assert "httponly" in link.headers["set-cookie"].lower() and "samesite=strict" in link.headers["set-cookie"].lower()
    assert web.get("/").status_code == 200  # the cookie now
    with pytest.raises(rqueue.InvalidInput, match="at least 16"):
        app(mem, token="short")


def test_basic_auth(mem: rqueue.Client, caplog: pytest.LogCaptureFixture) -> None:
    dead_lettered(mem, "orders", [b"a"])
    web = TestClient(app(mem, basic_auth=("ops", "s3cret")))
    refused = web.get("/")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    wrong = "Basic " + base64.b64encode(b"ops:nope").decode()
    assert web.get("/", headers={"Authorization": wrong}).status_code == 401
    right = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
    csrf = csrf_of(web.get("/dead-letters", params={"name": "orders"}, headers=right).text)
    with caplog.at_level(logging.INFO, logger="rqueue.dashboard"):
        web.post("/dead-letters/replay", data={"csrf": csrf, "name": "orders", "scope": "filtered"}, headers=right)
    assert any("ops@testclient replayed 1 of 1" in r.message for r in caplog.records)


def test_listening_beyond_loopback_needs_auth() -> None:
    check_bind("127.0.0.1", Access())
    check_bind("::1", Access())
    check_bind("localhost", Access())
    check_bind("0.0.0.0", Access(token=TOKEN))
    with pytest.raises(rqueue.InvalidInput, match="without auth"):
        check_bind("0.0.0.0", Access())
    with pytest.raises(rqueue.InvalidInput, match="without auth"):
        check_bind("192.168.1.10", Access(read_only=True))
    result = CliRunner().invoke(cli, ["--url", "memory://", "dashboard", "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "without auth" in result.output
    result = CliRunner().invoke(cli, ["--url", "memory://", "dashboard", "--basic-auth", "nopassword"])
    assert result.exit_code == 2 and "USER:PASSWORD" in result.output


def test_without_the_extra_the_command_says_what_to_install() -> None:
    # given a Python where Starlette cannot be imported (the core install)
    blocked = "import sys; sys.modules['starlette'] = None; from rqueue.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", blocked, "--url", "memory://", "dashboard"], capture_output=True, text=True, timeout=60
    )
    # then the command fails naming the extra, without a traceback
    assert done.returncode == 1, done.stderr
    assert "pip install 'rqueue[dashboard]' (starlette is missing)" in done.stderr and "Traceback" not in done.stderr


def test_mounted_inside_another_app(mem: rqueue.Client) -> None:
    dead_lettered(mem, "orders", [b"a"])
    outer = Starlette(routes=[Mount("/ops/rq", app=app(mem))])
    web = TestClient(outer)
    page = web.get("/ops/rq/")
    assert page.status_code == 200
    assert 'href="/ops/rq/queue?name=orders"' in page.text and 'src="/ops/rq/static/app.js"' in page.text
    assert web.get("/ops/rq/static/app.js").status_code == 200
    assert web.get("/ops/rq/queue", params={"name": "orders"}).status_code == 200
    csrf = csrf_of(web.get("/ops/rq/dead-letters", params={"name": "orders"}).text)
    done = web.post("/ops/rq/dead-letters/replay", data={"csrf": csrf, "name": "orders", "scope": "filtered"})
    assert "Replayed 1 of 1" in done.text


def test_redis_gone_is_a_page_not_a_crash() -> None:
    # given a dashboard whose Redis (with a password in its URL) stops
    server = start_server("redis")
    client = rqueue.connect(server.url, prefix="gone")
    client.queue("orders").publish(b"x")
    client.url = server.url.replace("redis://", "redis://:hunter2-secret@")
    web = TestClient(app(client))
    assert web.get("/").status_code == 200
    server.stop()
    # when a page and the live fragment are asked for
    for path in ("/fragment/queue?name=orders", "/messages?name=orders"):
        page = web.get(path)
        # then they answer 503, naming the failure, and the password never shows
        assert page.status_code == 503 and "Redis failed" in page.text, page.text
        assert "hunter2" not in page.text
    client.close()


def test_the_command_serves_the_dashboard() -> None:
    # given `rqueue dashboard` started on a free port
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rqueue.cli", "--url", f"memory://{uuid.uuid4().hex}", "dashboard"]
        + ["--port", str(port), "--json", "--read-only"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # then it says where it listens, and serves there, read-only
        started = json.loads(proc.stdout.readline()) if proc.stdout else {}
        assert started == {"url": f"http://127.0.0.1:{port}/", "read_only": True, "auth": "none"}

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=2) as reply:
                    return bool(json.load(reply) == {"queues": []})
            except OSError:
                return False

        wait_for(answers, timeout=20, interval=0.1)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/dead-letters/purge", data=b"name=x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 403
    finally:
        proc.terminate()
        proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_app_needs_a_client_or_a_url():
    # when the app is made with neither, then it says what it needs instead of showing an empty store
    with pytest.raises(rqueue.InvalidInput, match="needs a client or a url"):
        app()


def test_pause_and_resume_from_the_queue_page(mem: rqueue.Client) -> None:
    # given a queue with a group
    q = mem.queue("orders")
    q.publish(b"a")
    c = q.consumer("billing")
    web = TestClient(app(mem))
    page = web.get("/queue", params={"name": "orders"}).text
    csrf = csrf_of(page)
    assert 'id="pause"' in page
    # when the group is paused from the page, then its fetches hand out nothing and the page says so
    done = web.post("/queue/pause", data={"csrf": csrf, "name": "orders", "group": "billing", "action": "pause"})
    assert done.status_code == 200 and ">paused<" in done.text
    assert c.fetch(1) == []
    # when the queue is paused to refuse, then publishes are refused
    web.post("/queue/pause", data={"csrf": csrf, "name": "orders", "action": "pause", "mode": "refuse"})
    with pytest.raises(rqueue.QueuePaused):
        q.publish(b"b")
    # when both are resumed, then it flows again
    web.post("/queue/pause", data={"csrf": csrf, "name": "orders", "action": "resume"})
    web.post("/queue/pause", data={"csrf": csrf, "name": "orders", "group": "billing", "action": "resume"})
    assert [d.seq for d in c.fetch(1)] == [1]
    # and without the CSRF token nothing is changed
    assert web.post("/queue/pause", data={"name": "orders", "action": "pause"}).status_code == 403
    assert q.stats().paused == ""


def test_the_events_view_filters_by_every_kind_and_names_an_unknown_one(mem: rqueue.Client) -> None:
    # given a queue with a dead letter and a group reset among its events
    dead_lettered(mem, "orders", [b"a"])
    mem.queue("orders").reset_group("billing", "first", force=True)
    web = TestClient(app(mem))
    # when the events view is filtered by a kind recorded always (reset), then only those show
    reset = web.get("/queue", params={"name": "orders", "event": "reset"})
    assert reset.status_code == 200
    assert "<td>reset</td>" in reset.text and "<td>dead-lettered</td>" not in reset.text
    # and every kind an event can have is offered as a filter
    for kind in rqueue.events.EVENT_KINDS:
        assert f"event={kind}" in reset.text
    # when the filter names no kind, then it is refused, naming the kinds
    bad = web.get("/queue", params={"name": "orders", "event": "nosuch"})
    assert bad.status_code == 400 and "unknown event kind &#39;nosuch&#39;" in bad.text and "group-deleted" in bad.text
