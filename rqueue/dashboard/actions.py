"""The actions: replay and purge dead letters, chosen one by one or by a
filter; pause and resume a queue or one of its groups. Each is a POST that carries the page's CSRF token; each is logged
with who did it. Replay is Queue.replay_dead_letters, the CLI's exactly-once
replay: a dead letter chosen by hand is selected by its group and seq (a
dead-letter queue holds at most one dead letter per group and seq, since
replaying deletes it)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

import rqueue
from rqueue.deadletters import purge_letters, replay_letters
from rqueue.protocols import AnyQueue
from rqueue.validate import is_whole_number_text

from .core import Dashboard, blocking
from .pages import DEAD_LETTERS_MAX, list_dead_letters, part_of, queue_figures, read_dead_letter, selection
from .security import CSRF_FIELD, check_csrf

log = logging.getLogger("rqueue.dashboard")


@dataclass(frozen=True)
class Pick:
    """A dead letter chosen on the page: its partition (None: not
    partitioned) and its seq in the dead-letter queue."""

    partition: int | None
    dlq_seq: int

    @classmethod
    def parse(cls, raw: str) -> Pick:
        """``"<dlq seq>"`` or ``"<partition>:<dlq seq>"``."""
        head, sep, tail = raw.partition(":")
        if sep and is_whole_number_text(head) and is_whole_number_text(tail) and int(tail) > 0:
            return cls(int(head), int(tail))
        if not sep and is_whole_number_text(head) and int(head) > 0:
            return cls(None, int(head))
        raise rqueue.InvalidInput(f"chosen dead letter {raw[:40]!r} is not <dlq seq> or <partition>:<dlq seq>")


@dataclass(frozen=True)
class ActionForm:
    """What an action form asks for."""

    name: str
    picks: list[Pick]  # empty: the filter applies
    filters: dict[str, Any]
    form: list[tuple[str, str]]  # the form as sent, to repeat it on the confirmation page


async def read_form(request: Request) -> ActionForm:
    form = await request.form()
    check_csrf(request, form.get(CSRF_FIELD))
    fields = [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
    one = {k: v for k, v in fields}
    name = one.get("name", "")
    if not name:
        raise rqueue.InvalidInput("no queue given")
    picks = [Pick.parse(v) for k, v in fields if k == "pick"]
    scope = one.get("scope")
    if scope not in ("picked", "filtered"):
        raise rqueue.InvalidInput(f"scope {str(scope)[:40]!r}: choose the ticked dead letters or the filter")
    if scope == "picked" and not picks:
        raise rqueue.InvalidInput("no dead letter chosen: tick some, or use the filter")
    if len(picks) > DEAD_LETTERS_MAX:
        raise rqueue.InvalidInput(f"{len(picks)} dead letters chosen; at most {DEAD_LETTERS_MAX} at once")
    chosen = selection(None, one)
    return ActionForm(name, picks if scope == "picked" else [], chosen, [f for f in fields if f[0] != "csrf"])


# Each pick acts on the dead letter of its dlq seq: a group and seq may have
# several (a group reset back dead-letters a seq again).


def replay_picks(q: AnyQueue, picks: list[Pick], dry_run: bool) -> rqueue.ReplayResult:
    total = rqueue.ReplayResult(dry_run=dry_run)
    for pick in picks:
        d = read_dead_letter(q, pick.partition, pick.dlq_seq)
        if d is None:
            total = total.plus(rqueue.ReplayResult(selected=1, missing=1, dry_run=dry_run))
            continue
        total = total.plus(replay_letters(part_of(q, pick.partition), [d], dry_run))
    return total


def purge_picks(q: AnyQueue, picks: list[Pick]) -> int:
    return sum(purge_letters(part_of(q, pick.partition), [pick.dlq_seq]) for pick in picks)


def what(ask: ActionForm) -> str:
    """The selection, as the log and the pages name it."""
    if ask.picks:
        return (
            "chosen dead letters "
            + ", ".join(str(p.dlq_seq) if p.partition is None else f"{p.partition}:{p.dlq_seq}" for p in ask.picks[:20])
            + (" ..." if len(ask.picks) > 20 else "")
        )
    filters = {k: v for k, v in ask.filters.items() if v is not None}
    return "dead letters matching " + (", ".join(f"{k}={v!r}" for k, v in filters.items()) or "no filter (all)")


def do_replay(dash: Dashboard, ask: ActionForm, dry_run: bool, user: str) -> dict[str, Any]:
    q = dash.queue(ask.name)
    result = replay_picks(q, ask.picks, dry_run) if ask.picks else q.replay_dead_letters(**ask.filters, dry_run=dry_run)
    if not dry_run:
        log.info(
            "dashboard: %s replayed %d of %d %s of queue %r (missing %d, skipped %d)",
            user,
            result.replayed,
            result.selected,
            what(ask),
            ask.name,
            result.missing,
            result.skipped,
        )
    return {**list_dead_letters(dash, ask.name, ask.filters), "result": result, "purged": None}


async def replay(dash: Dashboard, request: Request) -> Response:
    ask = await read_form(request)
    dry_run = (await request.form()).get("dry_run") == "1"
    user = request.scope["state"]["who"]
    found = await blocking(do_replay, dash, ask, dry_run, user)
    return dash.render(request, "dead_letters.html", title=f"Dead letters of {ask.name}", **found)


def count_chosen(dash: Dashboard, ask: ActionForm) -> tuple[int, int]:
    """How many dead letters the purge would delete, and when the newest of
    them was dead-lettered (server ms; 0 when none): the confirmed purge
    deletes none that arrived later."""
    q = dash.queue(ask.name)
    if ask.picks:
        return sum(read_dead_letter(q, p.partition, p.dlq_seq) is not None for p in ask.picks), 0
    shown = q.dead_letters(**ask.filters)
    return len(shown), max((d.dead_lettered_ms for d in shown), default=0)


def do_purge(dash: Dashboard, ask: ActionForm, expect: int, upto: int, user: str) -> dict[str, Any]:
    """Purges what the confirmation page showed: by a filter, at most the
    ``expect`` oldest matching that were dead-lettered by ``upto`` (dead
    letters that arrived since stay, also when some of those shown were
    replayed or purged in between)."""
    q = dash.queue(ask.name)
    if ask.picks:
        purged = purge_picks(q, ask.picks)
    else:
        limit = min(ask.filters["limit"] or expect, expect)
        purged = q.purge_dead_letters(**{**ask.filters, "limit": limit}, dead_lettered_to=upto) if limit else 0
    log.info("dashboard: %s purged %d %s of queue %r", user, purged, what(ask), ask.name)
    return {**list_dead_letters(dash, ask.name, ask.filters), "result": None, "purged": purged}


async def purge(dash: Dashboard, request: Request) -> Response:
    """Asks first: without ``confirm=yes`` it shows what would be deleted
    and a button that sends the same form again, confirmed."""
    ask = await read_form(request)
    form = await request.form()
    if form.get("confirm") != "yes":
        count, upto = await blocking(count_chosen, dash, ask)
        return dash.render(
            request,
            "confirm_purge.html",
            title=f"Purge dead letters of {ask.name}?",
            name=ask.name,
            count=count,
            upto=upto,
            what=what(ask),
            form=[f for f in ask.form if f[0] not in ("confirm", "expect", "upto")],
        )
    # A purge by the filter also needs the time of the newest dead letter shown.
    expect, upto = str(form.get("expect", "")), str(form.get("upto", "0" if ask.picks else ""))
    for field, value in (("expect", expect), ("upto", upto)):
        if not is_whole_number_text(value):
            raise rqueue.InvalidInput(
                f"the confirmation's {field} is {value[:40]!r}, not a whole number: go back and purge again"
            )
    user = request.scope["state"]["who"]
    found = await blocking(do_purge, dash, ask, int(expect), int(upto), user)
    return dash.render(request, "dead_letters.html", title=f"Dead letters of {ask.name}", **found)


def do_pause(dash: Dashboard, name: str, group: str | None, action: str, mode: str, user: str) -> dict[str, Any]:
    """Pauses or resumes the queue ``name`` (or its ``group``); the queue
    page's figures after it."""
    q = dash.queue(name)
    changed = q.pause(group, mode) if action == "pause" else q.resume(group)
    target = f"group {group!r} of queue {name!r}" if group else f"queue {name!r}"
    log.info(
        "dashboard: %s %s %s%s",
        user,
        "paused" if action == "pause" else "resumed",
        target,
        "" if changed else " (no change)",
    )
    return queue_figures(dash, name)


async def pause(dash: Dashboard, request: Request) -> Response:
    """The queue page's pause and resume buttons: the queue (with its mode)
    or one group."""
    form = await request.form()
    check_csrf(request, form.get(CSRF_FIELD))
    name, group = str(form.get("name", "")), str(form.get("group", ""))
    action, mode = str(form.get("action", "")), str(form.get("mode", "hold"))
    if not name:
        raise rqueue.InvalidInput("no queue given")
    if action not in ("pause", "resume"):
        raise rqueue.InvalidInput(f"action {action[:40]!r}: pause or resume")
    user = request.scope["state"]["who"]
    found = await blocking(do_pause, dash, name, group or None, action, mode, user)
    return dash.render(request, "queue.html", title=found["name"], **found)
