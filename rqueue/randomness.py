"""The one source of randomness: redelivery jitter and generated names draw
from here, so a test can seed it and get the same run twice."""

from __future__ import annotations

import os
import random


class Randomness:
    """A seedable random source; the default one is seeded from the OS."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def unit(self) -> float:
        """A float in [0, 1)."""
        return self._rng.random()

    def token(self, nbytes: int = 4) -> str:
        """A hex string of ``nbytes`` random bytes."""
        return self._rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()

    def unique(self, nbytes: int = 8) -> str:
        """A hex string of ``nbytes`` bytes from the operating system, never
        from the seed: for identifiers that must differ between processes
        even when each seeds its source alike (a queue's incarnation)."""
        return os.urandom(nbytes).hex()
