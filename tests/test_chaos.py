"""A short chaos run in CI (tests/support/chaos.py runs the long one by hand;
RQUEUE_CHAOS_SECONDS and RQUEUE_CHAOS_MESSAGES make this one longer)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import pytest
from support.chaos import run

SECONDS = float(os.environ.get("RQUEUE_CHAOS_SECONDS", "15"))
MESSAGES = int(os.environ.get("RQUEUE_CHAOS_MESSAGES", "3000"))


@pytest.mark.slow
def test_chaos_loses_nothing_unreported_and_runs_nothing_after_an_ack():
    report = run(seconds=SECONDS, messages=MESSAGES, workers=3, seed=int(os.environ.get("RQUEUE_CHAOS_SEED", "1")))
    print(json.dumps(asdict(report), indent=2))
    assert report.problems == []
    assert report.lost_unreported == 0 and report.runs_after_ack == 0
    assert report.confirmed == report.messages
    assert report.handled + report.lost_reported == report.confirmed
    assert report.worker_kills + report.client_kills + report.redis_restarts > 0
    assert report.worker_pauses > 0 and report.redis_wipes > 0 and report.lagging_failovers > 0
    assert report.group_pauses > 0
    assert report.losses_reported > 0  # every wipe came while clients had seen the queue
