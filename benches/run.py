"""`make bench` / `make bench-quick`: every path against the same simulator, in one run, as ratios.

Usage: python benches/run.py [--quick] [--paths floor,passthrough,stack,gateway,gateway-pg,litellm,portkey]
       [--no-micro]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load
import procstat
import report
import servers

SERVER_CPU = "0"  # the path under test
CLIENT_CPU = "1"  # the simulator and the load generator
STREAM_CHUNKS = 200  # the chat_stream workload's chunks (servers.UPSTREAM_MODEL: tokens=200)
# The stack floor is measured only where the gateway's figures are split by it (report.py's "What
# the features cost"): chat at 1 and 64, a 200-chunk stream and the paced stream's first token.
STACK_PLAN = {"chat": [1, 64], "chat_stream": [1]}


def wheel_note() -> str | None:
    """The newest wheel `make wheel` left in dist/ and its size (what users download), if any."""
    dist = Path(__file__).resolve().parent.parent / "dist"
    wheels = sorted(dist.glob("gateway-*.whl"), key=lambda p: p.stat().st_mtime)
    return f"wheel: {wheels[-1].name}, {wheels[-1].stat().st_size / 1e6:.1f} MB" if wheels else None


def measure(
    target: servers.Target, workload: str, concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    if workload in target.requests:
        url, data, headers = target.requests[workload]
    else:
        url, data = target.url(workload), load.body(workload, target.model_for(workload))
        headers = target.headers_for(workload)
    keys = target.keys if workload == servers.MANY_KEYS else ()
    load.wrk(url, data, headers, concurrency, warmup, CLIENT_CPU, keys)
    cpu_before = procstat.cpu_seconds(target.pid) if target.pid else 0.0
    result = load.wrk(url, data, headers, concurrency, seconds, CLIENT_CPU, keys)
    cpu = (procstat.cpu_seconds(target.pid) - cpu_before) if target.pid else None
    row: dict[str, Any] = {
        "path": target.name,
        "workload": workload,
        "concurrency": concurrency,
        "requests": result.requests,
        "failures": result.failures,
        "rps": round(result.rps, 1),
        "p50_ms": result.p50_ms,
        "p90_ms": result.p90_ms,
        "p99_ms": result.p99_ms,
        "rss_mb": round(procstat.peak_rss_mb(target.pid), 1) if target.pid else None,
        "cpu_s_per_1k": round(cpu / result.requests * 1000, 4)
        if cpu is not None and result.requests
        else None,
    }
    print(
        f"  {target.name:10} {workload:19} c={concurrency:<4} {row['rps']:>9,.0f} req/s  p50 {result.p50_ms:8.2f} ms"
        f"  p99 {result.p99_ms:8.2f} ms  failures {result.failures}",
        flush=True,
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick",
        action="store_true",
        help="gateway (embedded and on PostgreSQL) and LiteLLM, chat at 1 and 64, chat_prompt at 64",
    )
    parser.add_argument("--paths", default=None)
    parser.add_argument("--no-micro", action="store_true")
    args = parser.parse_args()

    if args.quick:
        paths = ["floor", "passthrough", "gateway", "gateway-pg", "litellm"]
        plan = {"chat": [1, 64], servers.PROMPT: [64], "chat_stream": [1], servers.BEDROCK_STREAM: [1]}
        seconds, warmup = 5.0, 2.0
    else:
        paths = ["floor", "passthrough", "stack", "gateway", "gateway-pg", "litellm", "portkey"]
        plan = {
            "chat": [1, 16, 64, 256],
            servers.MANY_KEYS: [64],
            servers.LIMITED: [64],
            servers.PROMPT: [1, 64],
            "chat_stream": [1, 16, 64],
            servers.BEDROCK_STREAM: [1],
            "embeddings": [1, 64],
        }
        seconds, warmup = 8.0, 3.0
    if args.paths:
        paths = args.paths.split(",")
    notes: list[str] = [note for note in [wheel_note()] if note]
    if "litellm" in paths and not servers.litellm_available():
        paths.remove("litellm")
        notes.append("LiteLLM is not installed (run `make bench-tools`); its rows are missing.")
    if "portkey" in paths and not servers.portkey_available():
        paths.remove("portkey")
        notes.append("Portkey's gateway needs Node.js and `make bench-tools`; its rows are missing.")

    rows: list[dict[str, Any]] = []
    timings: list[dict[str, Any]] = []
    versions: dict[str, str] = {}
    with (
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp,
        servers.simulator(Path(tmp), CLIENT_CPU) as sim,
    ):
        starters: dict[str, Callable[[], AbstractContextManager[servers.Target]]] = {
            "floor": lambda: contextlib.nullcontext(servers.floor(sim)),
            "passthrough": lambda: servers.passthrough(sim, Path(tmp), SERVER_CPU),
            "stack": lambda: servers.stack_floor(sim, Path(tmp), SERVER_CPU),
            "held": lambda: servers.held_floor(sim, Path(tmp), SERVER_CPU),
            "gateway": lambda: servers.gateway(sim, Path(tmp), SERVER_CPU),
            "gateway-pg": lambda: servers.gateway_pg(sim, Path(tmp), SERVER_CPU, services_cpu=CLIENT_CPU),
            "litellm": lambda: servers.litellm(sim, Path(tmp), SERVER_CPU),
            "portkey": lambda: servers.portkey(sim, Path(tmp), SERVER_CPU),
        }
        for path in paths:
            print(f"{path}:", flush=True)
            try:
                path_plan = STACK_PLAN if path == "stack" else plan
                run_path(path, starters[path], path_plan, seconds, warmup, rows, timings, versions, notes)
            except servers.Unavailable as exc:  # raised while starting, before any measurement
                print(f"  skipped: {exc}", flush=True)
                notes.append(f"{path}: not measured, {exc}; its rows are missing.")
        paired = None
        if "gateway" in paths and "gateway-pg" in paths:
            print("gateway against gateway-pg, interleaved (c=1 p50, c=64 req/s):", flush=True)
            try:
                paired = pg_paired(
                    starters, rounds=4 if args.quick else 8, seconds=2.0 if args.quick else 3.0
                )
            except servers.Unavailable as exc:
                notes.append(f"the interleaved gateway/gateway-pg comparison was not measured: {exc}.")
        first_token = None
        if "gateway" in paths and "floor" in paths:
            print("the first token, gateway and held stack floor against floor, interleaved:", flush=True)
            try:
                first_token = first_token_paired(starters, rounds=4 if args.quick else 8, streams=15)
            except load.StreamFailed as exc:
                notes.append(f"the interleaved first-token comparison was not measured: {exc}.")
        chunks = None
        if "gateway" in paths and "floor" in paths:
            print("the cost per streamed chunk, gateway against floor, interleaved:", flush=True)
            chunks = chunk_paired(starters, rounds=4 if args.quick else 8, seconds=2.0 if args.quick else 3.0)
    for r in rows:
        if r["failures"]:
            notes.append(
                f"{r['path']} {r['workload']} at c={r['concurrency']}: {r['failures']} of "
                f"{r['requests']} requests failed (non-2xx or socket errors); its figures include them."
            )
    add_differences(rows)
    micro_rows = [] if args.no_micro or args.quick else micro()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    result = {
        "machine": report.machine(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "versions": versions,
        "rows": rows,
        "stream_timing": timings,
        "pg_paired": paired,
        "first_token_paired": first_token,
        "chunk_paired": chunks,
        "micro": micro_rows,
        "notes": notes,
    }
    out = report.write(result, stamp)
    print(f"\nwrote {out}")
    for name, limit, value, ok in report.check_targets(rows, paired, timings, first_token, chunks):
        status = "n/a" if ok is None else ("met" if ok else "MISSED")
        print(
            f"  target {name}: limit {limit:g}, measured {value if value is None else round(value, 3)} -> {status}"
        )
    return 0


def run_path(
    path: str,
    start: Callable[[], AbstractContextManager[servers.Target]],
    plan: dict[str, list[int]],
    seconds: float,
    warmup: float,
    rows: list[dict[str, Any]],
    timings: list[dict[str, Any]],
    versions: dict[str, str],
    notes: list[str],
) -> None:
    with start() as target:
        versions[path] = target.version
        if target.placement and f"{path}: {target.placement}." not in notes:
            notes.append(f"{path}: {target.placement}.")
        time.sleep(0.5)
        for workload, concurrencies in plan.items():
            if not target.serves(workload):  # the Bedrock path: the floor and this gateway only
                continue
            for c in concurrencies:
                rows.append(measure(target, workload, c, seconds, warmup))
        try:
            t = load.stream_timing(
                target.url("chat_paced"),
                load.body("chat_paced", target.model["chat_paced"]),
                target.headers,
            )
        except load.StreamFailed as exc:
            notes.append(f"{path}: stream timing not measured, {exc}.")
        else:
            timings.append({"path": path, **t.__dict__})


def pg_paired(
    starters: dict[str, Callable[[], AbstractContextManager[servers.Target]]], rounds: int, seconds: float
) -> dict[str, Any]:
    """gateway-pg against the gateway, both running, measured in alternating rounds: its p50 minus
    the gateway's at c=1 (chat) and its requests per second over the gateway's at c=64. The
    machine's speed drifts by tenths of a millisecond and by tens of per cent of its throughput over
    minutes, more than either target's margin, so rows taken a minute apart compare the drift as
    much as the paths."""

    def both(target: servers.Target) -> tuple[float, float]:
        return _p50_at_c1("chat", seconds, target), _rps_at_c64("chat", seconds, target)

    with starters["gateway"]() as gateway, starters["gateway-pg"]() as gateway_pg:
        found = _alternating([gateway, gateway_pg], rounds, both)
    pairs = list(zip(found[gateway.name], found[gateway_pg.name], strict=True))
    differences = [round(pg[0] - gw[0], 3) for gw, pg in pairs]
    ratios = [round(pg[1] / gw[1], 3) for gw, pg in pairs]
    return {
        "seconds": seconds,
        "rounds": rounds,
        "differences_ms": differences,
        "median_ms": round(statistics.median(differences), 3),
        "throughput_ratios": ratios,
        "throughput_ratio_median": round(statistics.median(ratios), 3),
    }


def first_token_paired(
    starters: dict[str, Callable[[], AbstractContextManager[servers.Target]]], rounds: int, streams: int
) -> dict[str, Any]:
    """The gateway's time to a stream's first content token minus the floor's, from alternating
    rounds of `streams` paced streams on each: the difference is tenths of a millisecond, as much
    as the machine drifts between two paths' own timings minutes apart (the per-path table's), as
    for pg_paired. The same rounds time the held stack floor (servers.held_floor: the serving stack
    with no feature, holding the head back to the first token as spec 6.1.7 asks), so the report
    can split the figure into what the stack and that rule cost and what the features add."""

    def first_token(target: servers.Target) -> float:
        body = load.body("chat_paced", target.model["chat_paced"])
        return load.stream_timing(
            target.url("chat_paced"), body, target.headers, count=streams
        ).first_token_p50_ms

    with starters["floor"]() as floor, starters["gateway"]() as gateway, starters["held"]() as held:
        found = _alternating([floor, gateway, held], rounds, first_token)
    over_floor = _differences(found, floor, gateway)
    held_over_floor = _differences(found, floor, held)
    return {
        "streams": streams,
        "rounds": rounds,
        "differences_ms": over_floor,
        "median_ms": round(statistics.median(over_floor), 3),
        "held_differences_ms": held_over_floor,
        "held_median_ms": round(statistics.median(held_over_floor), 3),
    }


def chunk_paired(
    starters: dict[str, Callable[[], AbstractContextManager[servers.Target]]], rounds: int, seconds: float
) -> dict[str, Any]:
    """What the gateway adds per streamed chunk, (gateway - floor) p50 of the 200-chunk stream at
    c = 1 over 200, from alternating rounds: the stream's p50 moves by a millisecond between rows
    taken minutes apart (5 µs a chunk, the target itself), as for pg_paired."""

    with starters["floor"]() as floor, starters["gateway"]() as gateway:
        found = _alternating([floor, gateway], rounds, partial(_p50_at_c1, "chat_stream", seconds))
    per_chunk = [round(ms * 1000 / STREAM_CHUNKS, 2) for ms in _differences(found, floor, gateway)]
    return {
        "seconds": seconds,
        "rounds": rounds,
        "differences_us": per_chunk,
        "median_us": round(statistics.median(per_chunk), 2),
    }


def _p50_at_c1(workload: str, seconds: float, target: servers.Target) -> float:
    """The p50 (ms) of `workload` on `target` at c=1 over `seconds`, after a second's warm-up."""
    data = load.body(workload, target.model[workload])
    load.wrk(target.url(workload), data, target.headers, 1, 1.0, CLIENT_CPU)
    return load.wrk(target.url(workload), data, target.headers, 1, seconds, CLIENT_CPU).p50_ms


def _rps_at_c64(workload: str, seconds: float, target: servers.Target) -> float:
    """The requests per second of `workload` on `target` at c=64 over `seconds`, after a second's
    warm-up."""
    data = load.body(workload, target.model[workload])
    load.wrk(target.url(workload), data, target.headers, 64, 1.0, CLIENT_CPU)
    return load.wrk(target.url(workload), data, target.headers, 64, seconds, CLIENT_CPU).rps


Figure = TypeVar("Figure")


def _alternating(
    targets: list[servers.Target], rounds: int, measure: Callable[[servers.Target], Figure]
) -> dict[str, list[Figure]]:
    """`measure(target)` for each of `targets` in each of `rounds` rounds, which of them goes first
    rotating; by target's name, every round's figure."""
    time.sleep(0.5)
    figures: dict[str, list[Figure]] = {target.name: [] for target in targets}
    for n in range(rounds):
        for target in targets[n % len(targets) :] + targets[: n % len(targets)]:
            figures[target.name].append(measure(target))
        print(
            f"  round {n + 1}: " + ", ".join(f"{name} {_show(found[-1])}" for name, found in figures.items()),
            flush=True,
        )
    return figures


def _show(figure: object) -> str:
    if isinstance(figure, tuple):  # pg_paired's (p50 ms at c=1, req/s at c=64)
        return f"{figure[0]:.2f} ms / {figure[1]:,.0f} req/s"
    return f"{figure:.2f} ms"


def _differences(found: dict[str, list[float]], base: servers.Target, other: servers.Target) -> list[float]:
    """Every round's figure of `other` minus `base`'s (ms), from _alternating's figures."""
    return [round(o - b, 3) for b, o in zip(found[base.name], found[other.name], strict=True)]


def add_differences(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        base = report.row(rows, "floor", r["workload"], r["concurrency"])
        if base is None:
            continue
        r["added_p50_ms"] = round(r["p50_ms"] - base["p50_ms"], 3)
        r["added_p99_ms"] = round(r["p99_ms"] - base["p99_ms"], 3)
        if r["workload"] in ("chat_stream", servers.BEDROCK_STREAM):
            r["added_us_per_chunk"] = round((r["p50_ms"] - base["p50_ms"]) * 1000 / STREAM_CHUNKS, 2)


def micro() -> list[dict[str, Any]]:
    import micro as micro_module

    return micro_module.run()


if __name__ == "__main__":
    raise SystemExit(main())
