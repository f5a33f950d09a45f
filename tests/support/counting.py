"""Counting the calls a test makes through a module's functions."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


def count_calls(monkeypatch: pytest.MonkeyPatch, module: ModuleType, *names: str) -> dict[str, int]:
    """Patches each of ``names`` in ``module`` (for the test) to count its
    calls; returns the counts by name, kept up to date."""
    calls = dict.fromkeys(names, 0)

    def counted(name: str) -> Callable[..., Any]:
        real = getattr(module, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    for name in names:
        monkeypatch.setattr(module, name, counted(name))
    return calls
