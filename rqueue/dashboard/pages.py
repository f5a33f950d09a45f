"""The pages that only read: overview, a queue, its messages and its dead
letters."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import rqueue
from rqueue.events import EVENT_KINDS, check_kinds
from rqueue.protocols import AnyQueue
from rqueue.validate import is_whole_number_text

from .core import Dashboard, blocking
from .payload import view
from .rates import chart

PEEK_MAX = 100  # messages a page shows at once
DEAD_LETTERS_PAGE = 100  # dead letters listed by default
DEAD_LETTERS_MAX = 1000
EVENTS_SHOWN = 30
EVENTS_SCANNED = 1000  # newest events read to find EVENTS_SHOWN of one kind
REFRESH_MS_PER_QUEUE = 5  # a long overview refreshes less often: 1,000 queues every 5 s


def whole(name: str, raw: str, low: int, high: int | None = None) -> int | None:
    """An optional whole number typed into a form or a query ("" is None);
    InvalidInput naming it when it is not one, or out of range."""
    raw = raw.strip()
    if not raw:
        return None
    if not is_whole_number_text(raw) or int(raw) < low or (high is not None and int(raw) > high):
        bound = f" from {low} to {high}" if high is not None else f" of at least {low}"
        raise rqueue.InvalidInput(f"{name} {raw[:40]!r} must be a whole number{bound}")
    return int(raw)


def number(request: Request, name: str, low: int = 0, high: int | None = None) -> int | None:
    """An optional whole-number query argument."""
    return whole(name, request.query_params.get(name, ""), low, high)


def queue_name(request: Request) -> str:
    name = request.query_params.get("name")
    if not name:
        raise rqueue.InvalidInput("no queue given (?name=)")
    return name


# -- overview ---------------------------------------------------------------------


def overview_rows(dash: Dashboard) -> dict[str, Any]:
    reading = dash.overviews.read()
    now = time.monotonic()
    rows = []
    for q in reading.queues:
        rates = dash.overviews.history.rates(q.name, now)
        rows.append({"q": q, "chart": chart(rates, now, dash.overviews.history.window)})
    return {
        "rows": rows,
        "window_s": int(dash.overviews.history.window),
        "every_ms": max(dash.poll_ms, REFRESH_MS_PER_QUEUE * len(rows)),
    }


async def overview(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "overview.html", title="Queues", **await blocking(overview_rows, dash))


async def overview_fragment(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "overview_table.html", **await blocking(overview_rows, dash))


async def overview_json(dash: Dashboard, request: Request) -> Response:
    found = await blocking(overview_rows, dash)
    return JSONResponse(
        {
            "queues": [
                {
                    **dataclasses.asdict(row["q"]),
                    "published_per_s": row["chart"].last_published,
                    "acked_per_s": row["chart"].last_acked,
                }
                for row in found["rows"]
            ]
        }
    )


# -- one queue --------------------------------------------------------------------


def event_kind(request: Request) -> str:
    """The ?event= filter of the events view: "" (every kind) or a kind."""
    kind = request.query_params.get("event", "")
    if kind:
        check_kinds([kind])
    return kind


def queue_figures(dash: Dashboard, name: str, kind: str = "") -> dict[str, Any]:
    q = dash.queue(name)
    stats = q.stats()
    resolved, origin = dash.client.settings.resolve(name)
    if kind:
        # the newest of that kind among the last EVENTS_SCANNED
        events = [e for e in reversed(q.events(EVENTS_SCANNED)) if e.get("event") == kind][:EVENTS_SHOWN]
    else:
        events = list(reversed(q.events(EVENTS_SHOWN)))
    return {
        "name": name,
        "stats": stats,
        "partitioned": isinstance(q, rqueue.PartitionedQueue),
        "settings": [(k, v, origin.get(k, "default")) for k, v in resolved.as_dict().items()],
        "events": events,
        "event_kind": kind,
        "event_kinds": EVENT_KINDS,
    }


async def queue_page(dash: Dashboard, request: Request) -> Response:
    found = await blocking(queue_figures, dash, queue_name(request), event_kind(request))
    return dash.render(request, "queue.html", title=found["name"], **found)


async def queue_fragment(dash: Dashboard, request: Request) -> Response:
    found = await blocking(queue_figures, dash, queue_name(request), event_kind(request))
    return dash.render(request, "queue_live.html", **found)


# -- messages -------------------------------------------------------------------


def part_of(q: AnyQueue, partition: int | None) -> rqueue.Queue:
    """The queue itself, or partition ``partition`` of a partitioned one."""
    if isinstance(q, rqueue.PartitionedQueue):
        if partition is None or partition >= q.partitions:
            raise rqueue.InvalidInput(
                f"queue {q.name!r} has {q.partitions} partitions: give a partition from 0 to {q.partitions - 1}"
            )
        return q.parts[partition]
    if partition is not None:
        raise rqueue.InvalidInput(f"queue {q.name!r} is not partitioned: give no partition")
    assert isinstance(q, rqueue.Queue)
    return q


def peek_range(dash: Dashboard, name: str, low: int | None, high: int | None, partition: int | None) -> dict[str, Any]:
    q = dash.queue(name)
    partitions = q.partitions if isinstance(q, rqueue.PartitionedQueue) else 0
    if partitions and partition is None:
        partition = 0
    part = part_of(q, partition)
    if low is not None and high is not None and low > high:
        raise rqueue.InvalidInput(f"from {low} is above to {high}")
    count = PEEK_MAX if high is None else min(PEEK_MAX, high - (low or 1) + 1)
    found = part.peek(count, after=max(0, (low or 1) - 1))
    shown = [m for m in found if high is None or m.seq <= high]
    return {
        "name": name,
        "partitions": partitions,
        "partition": partition,
        "low": low,
        "high": high,
        "messages": [{"m": m, "view": view(m.data)} for m in shown],
        "more": len(found) == count and (high is None or shown[-1].seq < high),
        "next_from": shown[-1].seq + 1 if shown else None,
        "peek_max": PEEK_MAX,
    }


async def messages(dash: Dashboard, request: Request) -> Response:
    found = await blocking(
        peek_range,
        dash,
        queue_name(request),
        number(request, "from", 1),
        number(request, "to", 1),
        number(request, "partition", 0),
    )
    return dash.render(request, "messages.html", title=f"Messages of {found['name']}", **found)


# -- dead letters -------------------------------------------------------------------


def selection(request: Request | None, form: dict[str, str] | None = None) -> dict[str, Any]:
    """The dead-letter filters of a page's query or a form."""
    source: Any = form if form is not None else (request.query_params if request is not None else {})

    def num(key: str, low: int, high: int | None = None) -> int | None:
        return whole(key, str(source.get(key, "")), low, high)

    return {
        "group": str(source.get("group", "")).strip() or None,
        "reason": str(source.get("reason", "")).strip() or None,
        "seq_from": num("seq_from", 0),
        "seq_to": num("seq_to", 0),
        "limit": num("limit", 1, DEAD_LETTERS_MAX),
    }


def list_dead_letters(dash: Dashboard, name: str, chosen: dict[str, Any]) -> dict[str, Any]:
    q = dash.queue(name)
    shown = chosen["limit"] or DEAD_LETTERS_PAGE
    found = q.dead_letters(**{**chosen, "limit": shown + 1})
    return {
        "name": name,
        "filters": chosen,
        "dead_letters": found[:shown],
        "more": len(found) > shown,
        "shown": shown,
        "partitioned": isinstance(q, rqueue.PartitionedQueue),
    }


async def dead_letters(dash: Dashboard, request: Request) -> Response:
    found = await blocking(list_dead_letters, dash, queue_name(request), selection(request))
    title = f"Dead letters of {found['name']}"
    return dash.render(request, "dead_letters.html", title=title, result=None, purged=None, **found)


def read_dead_letter(q: AnyQueue, partition: int | None, dlq_seq: int) -> rqueue.DeadLetter | None:
    """One dead letter by its seq in the dead-letter queue (as `rqueue dlq show`)."""
    page = part_of(q, partition).dead_letter_queue.peek(1, after=dlq_seq - 1)
    if not page or page[0].seq != dlq_seq:
        return None
    return dataclasses.replace(rqueue.DeadLetter.from_message(page[0]), partition=partition)


def show_dead_letter(dash: Dashboard, name: str, partition: int | None, dlq_seq: int) -> dict[str, Any]:
    q = dash.queue(name)
    d = read_dead_letter(q, partition, dlq_seq)
    if d is None:
        raise rqueue.InvalidInput(f"queue {name!r} has no dead letter with dlq seq {dlq_seq}")
    return {"name": name, "d": d, "view": view(d.data)}


async def dead_letter(dash: Dashboard, request: Request) -> Response:
    dlq_seq = number(request, "dlq_seq", 1)
    if dlq_seq is None:
        raise rqueue.InvalidInput("no dead letter given (?dlq_seq=)")
    found = await blocking(show_dead_letter, dash, queue_name(request), number(request, "partition", 0), dlq_seq)
    return dash.render(request, "dead_letter.html", title=f"Dead letter {dlq_seq} of {found['name']}", **found)
