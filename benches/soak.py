"""`make bench-soak`: whether one worker's memory and CPU per request hold still over a long run.

A benchmark's minutes cannot show a leak: a worker that keeps a few hundred bytes of every request
looks the same as one that keeps nothing. This runs one path (the gateway on its embedded store, or
gateway-pg on PostgreSQL + Redis) for MINUTES under a rotating mix of the benchmark's workloads
(chat, a 200-chunk stream, 50 keys, a rate-limited key, embeddings), one window a workload, wrk on
the other core at a modest concurrency, and after each window reads every server process's resident
memory now (VmRSS, not the peak) and the window's CPU per 1,000 requests.

Read the table by workload: a leak shows as the same workload's RSS climbing cycle after cycle, in
step with the requests served; a store that slows as it fills shows as CPU per request climbing
(the request rate moves with the machine, so it is not the figure to read). A stream window holds
its streams' buffers and reads a few MB above the rest; what matters is where the windows after it
come back to.

Writes benches/results/soak-<path>.md.

Usage: python benches/soak.py [--path gateway|gateway-pg] [--minutes 30] [--connections 8] [--window 55]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load
import procstat
import report
import servers

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benches" / "results"
SERVER_CPU = "0"
CLIENT_CPU = "1"
# One window each, in this order, over and over; chat twice, as most of a deployment's traffic.
MIX = ("chat", "chat_stream", servers.MANY_KEYS, servers.LIMITED, "embeddings", "chat")


def window(target: servers.Target, workload: str, connections: int, seconds: float) -> dict[str, Any]:
    keys = target.keys if workload == servers.MANY_KEYS else ()
    body = load.body(workload, target.model_for(workload))
    assert target.pid is not None
    cpu_before = procstat.cpu_seconds(target.pid)
    result = load.wrk(
        target.url(workload), body, target.headers_for(workload), connections, seconds, CLIENT_CPU, keys
    )
    cpu = procstat.cpu_seconds(target.pid) - cpu_before
    return {
        "workload": workload,
        "requests": result.requests,
        "failures": result.failures,
        "rps": result.rps,
        "cpu_s_per_1k": cpu / result.requests * 1000 if result.requests else None,
        "rss": procstat.rss_mb(target.pid),
    }


def growth(rows: list[dict[str, Any]], worker: int) -> list[str]:
    """Per workload: the worker's RSS at its second window and at its last, and the requests served
    between them (the first window of each is the warm-up: pools, caches, the allocator's arenas)."""
    lines = []
    for workload in dict.fromkeys(row["workload"] for row in rows):
        seen = [i for i, row in enumerate(rows) if row["workload"] == workload]
        if len(seen) < 3:
            continue
        first, last = seen[1], seen[-1]
        served = sum(row["requests"] for row in rows[first + 1 : last + 1])
        before, after = (rows[i]["rss"].get(worker, 0.0) for i in (first, last))
        lines.append(
            f"- {workload}: {before:.1f} → {after:.1f} MB over {served:,} requests"
            f" ({(after - before) / max(served, 1) * 1e6:+.2f} MB a million)"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", choices=["gateway", "gateway-pg"], default="gateway")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--window", type=float, default=55.0, help="seconds of each workload's window")
    args = parser.parse_args()
    windows = max(len(MIX) * 2, round(args.minutes * 60 / args.window))
    start = servers.gateway_pg if args.path == "gateway-pg" else servers.gateway
    rows: list[dict[str, Any]] = []
    started = dt.datetime.now(dt.UTC)
    with (
        tempfile.TemporaryDirectory(prefix="gateway-soak-") as tmp,
        servers.simulator(Path(tmp), CLIENT_CPU) as sim,
        start(sim, Path(tmp), SERVER_CPU) as target,
    ):
        assert target.pid is not None
        for i in range(windows):
            row = window(target, MIX[i % len(MIX)], args.connections, args.window)
            rows.append(row)
            rss = ", ".join(f"{mb:.1f}" for mb in row["rss"].values())
            print(
                f"  {i + 1:3}/{windows} {row['workload']:12} {row['requests']:>9,} requests"
                f"  failures {row['failures']}  {row['cpu_s_per_1k'] or 0:.3f} CPU s/1k  RSS {rss} MB",
                flush=True,
            )
        # The worker: the tree's largest process (the supervisor only watches it).
        worker = max(rows[-1]["rss"], key=lambda pid: rows[-1]["rss"][pid])
        version = target.version
    out = RESULTS / f"soak-{args.path}.md"
    out.write_text(render(rows, worker, args, started, version))
    print(f"wrote {out.relative_to(ROOT)}")
    return 1 if any(row["failures"] for row in rows) else 0


def render(
    rows: list[dict[str, Any]], worker: int, args: argparse.Namespace, started: dt.datetime, version: str
) -> str:
    total = sum(row["requests"] for row in rows)
    lines = [
        f"# Soak: {args.path}, {len(rows)} windows of {args.window:g} s",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {version}, {report.machine()}; wrk at"
        f" c = {args.connections} on CPU {CLIENT_CPU}, one worker on CPU {SERVER_CPU};"
        f" {total:,} requests, {sum(row['failures'] for row in rows)} failures.",
        "",
        "The worker's resident memory after each workload's second window and after its last:",
        "",
        *growth(rows, worker),
        "",
        "| window | workload | requests | req/s | CPU s per 1k | worker RSS (MB) | all processes (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(rows, 1):
        lines.append(
            f"| {i} | {row['workload']} | {row['requests']:,} | {row['rps']:,.0f} |"
            f" {row['cpu_s_per_1k'] or 0:.3f} | {row['rss'].get(worker, 0.0):.1f} | {sum(row['rss'].values()):.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
