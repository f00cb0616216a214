"""The results: benches/results/latest.json (for tools), latest.md (for people), latency.png."""

from __future__ import annotations

import json
import platform
import tomllib
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = Path(__file__).resolve().parent / "targets.toml"
PATHS = ("floor", "passthrough", "stack", "gateway", "gateway-pg", "litellm", "portkey")
# Targets that are floors (the measured figure must reach them); every other one is a ceiling.
AT_LEAST = frozenset(
    {"throughput_vs_litellm_c64", "throughput_vs_passthrough_c64", "pg_throughput_vs_embedded_c64"}
)


def machine() -> str:
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import os

    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def row(rows: list[dict[str, Any]], path: str, workload: str, c: int) -> dict[str, Any] | None:
    return next(
        (r for r in rows if r["path"] == path and r["workload"] == workload and r["concurrency"] == c), None
    )


def first_token_added_ms(timings: list[dict[str, Any]], path: str = "gateway") -> float | None:
    """A path's time to the first content token minus the floor's (the stream timing client)."""
    mine = next((t for t in timings if t["path"] == path), None)
    floor = next((t for t in timings if t["path"] == "floor"), None)
    if not mine or not floor or "first_token_p50_ms" not in mine or "first_token_p50_ms" not in floor:
        return None
    return float(mine["first_token_p50_ms"] - floor["first_token_p50_ms"])


def check_targets(
    rows: list[dict[str, Any]],
    pg_paired: dict[str, Any] | None = None,
    timings: list[dict[str, Any]] | None = None,
    first_token_paired: dict[str, Any] | None = None,
    chunk_paired: dict[str, Any] | None = None,
) -> list[tuple[str, float, float | None, bool | None]]:
    """Each target's limit, measured value and verdict. gateway-pg's latency and throughput against
    the gateway's come from the interleaved rounds when they ran (`pg_paired`), else from the two
    paths' own rows; the first token's over the floor's likewise (`first_token_paired`, else the
    paths' stream timings), and the cost per streamed chunk (`chunk_paired`, else the two paths'
    chat_stream rows)."""
    targets = tomllib.loads(TARGETS.read_text())["targets"]
    gw1 = row(rows, "gateway", "chat", 1)
    gw64 = row(rows, "gateway", "chat", 64)
    ll64 = row(rows, "litellm", "chat", 64)
    pt64 = row(rows, "passthrough", "chat", 64)
    stream1 = row(rows, "gateway", "chat_stream", 1)
    bedrock1 = row(rows, "gateway", "chat_stream_bedrock", 1)
    pg1 = row(rows, "gateway-pg", "chat", 1)
    pg64 = row(rows, "gateway-pg", "chat", 64)
    rss = max((r["rss_mb"] for r in rows if r["path"] == "gateway" and r.get("rss_mb")), default=None)
    measured: dict[str, float | None] = {
        # Added figures exist only when the floor ran too (`--paths` may leave it out).
        "added_p50_ms_c1": gw1.get("added_p50_ms") if gw1 else None,
        "added_p99_ms_c1": gw1.get("added_p99_ms") if gw1 else None,
        "throughput_vs_litellm_c64": gw64["rps"] / ll64["rps"] if gw64 and ll64 and ll64["rps"] else None,
        "throughput_vs_passthrough_c64": gw64["rps"] / pt64["rps"] if gw64 and pt64 and pt64["rps"] else None,
        "cpu_s_per_1k_c64": gw64.get("cpu_s_per_1k") if gw64 else None,
        "stream_first_token_added_ms": first_token_paired["median_ms"]
        if first_token_paired
        else first_token_added_ms(timings or []),
        "stream_added_us_per_chunk": chunk_paired["median_us"]
        if chunk_paired
        else (stream1.get("added_us_per_chunk") if stream1 else None),
        "bedrock_stream_added_us_per_chunk": bedrock1.get("added_us_per_chunk") if bedrock1 else None,
        "rss_mb": rss,
        "pg_throughput_vs_embedded_c64": pg_paired["throughput_ratio_median"]
        if pg_paired and "throughput_ratio_median" in pg_paired
        else pg64["rps"] / gw64["rps"]
        if pg64 and gw64 and gw64["rps"]
        else None,
        "pg_added_p50_ms_c1_over_embedded": pg_paired["median_ms"]
        if pg_paired
        else pg1["added_p50_ms"] - gw1["added_p50_ms"]
        if pg1 and gw1 and "added_p50_ms" in pg1 and "added_p50_ms" in gw1
        else None,
    }
    out = []
    for name, limit in targets.items():
        value = measured.get(name)
        if value is None:
            ok = None
        elif name in AT_LEAST:
            ok = value >= limit
        else:
            ok = value <= limit
        out.append((name, limit, value, ok))
    return out


def features_cost(rows: list[dict[str, Any]], timings: list[dict[str, Any]]) -> list[str]:
    """The gateway's distance from the pass-through split in two by the stack floor: what its
    serving stack costs with no feature, and what every feature together costs over that."""
    pt, stack, gw = (row(rows, p, "chat", 64) for p in ("passthrough", "stack", "gateway"))
    if not (pt and stack and gw and pt["rps"] and all(r.get("cpu_s_per_1k") for r in (pt, stack, gw))):
        return []
    lines = [
        "",
        "## What the features cost",
        "",
        "The stack floor (`stack`) is the gateway's serving stack with no feature: Granian's ASGI "
        "interface and the gateway's own upstream client (benches/stack_floor.py). CPU per request "
        "is the server's, at c=64 (chat).",
        "",
        "| path | req/s at c=64 | × pass-through | CPU µs per request | added first token ms |",
        "|---|---|---|---|---|",
    ]
    for name, r in (("passthrough", pt), ("stack", stack), ("gateway", gw)):
        lines.append(
            f"| {name} | {_fmt(r['rps'], 0)} | {_fmt(r['rps'] / pt['rps'])} | {_fmt(r['cpu_s_per_1k'] * 1000, 1)} "
            f"| {_fmt(first_token_added_ms(timings, name))} |"
        )
    target = tomllib.loads(TARGETS.read_text())["targets"].get("throughput_vs_passthrough_c64")
    features = (gw["cpu_s_per_1k"] - stack["cpu_s_per_1k"]) * 1000
    text = f"Every feature together costs {features:.1f} µs of CPU per request over the stack floor."
    if target:
        # Bound by one core at c=64, requests/s is about the inverse of the CPU per request.
        budget = pt["cpu_s_per_1k"] * 1000 / target - stack["cpu_s_per_1k"] * 1000
        text += (
            f" At {target:g}× the pass-through's requests/s, the gateway would have about "
            f"{pt['cpu_s_per_1k'] * 1000 / target:.1f} µs per request: {budget:.1f} µs for the features."
        )
    return [*lines, "", text]


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def write(result: dict[str, Any], stamp: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    rows = result["rows"]
    (RESULTS / "latest.json").write_text(json.dumps(result, indent=1) + "\n")
    paths = [p for p in PATHS if any(r["path"] == p for r in rows)]
    lines = [
        f"# Benchmark results — {result['date']}",
        "",
        f"Machine: {result['machine']}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
        + f". Mode: {result['mode']}.",
        "",
        "Each server runs one worker pinned to CPU 0; the simulator and the load generator (wrk, one "
        "thread) share CPU 1. Every run is warmed up first. `added` is the path's latency minus the "
        "floor's (the client straight to the simulator) at the same percentile; `× gateway` is the "
        "gateway's figure over that path's (throughput) or that path's over the gateway's (latency).",
        "",
        "## Targets",
        "",
        "| target | limit | measured | |",
        "|---|---|---|---|",
    ]
    paired = result.get("pg_paired")
    first_token = result.get("first_token_paired")
    chunks = result.get("chunk_paired")
    for name, limit, value, ok in check_targets(
        rows, paired, result.get("stream_timing"), first_token, chunks
    ):
        mark = "–" if ok is None else ("met" if ok else "**missed**")
        lines.append(f"| {name} | {limit:g} | {_fmt(value)} | {mark} |")
    if paired:
        lines += [
            "",
            f"`pg_added_p50_ms_c1_over_embedded` is the median of {paired['rounds']} interleaved rounds "
            f"({paired['seconds']:g} s each, c=1 chat, both gateways running, order alternating): "
            + ", ".join(f"{d:+.2f}" for d in paired["differences_ms"])
            + " ms. The rows below were measured minutes apart and drift with the machine.",
        ]
        if "throughput_ratios" in paired:
            lines += [
                "",
                f"`pg_throughput_vs_embedded_c64` is the median of the same rounds' ratios (c=64 chat,"
                f" {paired['seconds']:g} s each after a second's warm-up, gateway-pg's requests per second"
                " over the gateway's): "
                + ", ".join(f"{r:.2f}" for r in paired["throughput_ratios"])
                + ". The c=64 rows below compare two runs minutes apart.",
            ]
    if first_token:
        lines += [
            "",
            f"`stream_first_token_added_ms` is the median of {first_token['rounds']} interleaved rounds "
            f"({first_token['streams']} paced streams each on "
            + (
                "the floor, the gateway and the held stack floor, order rotating"
                if "held_median_ms" in first_token
                else "the gateway and on the floor, order alternating"
            )
            + "): "
            + ", ".join(f"{d:+.2f}" for d in first_token["differences_ms"])
            + " ms. The table's `added first token` compares stream timings taken minutes apart.",
        ]
        if "held_median_ms" in first_token:
            held = first_token["held_median_ms"]
            lines += [
                "",
                "The same rounds timed the held stack floor (`held`: the serving stack with no feature,"
                " holding a stream's head back until its first token as spec 6.1.7 asks of the gateway):"
                f" {held:+.2f} ms over the floor (rounds "
                + ", ".join(f"{d:+.2f}" for d in first_token["held_differences_ms"])
                + "). What the features add to the first token is the rest:"
                f" {first_token['median_ms'] - held:+.2f} ms.",
            ]
    if chunks:
        lines += [
            "",
            f"`stream_added_us_per_chunk` is the median of {chunks['rounds']} interleaved rounds "
            f"({chunks['seconds']:g} s each of the 200-chunk stream at c=1 on the gateway and on the floor, order "
            "alternating): "
            + ", ".join(f"{d:+.2f}" for d in chunks["differences_us"])
            + " µs. The stream tables' per-chunk figures compare rows taken minutes apart.",
        ]
    lines += features_cost(rows, result.get("stream_timing", []))
    workloads = (
        "chat",
        "chat_keys",
        "chat_limited",
        "chat_prompt",
        "chat_stream",
        "chat_stream_bedrock",
        "embeddings",
    )
    for workload in workloads:
        cs = sorted({r["concurrency"] for r in rows if r["workload"] == workload})
        if not cs:
            continue
        lines += ["", f"## {workload}", ""]
        header = "| path | c | req/s | × gateway | p50 ms | p90 ms | p99 ms | added p50 | added p99 | CPU s/1k req | peak RSS MB | failed |"
        lines += [header, "|---" * (header.count("|") - 1) + "|"]
        for c in cs:
            gw = row(rows, "gateway", workload, c)
            for p in paths:
                r = row(rows, p, workload, c)
                if r is None:
                    continue
                ratio = None
                if gw and p != "gateway" and r["rps"]:
                    ratio = gw["rps"] / r["rps"]
                lines.append(
                    f"| {p} | {c} | {_fmt(r['rps'], 0)} | {_fmt(ratio, 1) if ratio else ''} | {_fmt(r['p50_ms'])} "
                    f"| {_fmt(r['p90_ms'])} | {_fmt(r['p99_ms'])} | {_fmt(r.get('added_p50_ms'))} "
                    f"| {_fmt(r.get('added_p99_ms'))} | {_fmt(r.get('cpu_s_per_1k'), 3)} | {_fmt(r.get('rss_mb'), 0)} | {r['failures']} |"
                )
    streams = [
        r
        for r in rows
        if r["workload"] in ("chat_stream", "chat_stream_bedrock") and r.get("added_us_per_chunk") is not None
    ]
    timings = result.get("stream_timing", [])
    if streams or timings:
        lines += [
            "",
            "## Streaming",
            "",
            "Added per chunk: (path − floor) p50 of a 200-chunk stream at concurrency 1, divided by 200. "
            "Time to first byte, to the first content token (the floor's first bytes are the "
            "upstream's role-only chunk; a gateway holds its bytes back until the first token) and "
            "the gap between chunks come from one client reading a stream of 50 chunks paced 2 ms "
            "apart by the simulator; `added` is the first token's time minus the floor's.",
            "",
            "| path | added µs/chunk | first byte p50 ms | first token p50 ms | added first token ms "
            "| chunk gap p50 µs | chunk gap p99 µs |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in paths:
            s = next(
                (
                    r
                    for r in streams
                    if r["path"] == p and r["workload"] == "chat_stream" and r["concurrency"] == 1
                ),
                None,
            )
            t = next((t for t in timings if t["path"] == p), None)
            token = t.get("first_token_p50_ms") if t else None
            added = first_token_added_ms(timings, p) if p != "floor" else None
            lines.append(
                f"| {p} | {_fmt(s['added_us_per_chunk'], 1) if s else '–'} | {_fmt(t['ttft_p50_ms']) if t else '–'} "
                f"| {_fmt(token)} | {_fmt(added)} "
                f"| {_fmt(t['chunk_gap_p50_us'], 0) if t else '–'} | {_fmt(t['chunk_gap_p99_us'], 0) if t else '–'} |"
            )
        for b in (r for r in streams if r["workload"] == "chat_stream_bedrock" and r["path"] != "floor"):
            lines.append(
                f"| {b['path']}, Bedrock event stream | {_fmt(b['added_us_per_chunk'], 1)} | – | – | – | – | – |"
            )
    if result.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    if result.get("micro"):
        lines += [
            "",
            "## Micro-benchmarks (Rust core beside the nearest pure-Python way)",
            "",
            "| job | Rust core | Python | × |",
            "|---|---|---|---|",
        ]
        for m in result["micro"]:
            lines.append(f"| {m['job']} | {m['rust']} | {m['python']} | {m['speedup']:.1f} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / "latest.md").write_text(text)
    (RESULTS / f"{stamp}.md").write_text(text)
    chart(rows, RESULTS / "latency.png")
    return RESULTS / "latest.md"


def chart(rows: list[dict[str, Any]], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, title in ((axes[0], "p50_ms", "p50 latency"), (axes[1], "p99_ms", "p99 latency")):
        for path in PATHS:
            pts = sorted(
                (r["concurrency"], r[metric]) for r in rows if r["path"] == path and r["workload"] == "chat"
            )
            if pts:
                ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=path)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("ms")
        ax.set_title(f"chat completions: {title}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
