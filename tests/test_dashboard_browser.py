"""The dashboard in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium through /usr/bin/chromedriver so that
nothing is downloaded): follow a queue from the overview, watch a count
change while a worker runs, replay a dead letter and see it handled, purge
with confirmation, a hostile payload that must not run, and read-only mode.
Screenshots of the main pages go to $RQUEUE_DASHBOARD_SCREENSHOTS when set
(docs/img holds the ones the docs show), else to a temporary directory."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from starlette.applications import Starlette
from starlette.routing import Mount
from support.servers import start_server

import rqueue
from rqueue.dashboard import app
from rqueue.embedded import EmbeddedCluster, EmbeddedServer

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 20.0  # seconds a condition may take on a loaded machine
HOSTILE_NAME = '"><img/src=x/onerror=window.__pwned=1>'
HOSTILE_PAYLOAD = b"<script>window.__pwned=2</script><b>bold?</b>"
HOSTILE_HEADER = '"><img src=x onerror="window.__pwned=3">'

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed (apt-get install chromium chromium-driver)")
    pytest.skip("chromium and chromium-driver are not installed", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Site:
    """Three dashboards in one uvicorn server on loopback: /rw (actions),
    /ro (read-only, same queues) and /evil (another prefix, hostile data)."""

    def __init__(self, url: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.client = rqueue.connect(url, prefix=f"web{tag}", settings_ttl=0.2)
        self.evil = rqueue.connect(url, prefix=f"evil{tag}")
        outer = Starlette(
            routes=[
                Mount("/rw", app=app(self.client, poll_ms=300)),
                Mount("/ro", app=app(self.client, read_only=True, poll_ms=300)),
                Mount("/evil", app=app(self.evil, poll_ms=300)),
            ]
        )
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(outer, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Site:
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.client.close()
        self.evil.close()


@pytest.fixture(scope="module")
def site(servers: dict[str, EmbeddedServer | EmbeddedCluster]) -> Iterator[Site]:
    if "redis" not in servers:
        servers["redis"] = start_server("redis")
    s = Site(servers["redis"].url).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,860"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("RQUEUE_DASHBOARD_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait(driver: WebDriver, condition: Any, what: str) -> Any:
    # The live page replaces its elements as it refreshes: one found just before is polled again.
    return WebDriverWait(driver, WAIT, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: condition(d), message=what
    )


def click(driver: WebDriver, by: str, value: str) -> None:
    # The element is found again when the live page replaced it between finding and clicking.
    wait(driver, lambda d: d.find_element(by, value).click() or True, f"a click on {value}")


def text_of(driver: WebDriver, css: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


def no_alert(driver: WebDriver) -> None:
    try:
        alert = driver.switch_to.alert
    except NoAlertPresentException:
        return
    text = alert.text
    alert.dismiss()
    pytest.fail(f"an alert ran: {text!r}")


def test_follow_a_queue_and_watch_it_live(site: Site, browser: WebDriver, shots: Path) -> None:
    # given a queue with 40 messages, a partitioned queue and a group that has not read them yet
    q = site.client.queue("orders")
    q.consumer("billing", "starter").close()  # the group exists, reading from the start
    q.publish_many([b'{"order": %d, "items": ["tea", "cake"]}' % i for i in range(40)], headers={"source": "shop"})
    site.client.queue("clicks", partitions=3).publish_many([b"click"] * 12)
    # when the overview is opened, then it lists the queues and their depth
    browser.get(site.url("/rw/"))
    wait(browser, lambda d: text_of(d, 'tr[data-queue="orders"] td[data-f="depth"]') == "40", "depth 40")
    assert "3 partitions" in text_of(browser, 'tr[data-queue="clicks"]')
    click(browser, By.LINK_TEXT, "orders")
    # and a queue is followed to its page
    wait(browser, lambda d: "Queue orders" in d.find_element(By.TAG_NAME, "h1").text, "the queue page")
    assert text_of(browser, 'dd[data-f="acked"]') == "0"
    browser.execute_script("window.__same_page = true")
    # when a worker acks 10 messages, then waits
    release = threading.Event()
    handled = [0]

    def handle(delivery: rqueue.Delivery) -> None:
        handled[0] += 1
        if handled[0] > 10:
            assert release.wait(WAIT)

    worker = rqueue.Worker(q, "billing", handle, name="worker-1", concurrency=1, prefetch=1)
    worker.start()
    try:
        # then the count rises on the open page, without a reload, and the worker shows among the consumers
        wait(browser, lambda d: text_of(d, 'dd[data-f="acked"]') == "10", "10 acks counted live")
        wait(browser, lambda d: "worker-1" in text_of(d, "#consumers"), "the worker among the consumers")
        browser.save_screenshot(str(shots / "dashboard-queue.png"))
        release.set()
        wait(browser, lambda d: text_of(d, 'dd[data-f="acked"]') == "40", "all 40 acked")
    finally:
        release.set()
        worker.stop()
        worker.join(10)
    assert browser.execute_script("return window.__same_page") is True
    browser.get(site.url("/rw/"))
    wait(browser, lambda d: text_of(d, 'tr[data-queue="orders"] td[data-f="depth"]') == "0", "depth 0")
    assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-queue="orders"] svg polyline.acked')  # the rate chart


def test_replay_a_dead_letter_and_see_it_handled(site: Site, browser: WebDriver, shots: Path) -> None:
    # given a dead letter of group audit (rejected by a consumer), among messages peeked first
    q = site.client.queue("payments")
    q.publish_many([b'{"amount": 12.5, "currency": "EUR"}', b"plain text payment", bytes(range(40))])
    browser.get(site.url("/rw/messages?name=payments"))
    wait(browser, lambda d: "seq 3" in d.page_source, "the messages")
    browser.save_screenshot(str(shots / "dashboard-messages.png"))
    auditor = q.consumer("audit", "auditor", max_deliveries=1)
    for d in auditor.fetch(3):
        if d.data == b"plain text payment":
            d.nack(error="ValueError: amount must be an integer number of cents")
        else:
            d.ack()
    auditor.close()
    assert len(q.dead_letters()) == 1
    # when the dead letter is ticked and replayed in the page
    browser.get(site.url("/rw/dead-letters?name=payments"))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "input.pick"), "the dead letters")
    browser.save_screenshot(str(shots / "dashboard-dead-letters.png"))
    click(browser, By.CSS_SELECTOR, "input.pick")
    click(browser, By.ID, "replay")
    # then it is replayed once, to its group
    wait(browser, lambda d: "Replayed 1 of 1 selected" in text_of(d, "#result"), "the replay result")
    assert "audit: 1" in text_of(browser, "#result")
    # and a worker handles it, which the queue page shows live
    browser.get(site.url("/rw/queue?name=payments"))
    acked_before = int(text_of(browser, 'dd[data-f="acked"]'))
    handled: list[bytes] = []
    worker = rqueue.Worker(q, "audit", lambda d: handled.append(d.data), name="replayer", concurrency=1)
    worker.start()
    try:
        wait(browser, lambda d: int(text_of(d, 'dd[data-f="acked"]') or 0) == acked_before + 1, "the replay acked")
    finally:
        worker.stop()
        worker.join(10)
    assert handled == [b"plain text payment"]
    assert text_of(browser, 'dd[data-f="dead_letters"]') == "0"


def test_purge_asks_for_confirmation(site: Site, browser: WebDriver) -> None:
    # given two dead letters
    q = site.client.queue("emails")
    q.publish_many([b"one", b"two"])
    c = q.consumer("sender", "s1")
    for d in c.fetch(2):
        d.reject(reason="bounced")
    c.close()
    browser.get(site.url("/rw/dead-letters?name=emails"))
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "input.pick")) == 2, "two dead letters")
    # when every dead letter matching the (empty) filter is to be purged
    click(browser, By.CSS_SELECTOR, 'input[name="scope"][value="filtered"]')
    click(browser, By.ID, "purge")
    # then the page asks first, and nothing is deleted yet
    wait(browser, lambda d: text_of(d, "#purge-count") == "2", "the confirmation")
    assert len(q.dead_letters()) == 2
    click(browser, By.ID, "confirm-purge")
    wait(browser, lambda d: "Purged 2 dead letter(s)" in text_of(d, "#result"), "the purge result")
    assert q.dead_letters() == []


def test_hostile_payload_does_not_run(site: Site, browser: WebDriver) -> None:
    # given a queue and group named with markup, and a payload and header that are scripts
    q = site.evil.queue(HOSTILE_NAME)
    q.publish_many([HOSTILE_PAYLOAD] * 2, headers={"x": HOSTILE_HEADER})
    c = q.consumer(HOSTILE_NAME, "w")
    c.fetch(1)[0].reject(reason="<img src=x onerror=window.__pwned=4>")
    pages = ["/evil/", f"/evil/queue?name={HOSTILE_NAME}", f"/evil/messages?name={HOSTILE_NAME}"]
    pages += [f"/evil/dead-letters?name={HOSTILE_NAME}", f"/evil/dead-letter?name={HOSTILE_NAME}&dlq_seq=1"]
    for path in pages:
        # when each page is shown (and the live ones refreshed)
        browser.get(site.url(path.replace('"', "%22").replace("<", "%3C").replace(">", "%3E")))
        wait(browser, lambda d: d.execute_script("return document.readyState") == "complete", "the page")
        if "/evil/queue" in path or path == "/evil/":
            wait(browser, lambda d: "updated" in text_of(d, "#live-status"), "a live refresh")
        # then nothing ran and the markup shows as text
        no_alert(browser)
        assert browser.execute_script("return window.__pwned") is None, path
        assert not browser.find_elements(By.CSS_SELECTOR, "main img, main script, main b"), path
        assert HOSTILE_NAME in browser.find_element(By.TAG_NAME, "main").text, path
    messages = text_of(browser, "main")  # the dead letter's page, last
    assert HOSTILE_PAYLOAD.decode() in messages and HOSTILE_HEADER in messages


def test_read_only_hides_actions_and_refuses_posts(site: Site, browser: WebDriver, shots: Path) -> None:
    # given a dead letter
    q = site.client.queue("reports")
    q.publish(b"r")
    c = q.consumer("printer", "p1")
    c.fetch(1)[0].reject()
    c.close()
    # when it is shown by the read-only dashboard, then no action is offered
    browser.get(site.url("/ro/dead-letters?name=reports"))
    wait(browser, lambda d: "read-only" in text_of(d, "header"), "the read-only page")
    assert browser.find_elements(By.CSS_SELECTOR, "table#dead-letters")
    assert not browser.find_elements(By.CSS_SELECTOR, "main form[method=post], input.pick, #replay, #purge")
    browser.get(site.url("/ro/dead-letter?name=reports&dlq_seq=1"))
    assert not browser.find_elements(By.CSS_SELECTOR, "main form[method=post], button")
    # and a POST made from the page anyway is refused, changing nothing
    status = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const body = new URLSearchParams({name: "reports", scope: "filtered", confirm: "yes", expect: "1"});
        fetch("/ro/dead-letters/purge", {method: "POST", body}).then((r) => done(r.status), (e) => done(String(e)));
        """
    )
    assert status == 403
    assert len(q.dead_letters()) == 1
    # the overview, with every queue of these tests, for the docs
    browser.get(site.url("/rw/"))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="reports"]'), "the overview")
    browser.find_element(By.ID, "queue-filter").send_keys("REP")  # the name filter, also across refreshes
    browser.execute_script("document.getElementById('queues').dataset.old = 'yes'")
    wait(
        browser, lambda d: d.execute_script("return document.getElementById('queues').dataset.old") is None, "a refresh"
    )
    shown = [
        r.get_attribute("data-queue")
        for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-queue]")
        if r.is_displayed()
    ]
    assert shown == ["reports"]
    browser.find_element(By.ID, "queue-filter").clear()
    browser.find_element(By.ID, "queue-filter").send_keys(" ")
    click(browser, By.CSS_SELECTOR, 'tr[data-queue="clicks"] summary')
    browser.save_screenshot(str(shots / "dashboard-overview.png"))
