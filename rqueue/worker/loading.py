"""Loading a handler named as ``module.path:function``, for ``rqueue
worker`` and for handlers run in processes of their own (processes.py)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from ..errors import InvalidInput


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (a SyntaxError's names its file and line)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def load_handler(spec: str) -> Callable[..., Any]:
    """The function named by ``module.path:function`` (the current directory
    is importable, as for ``python -m``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInput(f"handler {spec!r} must be given as module.path:function")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"handler {spec!r}: cannot import {module_name!r}: {exc}") from None
    except Exception as exc:
        # The module's own code failed (a SyntaxError, a NameError, a missing
        # setting...): one line naming it, as for a module not found.
        raise InvalidInput(
            f"handler {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {one_line(exc)}"
        ) from None
    handler: object = getattr(module, attr, None)
    if not callable(handler):
        raise InvalidInput(f"handler {spec!r}: {module_name!r} has no callable {attr!r}")
    return handler
