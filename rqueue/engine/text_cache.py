"""The scripts' built texts, kept on disk from one process to the next.

Building them (rqueue.engine.loader: includes expanded, unused helpers
dropped, lazy helpers placed, each script once per log layout) takes a
second or more of CPU, which every process that makes a client would pay
before its first call: each CLI command, each Worker started again after a
crash, each Spark task's process. The texts depend only on the files in
lua/ and the loader's rules, so they are written once per digest of those
to a JSON file in the cache directory, and read from there by the next
process. The directory is ``$RQUEUE_CACHE_DIR``, else
``$XDG_CACHE_HOME/rqueue``, else ``~/.cache/rqueue``; an empty
``RQUEUE_CACHE_DIR`` turns the cache off. A file that cannot be read,
written or parsed is passed over, and the texts are built in the process:
the cache only saves time. A file is touched when read, and one no process
read for STALE_DAYS is deleted when another is written: each change of the
scripts (an upgrade) writes a new one. Whoever can write the directory
chooses the Lua that Redis runs, as with Python's own bytecode caches: it
is the user's own by default.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path

from ..clock import SYSTEM_CLOCK
from . import loader

CACHE_ENV = "RQUEUE_CACHE_DIR"
STALE_DAYS = 30
_FILES = "scripts-*.json"

Texts = dict[str, dict[str, str]]  # script name -> layout -> text (loader.layout_texts)


def cache_dir() -> Path | None:
    """Where the built texts are kept; None when the cache is off."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rqueue"


def sources_digest() -> str:
    """A digest of every file the texts are built from: lua/ and the loader."""
    h = hashlib.sha256()
    root = loader.lua_dir()
    for path in sorted(root.rglob("*.lua")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(Path(loader.__file__).read_bytes())
    return h.hexdigest()[:32]


def cached_texts(name: str, shebang: bool = True) -> dict[str, str]:
    """Script ``name``'s texts per layout, as loader.layout_texts builds
    them, from the cache (:func:`script_texts`)."""
    return script_texts(shebang)[name]


@cache
def script_texts(shebang: bool = True) -> Texts:
    """Every script's texts per layout (loader.layout_texts), read from the
    cache when it holds this build's, else built and written there."""
    where = cache_dir()
    path = None if where is None else where / f"scripts-{sources_digest()}-{'shebang' if shebang else 'bare'}.json"
    if path is not None:
        kept = _read(path)
        if kept is not None:
            with contextlib.suppress(OSError):
                os.utime(path)  # read: not stale
            return kept
    built = {name: loader.layout_texts(name, shebang) for name in loader.SCRIPT_NAMES}
    if path is not None:
        _write(path, built)
        _prune(path.parent, SYSTEM_CLOCK.wall() - STALE_DAYS * 86400)
    return built


def _read(path: Path) -> Texts | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (
        isinstance(data, dict)
        and set(data) == set(loader.SCRIPT_NAMES)
        and all(
            isinstance(texts, dict)
            and "hash" in texts
            and set(texts) <= set(loader.LAYOUTS)
            and all(isinstance(t, str) for t in texts.values())
            for texts in data.values()
        )
    ):
        return None
    return data


def _prune(where: Path, before: float) -> None:
    """Deletes the cache files of ``where`` last read or written before
    ``before`` (seconds since the epoch)."""
    with contextlib.suppress(OSError):
        for old in where.glob(_FILES):
            with contextlib.suppress(OSError):
                if old.stat().st_mtime < before:
                    old.unlink()


def _write(path: Path, texts: Texts) -> None:
    """Writes ``texts`` whole or not at all (a temporary file renamed over
    it), so that a process reading at the same time finds a whole file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(texts, out)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # a read-only or full disk: the next process builds them too
