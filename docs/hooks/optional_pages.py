"""MkDocs hook: adds the pages that other parts of the project may or may
not have written yet to the navigation, each only when its file exists, so
that the nav never names a missing page (a warning, so a failure under
--strict) and a page that appears is listed without editing mkdocs.yml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# (section of the nav, title, file under docs/): appended to that section,
# or as a top-level entry before "Troubleshooting" when the section is None.
OPTIONAL_PAGES = [
    ("Operations", "rqueue doctor", "doctor.md"),
    ("Operations", "Dashboard", "dashboard.md"),
    ("Operations", "Tracing (OpenTelemetry)", "tracing.md"),
    ("Concepts", "asyncio client", "aio.md"),
]


def on_config(config: Any, **_: Any) -> Any:
    docs = Path(config["docs_dir"])
    nav = config["nav"]
    for section, title, page in OPTIONAL_PAGES:
        if not (docs / page).is_file() or any(page in str(entry) for entry in nav):
            continue
        for entry in nav:
            if isinstance(entry, dict) and section in entry and isinstance(entry[section], list):
                entry[section].append({title: page})
                break
    return config
