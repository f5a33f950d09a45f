"""A short chaos run in CI (tests/support/chaos.py runs the long one by hand)."""

from __future__ import annotations

import json
from dataclasses import asdict

from support.chaos import run


def test_chaos_loses_nothing_and_holds_the_caps():
    report = run(seconds=15, messages=3000, workers=3)
    print(json.dumps(asdict(report), indent=2))
    assert report.problems == []
    assert report.confirmed == report.messages
    assert report.worker_kills + report.client_kills + report.redis_restarts > 0
