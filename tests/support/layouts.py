"""A fixture that runs every test of a module on both log layouts."""

from __future__ import annotations

import pytest

from rqueue.engine.keys import LAYOUT_ENV


@pytest.fixture(autouse=True, params=["stream", "hash"], name="layout")
def both_layouts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The default log layout of the test's clients: the stream layout, a
    new prefix's, and the hash layout, which prefixes made before it keep
    until migrated (docs/upgrading.md). Imported by a test module (its name
    is not the fixture's, so that a test's ``layout`` argument shadows no
    import), it runs each of its tests on both; a test parametrized by
    ``layout`` itself takes its own values instead."""
    monkeypatch.setenv(LAYOUT_ENV, str(request.param))
    return str(request.param)
