"""`rqueue bench --quick --json`: every documented figure is there with a
positive number. Benchmarks print figures; this test never asserts timings."""

from __future__ import annotations

import json
import math
import time
import uuid

import pytest
import redis
from click.testing import CliRunner
from support.servers import start_server

from rqueue.cli.bench import bench_command, consumer_process
from rqueue.cli.bench.child import control
from rqueue.cli.bench.endtoend import QUANTILES, per_call_at
from rqueue.cli.bench.report import render_text
from rqueue.cli.bench.spec import CONTROL, FIGURE_KEYS, GROUPS, SCHEMA, SPEC_BY_KEY, payload


@pytest.fixture(scope="module", params=["redis", "valkey"])
def server_url(request):
    """A private server per kind: the bench needs a real one and resets its stats."""
    server = start_server(request.param)
    yield server.url
    server.stop()


def run_bench(url: str, prefix: str, *args: str):
    return CliRunner().invoke(bench_command, list(args), obj={"url": url, "prefix": prefix})


def positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def quick_report(server_url):
    """One `rqueue bench --quick --json` run (all groups), read by the tests
    below, and the prefix it ran under."""
    prefix = f"tq-{uuid.uuid4().hex[:8]}"
    result = run_bench(server_url, prefix, "--quick", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout), prefix


@pytest.mark.parametrize("server_url", ["redis"], indirect=True)
def test_quick_json_reports_every_documented_figure(server_url, quick_report):
    report, prefix = quick_report
    assert report["schema"] == SCHEMA
    assert report["errors"] == []
    assert report["config"]["groups"] == list(GROUPS)
    assert positive(report["config"]["messages"]) and positive(report["config"]["runs"])
    assert report["server"]["version"] and report["server"]["name"] in ("redis", "valkey")
    figures = report["figures"]
    assert set(figures) == set(FIGURE_KEYS)
    for key in FIGURE_KEYS:
        f = figures[key]
        spec = SPEC_BY_KEY[key]
        assert f["unit"] == spec.unit and f["group"] == spec.group, key
        for field in ("median", "min", "max"):
            assert positive(f[field]), (key, field, f[field])
        assert f["runs"] and all(positive(v) for v in f["runs"]), key
        assert positive(f["n"]), key
        if spec.ratio_to == "streams":
            assert positive(f["streams"]["median"]), key
            assert positive(f["ratio"]), key
        elif spec.ratio_to == "sweep_base":
            assert positive(f["ratio"]), key
        if spec.target is not None:
            assert f["target"]["met"] in (True, False), key
    # the bench cleaned up after itself: no key of its prefix is left
    r = redis.Redis.from_url(server_url)
    try:
        assert list(r.scan_iter(match=f"{prefix}-bench-*")) == []
    finally:
        r.close()


@pytest.mark.parametrize("server_url", ["redis"], indirect=True)
def test_quick_json_reports_the_latency_of_a_consumer_waiting_in_redis(server_url, quick_report):
    # given: one quick run of every group (one run per figure)
    report, _ = quick_report
    figures = report["figures"]
    # when: the latency figures with wait_in_redis are read
    wait = {q: figures[f"latency_wait_{q}"] for q in QUANTILES}
    # then: they are latencies in ms, in order, of as many messages as the first latency figure,
    # next to the same Streams run
    assert [wait[q]["median"] for q in QUANTILES] == sorted(wait[q]["median"] for q in QUANTILES)
    for q in QUANTILES:
        assert wait[q]["group"] == "latency" and wait[q]["unit"] == "ms" and wait[q]["ratio_to"] == "streams"
        assert wait[q]["n"] == figures[f"latency_{q}"]["n"]
        assert wait[q]["streams"]["median"] == figures[f"latency_{q}"]["streams"]["median"]
    assert positive(wait["p50"]["extra"]["achieved_rate"])


@pytest.mark.parametrize("server_url", ["redis"], indirect=True)
def test_quick_json_reports_the_latency_at_half_the_max_rate(server_url, quick_report):
    # given: one quick run of every group (one run per figure)
    report, _ = quick_report
    figures = report["figures"]
    secs = report["config"]["latency_half_secs"]
    # when: the latency figures at half the max rate are read
    half = {q: figures[f"latency_half_{q}"] for q in QUANTILES}
    ex = half["p50"]["extra"]
    # then: each system ran at half of the end-to-end rate measured just before, in calls of the documented size
    for side in ("", "streams_"):
        assert positive(ex[f"{side}max_rate"]) and positive(ex[f"{side}achieved_rate"]), side
        assert ex[f"{side}rate"] == pytest.approx(ex[f"{side}max_rate"] / 2), side
        assert ex[f"{side}per_call"] == per_call_at(ex[f"{side}rate"]), side
    assert half["p50"]["n"] == max(10, int(ex["rate"] * secs))
    assert ex["streams_n"] == max(10, int(ex["streams_rate"] * secs))
    # and the quantiles are latencies in ms, in order, for rqueue and for Streams
    for q in QUANTILES:
        assert half[q]["group"] == "latency" and half[q]["unit"] == "ms" and half[q]["ratio_to"] == "streams"
        assert "half" in half[q]["label"] and "half" in half[q]["streams"]["label"]
    for values in ([half[q]["median"] for q in QUANTILES], [half[q]["streams"]["median"] for q in QUANTILES]):
        assert all(positive(v) for v in values) and values == sorted(values)
    # and the text report prints the rates used
    text = render_text(report)
    assert "latency at half the max rate" in text
    assert f"rqueue {ex['rate']:,.0f} msg/s (half of {ex['max_rate']:,.0f}" in text
    assert f"Streams {ex['streams_rate']:,.0f} msg/s (half of {ex['streams_max_rate']:,.0f})" in text


@pytest.mark.parametrize("server_url", ["valkey"], indirect=True)
def test_only_runs_the_named_figures_and_prints_a_table(server_url, prefix):
    result = run_bench(server_url, prefix, "--quick", "--only", "publish,memory")
    assert result.exit_code == 0, result.output + result.stderr
    out = result.stdout
    for key in ("publish_batch", "publish_single", "memory_per_msg"):
        assert key in out
    assert "consume_batch" not in out and "latency_p50" not in out
    assert "issue-7 target" in out
    assert "publish:" in result.stderr  # the progress display


def test_bad_options_are_refused(prefix):
    assert run_bench("memory://x", prefix, "--quick").exit_code != 0
    result = run_bench("redis://127.0.0.1:1/0", prefix, "--only", "nonsense")
    assert result.exit_code == 2 and "nonsense" in result.output + result.stderr
    assert run_bench("redis://127.0.0.1:1/0", prefix, "--quick", "--full").exit_code == 2


def phases_spec(parent_pid: int, idle_timeout: float = 60) -> dict[str, object]:
    """What Child hands a consumer process, as far as its bookkeeping reads it."""
    return {"idle_timeout": idle_timeout, "control": CONTROL.decode(), "parent_pid": parent_pid}


def said(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_a_consumer_process_reports_each_phase_once_and_refuses_strays(capsys, monkeypatch):
    # given: a consumer process's bookkeeping (this process stands in for it, its parent for the bench)
    monkeypatch.setattr(consumer_process.os, "getppid", lambda: 4242)
    phases = consumer_process._Phases(phases_spec(4242))
    # when: a phase of 3 latency messages opens and they come in two batches
    phases.hit(control(phase={"expect": 3, "latency": True}), 100.0)
    assert phases.settled() is None
    for i in range(2):
        phases.hit(payload(i), time.time())
    phases.settled()
    phases.hit(payload(2), time.time())
    phases.settled()
    # then: armed once, done once with the count and ordered quantiles
    events = said(capsys)
    assert [e["event"] for e in events] == ["armed", "done"]
    done = events[1]
    assert done["count"] == 3 and 0 <= done["p50_ms"] <= done["p99_ms"] <= done["max_ms"]
    # when: a measured message comes after the phase was reported
    # then: it is refused, not counted into a finished phase
    with pytest.raises(consumer_process.ProcessError, match="outside a phase"):
        phases.hit(payload(3), time.time())
    # and: a switch is handed back after the batch's ack, with no other report
    phases.hit(control(switch="next-queue"), time.time())
    assert phases.settled() == "next-queue"
    assert said(capsys) == []


def test_a_consumer_process_waits_between_phases_while_its_parent_lives(monkeypatch):
    # given: a process idle past its limit with no phase open (the other system's figure runs meanwhile)
    parent = [4242]
    monkeypatch.setattr(consumer_process.os, "getppid", lambda: parent[0])
    phases = consumer_process._Phases(phases_spec(4242, idle_timeout=0))
    phases.idle_since -= 10
    # when / then: it keeps waiting while the benchmark process lives, and ends when it is gone
    assert phases.idle() is True
    parent[0] = 1
    assert phases.idle() is False
    # and: with a phase open, idling past the limit is an error naming what came
    parent[0] = 4242
    phases.hit(control(phase={"expect": 5, "latency": False}), time.time())
    phases.idle_since -= 10
    with pytest.raises(consumer_process.ProcessError, match="after 0 of 5"):
        phases.idle()
