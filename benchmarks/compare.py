"""Write benchmarks/RESULTS.md from one benchmarks/run.sh session.

Inputs: the JSON of ``rqueue bench --json`` (schema rqueue-bench/1, see
docs/bench.md), and the peers' results of the same session (the JSON lines
that ../shared/peers/run_all.sh writes to $PEERS_RUN/results-*.jsonl, read
with the peers' own summarize.py so that their cells look as they do there).

usage: python benchmarks/compare.py --rqueue RUN/rqueue.json [--peers-run RUN/peers]
           [--peers-dir ../shared/peers] [--peers-status FILE] [--started EPOCH_S]
           [--rqueue-seconds S] [--command TEXT] [--out benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent


# -- formatting ------------------------------------------------------------------


def num(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "msg/s":
        return f"{value:,.0f}"
    if unit == "bytes":
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def cell(d: dict[str, Any] | None, unit: str) -> str:
    """median, and [min-max] when there was more than one run."""
    if not d or d.get("median") is None:
        return "-"
    s = num(d["median"], unit)
    if len(d.get("runs") or []) > 1:
        s += f" [{num(d['min'], unit)}–{num(d['max'], unit)}]"
    return s


def spread_cell(d: dict[str, Any] | None) -> str:
    """The peers' style: median ±(half the min-max range, % of the median)."""
    if not d or not d.get("median"):
        return "-"
    spread = (d["max"] - d["min"]) / 2 / d["median"] * 100
    return f"{d['median']:,.0f} ±{spread:.0f}%"


def md_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# -- inputs ------------------------------------------------------------------------


def load_summarize(peers_dir: Path) -> ModuleType | None:
    path = peers_dir / "summarize.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("peers_summarize", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        return None
    return module


def peers_results(peers_run: Path | None) -> Path | None:
    if peers_run is None:
        return None
    files = sorted(
        glob.glob(str(peers_run / "results-*.jsonl")) + glob.glob(str(peers_run / "results.jsonl")),
        key=os.path.getmtime,
    )
    files = [f for f in files if os.path.getsize(f) > 0]
    return Path(files[-1]) if files else None


def machine() -> list[tuple[str, str]]:
    facts = [("CPUs", str(os.cpu_count()))]
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith(("Model name", "Hypervisor vendor")):
                k, _, v = line.partition(":")
                facts.append((k.strip(), v.strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        facts.append(("Memory", f"{kb / 1024 / 1024:.0f} GiB"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    facts.append(("OS", line.split("=", 1)[1].strip().strip('"')))
    except OSError:
        pass
    return facts


# -- sections ----------------------------------------------------------------------


def section_targets(rq: dict[str, Any]) -> list[str]:
    figs = rq["figures"]
    rows = []
    for key, f in figs.items():
        unit = f["unit"]
        ratio = "-"
        if f["ratio"] is not None:
            ratio = f"{f['ratio']:.2f}x" + (" of sweep_base" if f["ratio_to"] == "sweep_base" else "")
        t = f["target"]
        met = "-" if not t or t["met"] is None else ("**met**" if t["met"] else "**not met**")
        streams = f["streams"]
        rows.append(
            [
                f"`{key}`",
                f["label"],
                unit,
                cell(f, unit),
                (cell(streams, unit) + f" ({streams['label']})") if streams else "-",
                ratio,
                t["text"] if t else "-",
                met,
            ]
        )
    cfg = rq["config"]
    met = [f for f in figs.values() if f["target"] and f["target"]["met"] is not None]
    lines = [
        "## rqueue against its ceiling and the issue-7 targets",
        "",
        "Raw redis-py Streams on the same server in the same run is the ceiling (issue 7). "
        "Ratio = rqueue / Streams (sweep: / `sweep_base`); for msg/s higher is better, for ms, bytes and usec lower. "
        f"Median of {cfg['runs']} runs [min–max]; N = {cfg['messages']:,} messages per throughput figure, "
        f"{cfg['single_messages']:,} for one-per-call figures, {cfg['payload_bytes']}-byte payloads.",
        "",
        md_table(
            [
                "figure",
                "what",
                "unit",
                "rqueue",
                "Redis Streams, redis-py (same server, same run)",
                "ratio",
                "issue-7 target",
                "met?",
            ],
            rows,
        ),
        "",
        f"Targets met: {sum(1 for f in met if f['target']['met'])} of {len(met)}.",
    ]
    if "sweep_base" in figs:
        lines += sweep_lines(cfg)
    if "latency_p50" in figs:
        ex = figs["latency_p50"]["extra"]
        lines += [
            "",
            f"Latency: one publish() per message at {cfg['latency_rate']:,} msg/s for {cfg['latency_secs']:g} s "
            f"per run (producer reached {ex.get('achieved_rate', 0):,.0f}/s; Streams "
            f"{ex.get('streams_achieved_rate', 0):,.0f}/s) to a consumer process using fetch(100, timeout=1) "
            "(Streams: XREADGROUP COUNT 100 BLOCK 1000); latency = handler start − time.time() in the payload.",
        ]
    if "latency_half_p50" in figs:
        ex = figs["latency_half_p50"]["extra"]
        lines += [
            "",
            f"Latency at half the max rate (`latency_half_*`): in each run, in the same consumer processes, each "
            "system's end-to-end rate is measured as `e2e` measures it, then each publishes at half of its own "
            f"rate for {cfg.get('latency_half_secs', cfg['latency_secs']):g} s, in calls 1 ms apart "
            "(publish_many / an XADD pipeline of rate/1000 messages, at most 100). Medians of the runs: rqueue "
            f"{ex.get('rate', 0):,.0f} msg/s (half of {ex.get('max_rate', 0):,.0f}; {ex.get('per_call', 0):.0f} "
            f"per call; producer reached {ex.get('achieved_rate', 0):,.0f}/s), Streams "
            f"{ex.get('streams_rate', 0):,.0f} msg/s (half of {ex.get('streams_max_rate', 0):,.0f}; "
            f"{ex.get('streams_per_call', 0):.0f} per call; reached {ex.get('streams_achieved_rate', 0):,.0f}/s).",
        ]
    return lines


def sweep_lines(cfg: dict[str, Any]) -> list[str]:
    """What the size sweep's figures held (only when the sweep ran)."""
    sw = cfg["sweep"]
    return [
        "",
        f"Size sweep: `sweep_base` has {sw['small']:,} messages queued; `sweep_queued` {sw['queued']:,}; "
        f"`sweep_delayed` {sw['delayed']:,} delayed messages ahead of {sw['small']:,} queued; `sweep_inflight` "
        f"{sw['inflight']:,} held in flight by another consumer of the group ahead of {sw['small']:,} queued. Each "
        f"times {sw['timed']:,} fetch(100)+ack in chunks of {sw['chunk']}, topping the queue up (untimed) after each "
        "chunk so that its depth stays put. The delayed case's first fetches pass over the delayed messages once "
        "(1,000 per call) and are not timed."
        + (
            ""
            if cfg["full"]
            else " Issue 7 asks for 10^6 queued and 10^5 delayed/in flight: that is `--full`; this "
            "run used smaller sizes."
        ),
    ]


def section_breakdown(rq: dict[str, Any]) -> list[str]:
    figs = rq["figures"]
    need = ("cpu_publish_us", "cpu_fetch_us", "cpu_ack_us", "cpu_client_us")
    if not all(k in figs and figs[k]["median"] is not None for k in need):
        return []
    ex = figs["cpu_client_us"]["extra"]
    wall, client = ex.get("wall_us"), figs["cpu_client_us"]["median"]
    fetch, ack = figs["cpu_fetch_us"]["median"], figs["cpu_ack_us"]["median"]
    s_wall, s_client = ex.get("streams_wall_us"), figs["cpu_client_us"]["streams"]["median"]
    s_fetch, s_ack = figs["cpu_fetch_us"]["streams"]["median"], figs["cpu_ack_us"]["streams"]["median"]
    if not wall or not s_wall:
        return []

    def row(name: str, w: float, c: float, f: float, a: float) -> list[str]:
        other = max(0.0, w - c - f - a)
        return [
            name,
            f"{w:.2f}",
            f"{c:.2f} ({c / w:.0%})",
            f"{f:.2f}",
            f"{a:.2f}",
            f"{(f + a):.2f} ({(f + a) / w:.0%})",
            f"{other:.2f} ({other / w:.0%})",
        ]

    pub, s_pub = figs["cpu_publish_us"]["median"], figs["cpu_publish_us"]["streams"]["median"]
    return [
        "## Where the time of fetch(100)+ack goes",
        "",
        "Per message, in microseconds, from the `cpu` figures: wall time of the loop, CPU of the Python process "
        "(time.process_time), and Redis CPU from INFO commandstats (usec of EVALSHA for rqueue; XREADGROUP and XACK "
        "for Streams; the counters are read between the calls). The client waits for each round trip, so wall ≈ "
        "client + Redis + the rest (network stack, scheduling). The parts are measured separately and can overlap a "
        "little (Redis's usec is wall time inside the server, process_time counts the client's syscalls), so the rest "
        "is shown as 0 when they add up to more than the wall time.",
        "",
        md_table(
            ["loop", "wall", "client CPU", "Redis: fetch", "Redis: ack", "Redis total", "rest"],
            [
                row("rqueue fetch(100) + ack(list)", wall, client, fetch, ack),
                row("Streams XREADGROUP 100 + XACK", s_wall, s_client, s_fetch, s_ack),
            ],
        ),
        "",
        f"Publish: Redis spends {pub:.2f} usec per message in the publish script (publish_many of 100), "
        f"XADD {s_pub:.2f} usec.",
    ]


def section_peers(
    rq: dict[str, Any], summarize: ModuleType | None, results: Path | None, status: str, peers_run: Path | None
) -> list[str]:
    lines = ["## rqueue next to the peers (same session)", "", f"Peers: {status}", ""]
    figs = rq["figures"]
    cfg = rq["config"]

    def f(key: str) -> dict[str, Any] | None:
        return figs.get(key)

    def stream_of(key: str) -> dict[str, Any] | None:
        x = figs.get(key)
        return x["streams"] if x else None

    lat = "n/a"
    s_lat = "n/a"
    if f("latency_p50") and f("latency_p99") and f("latency_p50")["median"] is not None:
        rate = cfg["latency_rate"]
        lat = f"{f('latency_p50')['median']:.2f} / {f('latency_p99')['median']:.2f} @{rate:g}/s"
        s_lat = f"{stream_of('latency_p50')['median']:.2f} / {stream_of('latency_p99')['median']:.2f} @{rate:g}/s"
    n_note = lambda key: "" if not f(key) or f(key)["n"] == 20000 else f" (N={f(key)['n']:,})"  # noqa: E731
    head = [
        "system",
        "produce 1-by-1",
        "produce batch",
        "consume+ack",
        "e2e (1-by-1 producer)",
        "e2e (batch producer)",
        "p50 / p99 ms @ rate",
    ]
    rows = [
        [
            "**rqueue** (private redis-server; publish / publish_many 100 / fetch(100)+ack(list))",
            spread_cell(f("publish_single")) + n_note("publish_single"),
            spread_cell(f("publish_batch")) + n_note("publish_batch"),
            spread_cell(f("consume_batch")) + n_note("consume_batch"),
            "n/a",
            spread_cell(f("e2e")) + n_note("e2e"),
            lat,
        ],
        [
            "**rqueue Worker** (no-op handler, concurrency 8, 1 process)",
            "n/a",
            "n/a",
            spread_cell(f("worker")) + n_note("worker"),
            "n/a",
            "n/a",
            "n/a",
        ],
        [
            "**rqueue Worker, batch handler** (a BatchHandler of 100, 1 thread, 1 process)",
            "n/a",
            "n/a",
            spread_cell(f("worker_batch")) + n_note("worker_batch"),
            "n/a",
            "n/a",
            "n/a",
        ],
        [
            "Redis Streams via redis-py, measured by rqueue bench on rqueue's server",
            spread_cell(stream_of("publish_single")) + n_note("publish_single"),
            spread_cell(stream_of("publish_batch")) + n_note("publish_batch"),
            spread_cell(stream_of("consume_batch")) + n_note("consume_batch"),
            "n/a",
            spread_cell(stream_of("e2e")) + n_note("e2e"),
            s_lat,
        ],
    ]
    if summarize is not None and results is not None:
        recs = summarize.load(str(results))
        for title, spec in summarize.ROWS:
            row = [title]
            for key, _ in summarize.COLS:
                row.append(summarize.cell(recs, spec.get(key), key) if spec.get(key) else "n/a")
            if all(c in ("-", "n/a") or c.startswith("none") for c in row[1:]):
                continue
            rows.append(row)
    lines.append(md_table(head, rows))
    lines.append("")
    lines.append(
        "Cells: median ±(half the min–max range of the runs). rqueue's rows and the Streams row above come from "
        "`rqueue bench` (one consumer loop in the benchmark process; e2e: producer in the benchmark process, "
        "consumer in another). The peers' rows come from their own scripts against their own servers "
        "(redis-server on 6390) in the same session; their method is in ../shared/peers/RESULTS.md. "
        "Compare rows within one session only: this machine is shared and noisy."
    )
    if summarize is not None and results is not None:
        lines += streams_check(summarize.load(str(results)), figs)
        extras = peers_extras(summarize, results)
        if extras:
            lines += [
                "",
                "### The rest of the peers' summary (shared/peers/summarize.py --md, same session)",
                "",
            ] + extras
    elif summarize is None:
        lines += ["", "The peers' summarize.py was not found, so their table is missing."]
    else:
        lines += [
            "",
            "No peer figures from this session; ../shared/peers/RESULTS.md has figures from an earlier session "
            "(not comparable run to run).",
        ]
    if peers_run is not None:
        steal = peers_run / "steal.txt"
        if steal.is_file() and steal.read_text().strip():
            lines += ["", "Peers' run time and CPU steal per system:", "", "```", steal.read_text().rstrip(), "```"]
    return lines


def streams_check(recs: dict[Any, Any], figs: dict[str, Any]) -> list[str]:
    """The Streams ceiling measured twice in one session: by rqueue bench on
    rqueue's server and by the peers' script on theirs. They should agree."""
    pairs = [
        ("produce batch", ("Redis Streams XADD pipe100", "produce"), "publish_batch"),
        ("produce 1-by-1", ("Redis Streams XADD single", "produce"), "publish_single"),
        ("consume+ack", ("Redis Streams XADD single", "consume+ack"), "consume_batch"),
        ("e2e (batch producer)", ("Redis Streams XADD pipe100", "end-to-end"), "e2e"),
    ]
    parts = []
    for name, key, fig in pairs:
        peer = recs.get(key)
        mine = (figs.get(fig) or {}).get("streams")
        if peer and mine and peer.get("median") and mine.get("median"):
            parts.append(
                f"{name} {mine['median']:,.0f} vs {peer['median']:,.0f} ({mine['median'] / peer['median']:.2f}x)"
            )
    if not parts:
        return []
    return [
        "",
        "Cross-check of the ceiling: Redis Streams measured by `rqueue bench` on rqueue's server vs by the peers' "
        "script on theirs, same session: " + "; ".join(parts) + ".",
    ]


def peers_extras(summarize: ModuleType, results: Path) -> list[str]:
    """summarize.py's output after its main table (already merged above):
    redis-benchmark, AOF and the NATS redelivery scenario."""
    try:
        full = subprocess.run(
            [sys.executable, str(Path(summarize.__file__)), str(results), "--md"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    lines = full.splitlines()
    i = 0
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    while i < len(lines) and lines[i].startswith("|"):
        i += 1  # the main table
    out = []
    for line in lines[i:]:
        if line.startswith("  ") and line.strip():
            out.append("- " + line.strip())
        else:
            out.append(line)
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return out


def revision(path: str | None) -> str:
    """The commit measured, and how many of rqueue's files differed from it."""
    if not path or not Path(path).is_file():
        return "?"
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        return "?"
    head = f"`{lines[0]}`"
    changed = [line.strip() for line in lines[1:]]
    if changed:
        shown = ", ".join(c.split()[-1] for c in changed[:6]) + (", ..." if len(changed) > 6 else "")
        return head + f" plus uncommitted changes to {len(changed)} file(s): {shown}"
    return head + ", no uncommitted changes to rqueue/"


def render(rq: dict[str, Any], args: argparse.Namespace) -> str:
    summarize = load_summarize(Path(args.peers_dir)) if args.peers_dir else None
    peers_run = Path(args.peers_run) if args.peers_run else None
    results = peers_results(peers_run)
    status = (
        Path(args.peers_status).read_text().strip()
        if args.peers_status and Path(args.peers_status).is_file()
        else "not run"
    )
    env, srv = rq["environment"], rq["server"]
    if args.total_seconds:
        total = f"{args.total_seconds:.0f} s"
    else:
        total = f"{time.time() - args.started:.0f} s" if args.started else "?"
    lines = [
        "# rqueue benchmarks: results",
        "",
        f"One session of `{args.command}`, started {env.get('started_at')}, {total} in all"
        + (f" (rqueue bench {args.rqueue_seconds:.0f} s)" if args.rqueue_seconds else "")
        + ". "
        "Written by benchmarks/compare.py; how to reproduce: benchmarks/README.md.",
        "",
        "## Machine and versions",
        "",
        md_table(
            ["", ""],
            [["rqueue", revision(args.git_info)]]
            + [[k, v] for k, v in machine()]
            + [
                ["Server", f"{srv['name']} {srv['version']}, private, no persistence (`--save '' --appendonly no`)"],
                ["Python / redis-py / hiredis", f"{env.get('python')} / {env.get('redis_py')} / {env.get('hiredis')}"],
                ["Load average at start", str(env.get("loadavg"))],
                [
                    "CPU steal during rqueue bench",
                    "-" if env.get("cpu_steal_pct") is None else f"{env['cpu_steal_pct']:.1f} %",
                ],
                ["rqueue bench time", f"{rq['elapsed_s']:.0f} s"],
            ],
        ),
        "",
    ]
    lines += section_targets(rq)
    lines.append("")
    breakdown = section_breakdown(rq)
    if breakdown:
        lines += breakdown + [""]
    mem = rq["figures"].get("memory_per_msg")
    if mem and mem["median"] is not None:
        ex = mem["extra"]
        lines += [
            "## Memory",
            "",
            f"{mem['n']:,} messages queued for a group that has not read them: INFO memory used_memory grew by "
            f"{mem['median']:.1f} bytes per message for rqueue and {mem['streams']['median']:.1f} per Stream entry "
            f"(ratio {mem['ratio']:.2f}x). MEMORY USAGE of the keys themselves: "
            f"{ex.get('memory_usage_keys_per_msg', float('nan')):.1f} B/msg (rqueue's queue keys) and "
            f"{ex.get('streams_memory_usage_keys_per_msg', float('nan')):.1f} B/msg (the stream). "
            "The payload is 100 bytes; rqueue stores each message as one hash field, a 107-byte record "
            "(`~`, published_ms in 6 bytes, the payload; the text form `<not_before>:<published_ms>:"
            "<headers_len>:<headers><payload>` when it has headers or a delay), a stream as a listpack entry.",
            "",
        ]
    lines += section_peers(rq, summarize, results, status, peers_run)
    notes = rq.get("notes", []) + [f"error: {e}" for e in rq.get("errors", [])]
    if notes:
        lines += ["", "## Notes from the run", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rqueue", required=True, help="JSON of rqueue bench --json")
    ap.add_argument("--peers-dir", default=str(HERE.parent.parent / "shared" / "peers"))
    ap.add_argument("--peers-run", default=None, help="the peers' PEERS_RUN folder of this session")
    ap.add_argument("--peers-status", default=None, help="a file with one line on how the peers' run went")
    ap.add_argument("--started", type=float, default=None, help="start of the session, seconds since the epoch")
    ap.add_argument("--rqueue-seconds", type=float, default=None)
    ap.add_argument("--git-info", default=None, help="first line: the commit measured; then changed files")
    ap.add_argument(
        "--total-seconds", type=float, default=None, help="length of the session (default: now - --started)"
    )
    ap.add_argument("--command", default="benchmarks/run.sh")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = ap.parse_args()
    try:
        rq = json.loads(Path(args.rqueue).read_text())
    except (OSError, ValueError) as exc:
        print(f"compare.py: no rqueue results in {args.rqueue}: {exc}", file=sys.stderr)
        return 1
    if rq.get("schema") != "rqueue-bench/1":
        print(f"compare.py: {args.rqueue} is not rqueue-bench/1 output", file=sys.stderr)
        return 1
    text = render(rq, args)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
