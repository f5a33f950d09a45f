"""`rqueue bench --quick --json`: every documented figure is there with a
positive number. Benchmarks print figures; this test never asserts timings."""

from __future__ import annotations

import json
import math

import pytest
import redis
from click.testing import CliRunner
from support.servers import start_server

from rqueue.cli.bench import bench_command
from rqueue.cli.bench.spec import FIGURE_KEYS, GROUPS, SCHEMA, SPEC_BY_KEY


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


@pytest.mark.parametrize("server_url", ["redis"], indirect=True)
def test_quick_json_reports_every_documented_figure(server_url, prefix):
    result = run_bench(server_url, prefix, "--quick", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads(result.stdout)
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
