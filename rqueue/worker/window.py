"""How many deliveries a worker keeps in hand, for both workers."""

from __future__ import annotations

from ..constants import ADAPTIVE_PREFETCH_CAP


class PrefetchWindow:
    """The deliveries a worker's dispatcher keeps in hand, running or waiting
    for a handler: its window, which each fetch fills up again.

    A window the user set (``prefetch``) is fixed. One left to the worker
    starts at ``base`` (two runs' worth per handler) and follows what its
    handlers do while a fetch is out: when the reply comes and some handler
    sits idle with nothing waiting for it, though the fetch before brought
    work, the handlers ran dry during the round trip, and the window
    doubles (up to ``cap``) so that the next one leaves them work; when
    half of it still waits, it holds more than the handlers need and gives
    a quarter back (down to ``base``), so that a worker does not hoard
    messages that other workers could run; a fetch that finds fewer than it
    asked for (the queue ran dry) halves it. No clock is read: quick
    handlers, which a round trip keeps waiting, take it up to ``cap`` in a
    few rounds, and slow ones keep it at ``base``."""

    def __init__(self, base: int, cap: int, adaptive: bool) -> None:
        #: The deliveries to keep in hand now.
        self.size = base
        #: The most it may be: the prefetch the worker's consumer is given.
        self.cap = cap
        self._base = base
        # What the handlers run at once: half the base, two runs' worth.
        self._capacity = max(1, base // 2)
        self._adaptive = adaptive
        self._brought = False  # the fetch before brought deliveries

    @classmethod
    def of(cls, prefetch: int | None, default: int) -> PrefetchWindow:
        """The window of a worker given ``prefetch`` (None: left to it) and
        the default it starts from."""
        if prefetch is not None:
            return cls(prefetch, prefetch, adaptive=False)
        return cls(default, max(default, ADAPTIVE_PREFETCH_CAP), adaptive=True)

    def fetched(self, asked: int, got: int, waiting: int, running: int) -> None:
        """A fetch asked for ``asked`` deliveries and got ``got``; when its
        reply came, ``waiting`` of those in hand before still waited for a
        handler and ``running`` ran in one."""
        if not self._adaptive or asked <= 0:
            return
        brought, self._brought = self._brought, got > 0
        if got < asked:
            self.size = max(self._base, self.size // 2)
        elif brought and waiting == 0 and running < self._capacity:
            self.size = min(self.cap, self.size * 2)
        elif waiting > self.size // 2:
            self.size = max(self._base, self.size - self.size // 4)
