"""The report: figures from the measured series (median, min, max, ratio,
target), the environment, and the text table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from rqueue.cli.bench.spec import SPECS, Series
from rqueue.cli.common import table


def summary(values: Sequence[float]) -> dict[str, Any] | None:
    """Median, min, max and the runs themselves; None without a value."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "runs": list(values)}


def figures(series: dict[str, Series], groups: Sequence[str]) -> dict[str, Any]:
    """Each figure of the run's groups: rqueue's median, min and max, the
    counterpart's, their ratio and the target, from the measured series."""
    out: dict[str, Any] = {}
    medians = {k: (summary(s.runs) or {}).get("median") for k, s in series.items()}
    for spec in SPECS:
        if spec.group not in groups:
            continue
        s = series.get(spec.key, Series())
        mine = summary(s.runs)
        theirs = summary(s.streams) if spec.streams else None
        median = mine["median"] if mine else None
        ratio = None
        if median is not None:
            if spec.ratio_to == "streams" and theirs and theirs["median"]:
                ratio = median / theirs["median"]
            elif spec.ratio_to and spec.ratio_to != "streams" and medians.get(spec.ratio_to):
                ratio = median / medians[spec.ratio_to]
        out[spec.key] = {
            "group": spec.group,
            "label": spec.label,
            "unit": spec.unit,
            "better": spec.better,
            "median": median,
            "min": mine["min"] if mine else None,
            "max": mine["max"] if mine else None,
            "runs": s.runs,
            "n": s.n,
            "extra": {k: statistics.median(v) for k, v in s.extra.items() if v},
            "streams": ({"label": spec.streams, **theirs} if theirs else None),
            "ratio": ratio,
            "ratio_to": spec.ratio_to,
            "target": (
                {
                    "text": spec.target.text,
                    "kind": spec.target.kind,
                    "value": spec.target.value,
                    "met": spec.target.met(median, ratio),
                }
                if spec.target
                else None
            ),
        }
    return out


def cpu_jiffies() -> tuple[int, int] | None:
    """(total, steal) jiffies of all CPUs from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
        values = [int(v) for v in parts[1:9]]
        return sum(values), values[7]
    except (OSError, ValueError, IndexError):
        return None


def versions() -> dict[str, str | None]:
    """The installed versions of redis-py and hiredis (None when absent)."""
    out: dict[str, str | None] = {}
    for dist in ("redis", "hiredis"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "msg/s":
        return f"{value:,.0f}"
    if unit == "bytes":
        return f"{value:,.1f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(d: dict[str, Any] | None, unit: str) -> str:
    if not d or d.get("median") is None:
        return "-"
    s = _fmt(d["median"], unit)
    if len(d.get("runs") or []) > 1:
        s += f" [{_fmt(d['min'], unit)}-{_fmt(d['max'], unit)}]"
    return s


def half_rate_line(ex: dict[str, float], secs: float) -> str:
    """What the latency_half figures ran at, from their extras (medians)."""
    return (
        f"latency at half the max rate, {secs:g} s each: rqueue {ex.get('rate', 0):,.0f} msg/s (half of "
        f"{ex.get('max_rate', 0):,.0f}, its end-to-end rate measured just before in the same processes), "
        f"publish_many of {ex.get('per_call', 0):.0f}, producer reached {ex.get('achieved_rate', 0):,.0f}/s; "
        f"Streams {ex.get('streams_rate', 0):,.0f} msg/s (half of {ex.get('streams_max_rate', 0):,.0f}), "
        f"pipelines of {ex.get('streams_per_call', 0):.0f} XADD, reached {ex.get('streams_achieved_rate', 0):,.0f}/s"
    )


def render_text(report: dict[str, Any]) -> str:
    """The report as the table and notes that ``rqueue bench`` prints."""
    cfg, srv = report["config"], report["server"]
    head = (
        f"rqueue bench on {srv['name']} {srv['version']} at {srv['url']}: {cfg['payload_bytes']}-byte payloads, "
        f"N={cfg['messages']:,} (one per call: {cfg['single_messages']:,}), median of {cfg['runs']} run(s) [min-max]"
    )
    rows = []
    for key, f in report["figures"].items():
        unit = f["unit"]
        ratio = f"{f['ratio']:.2f}x" if f["ratio"] is not None else "-"
        if f["ratio_to"] == "sweep_base" and f["ratio"] is not None:
            ratio += " base"
        elif f["ratio_to"] == "worker_ref" and f["ratio"] is not None:
            ratio += " ref"
        target = f["target"]
        met = "-" if not target or target["met"] is None else ("yes" if target["met"] else "NO")
        rows.append(
            [key, unit, _cell(f, unit), _cell(f["streams"], unit), ratio, target["text"] if target else "-", met]
        )
    lines = [
        head,
        "",
        table(["figure", "unit", "rqueue", "Redis Streams (redis-py)", "ratio", "issue-7 target", "met"], rows),
    ]
    figs = report["figures"]
    sweep = cfg["sweep"]
    if "sweep_base" in figs:
        lines.append(
            f"\nsweep: base = {sweep['small']:,} queued; queued = {sweep['queued']:,}; delayed = {sweep['delayed']:,} "
            f"delayed ahead of {sweep['small']:,} queued; inflight = {sweep['inflight']:,} held by another "
            f"consumer; {sweep['timed']:,} timed fetch+ack each"
        )
    if "latency_p50" in figs:
        ex = figs["latency_p50"]["extra"]
        lines.append(
            f"latency: target {cfg['latency_rate']:,} msg/s for {cfg['latency_secs']:g} s; producer reached "
            f"{ex.get('achieved_rate', 0):,.0f}/s (Streams {ex.get('streams_achieved_rate', 0):,.0f}/s)"
        )
    if "latency_half_p50" in figs:
        lines.append(half_rate_line(figs["latency_half_p50"]["extra"], cfg["latency_half_secs"]))
    if "cpu_client_us" in figs and figs["cpu_client_us"]["median"] is not None:
        ex = figs["cpu_client_us"]["extra"]
        wall, client, redis_us = ex.get("wall_us"), figs["cpu_client_us"]["median"], ex.get("fetch_ack_redis_us")
        if wall and redis_us is not None:
            lines.append(
                f"fetch(100)+ack per message: {wall:.1f} us wall = {client:.1f} us client CPU + {redis_us:.1f} us "
                f"Redis (EVALSHA) + {max(0.0, wall - client - redis_us):.1f} us other (network, scheduling); "
                f"Streams: {ex.get('streams_wall_us', 0):.1f} us wall, "
                f"{figs['cpu_client_us']['streams']['median']:.1f} us client, "
                f"{ex.get('streams_fetch_ack_redis_us', 0):.1f} us Redis"
            )
    if "memory_per_msg" in figs:
        ex = figs["memory_per_msg"]["extra"]
        if "memory_usage_keys_per_msg" in ex:
            lines.append(
                f"memory: MEMORY USAGE of the queue's keys {ex['memory_usage_keys_per_msg']:.1f} B/msg, "
                f"of the stream {ex.get('streams_memory_usage_keys_per_msg', 0):.1f} B/msg"
            )
    env = report["environment"]
    if env.get("cpu_steal_pct") is not None:
        lines.append(f"CPU steal during the run: {env['cpu_steal_pct']:.0f}%; load average at start {env['loadavg']}")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    for err in report["errors"]:
        lines.append(f"error: {err}")
    lines.append(f"elapsed: {report['elapsed_s']:.0f} s")
    return "\n".join(lines)
