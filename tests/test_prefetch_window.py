"""A worker's prefetch window (rqueue/worker/window.py): fixed when set,
else it grows while the handlers run dry during a round trip, gives back
what waits unused, and falls back when the queue runs dry."""

from __future__ import annotations

from rqueue.constants import ADAPTIVE_PREFETCH_CAP
from rqueue.worker.window import PrefetchWindow


def left_to_it(base: int = 16) -> PrefetchWindow:
    return PrefetchWindow.of(None, base)


def test_a_window_the_user_set_never_moves():
    # given a window of 16 set by the user
    w = PrefetchWindow.of(16, 4)
    # when every round finds the handlers dry, then the queue dry
    for _ in range(5):
        w.fetched(16, 16, 0, 0)
    w.fetched(16, 3, 0, 0)
    # then it stays what was set, and so does its cap
    assert (w.size, w.cap) == (16, 16)


def test_it_doubles_while_the_handlers_run_dry_up_to_its_cap():
    # given a window left to the worker, its first fetch filling it (nothing was in hand before)
    w = left_to_it()
    w.fetched(16, 16, 0, 0)
    assert w.size == 16
    # when each later reply finds nothing waiting and a handler idle, though the fetch before brought work
    sizes = []
    for _ in range(6):
        w.fetched(w.size, w.size, 0, 3)
        sizes.append(w.size)
    # then it doubles each round, and stops at the cap
    assert sizes == [32, 64, 128, 256, 256, 256]
    assert w.cap == ADAPTIVE_PREFETCH_CAP == 256


def test_it_stays_while_every_handler_is_busy():
    # given a window of 16 for 8 handlers (two runs' worth each)
    w = left_to_it()
    w.fetched(16, 16, 0, 0)
    # when a reply finds nothing waiting but all 8 handlers running
    w.fetched(8, 8, 0, 8)
    # then the handlers did not run dry: it stays
    assert w.size == 16


def test_it_gives_back_a_quarter_while_half_of_it_waits_but_not_below_where_it_started():
    # given a window grown to 64
    w = left_to_it()
    w.fetched(16, 16, 0, 0)
    w.fetched(16, 16, 0, 0)
    w.fetched(32, 32, 0, 0)
    assert w.size == 64
    # when replies find more than half of it waiting for a handler
    sizes = []
    for _ in range(6):
        w.fetched(4, 4, w.size // 2 + 1, 8)
        sizes.append(w.size)
    # then it gives back a quarter each time, down to its start
    assert sizes == [48, 36, 27, 21, 16, 16]


def test_it_halves_when_the_queue_runs_dry_and_asks_for_nothing_changes_nothing():
    # given a window grown to 128
    w = left_to_it()
    for n in (16, 16, 32, 64):
        w.fetched(n, n, 0, 0)
    assert w.size == 128
    # when a fetch of nothing (acks only) comes back, then nothing changes
    w.fetched(0, 0, 0, 0)
    assert w.size == 128
    # when fetches find fewer messages than they asked for, then it halves, down to its start
    sizes = []
    for _ in range(5):
        w.fetched(w.size, 1, 0, 0)
        sizes.append(w.size)
    assert sizes == [64, 32, 16, 16, 16]
