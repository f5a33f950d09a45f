"""Script folders for the loader's tests (tests/test_scripts.py,
tests/test_loader_layout.py)."""

from __future__ import annotations

from pathlib import Path


def lua_tree(root: Path, script: str, **includes: str) -> Path:
    """A scripts folder under ``root``: main.lua and the given includes."""
    (root / "includes").mkdir()
    for name, text in includes.items():
        (root / "includes" / f"{name}.lua").write_text(text)
    (root / "main.lua").write_text(script)
    return root
