"""`make bench-ab BASE=<commit>`: the gateway at BASE against the working tree, interleaved.

This machine's speed drifts by tens of percent within an hour, so two runs made one after the other
cannot show a change of a few percent. Here both gateways run at once against one simulator (each
pinned to the server core, one worker, embedded store) and take turns: each round measures A then B,
or B then A, chat at c=64 for throughput and CPU per request, then at c=1 for latency. The medians
over the rounds are the A/B; the table goes to stdout and, with --out, to a file.

BASE is checked out in a worktree under benches/.ab/. Its Rust extension is the working tree's when
rust/ and the Cargo files are the same at both; otherwise BASE's own is built (a few minutes). Both
stores are made by the working tree's code (the bench key is minted with it): a BASE older than a
store migration cannot be compared this way.

With --keys, each round also measures c=64 with requests spread over the bench's 50 keys on 20
accounts (servers.MANY_KEYS), where the SQLite writer's commits cost what they do in a deployment.
With --limited, each round also measures c=64 on the bench's rate-limited key (servers.LIMITED: its
account sets requests and tokens per minute it never reaches). With --pg, both gateways run as
gateway-pg does: PostgreSQL store and Redis (a database and a key prefix of their own each).
With --prompt, each round also measures c=64 with the chat_prompt workload's 4 KB conversation
(servers.PROMPT), where counting the prompt is much of the gateway's own work.
With --first-token, each round also times 30 paced streams through each gateway and straight to the
simulator (the floor, timed in the same round): the first content token's time over the floor's,
as `make bench` reports it.

Usage: python benches/ab.py BASE [--rounds 8] [--seconds 3] [--keys] [--limited] [--prompt] [--pg] [--first-token]
                            [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load
import procstat
import servers

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU = "0"
CLIENT_CPU = "1"
EXTENSION = Path("python/gateway/_core.abi3.so")
RUST_PATHS = ["rust", "Cargo.toml", "Cargo.lock"]
FIGURES = (
    ("rps_c64", "req/s at c=64", "{:,.0f}"),
    ("cpu_per_1k", "CPU s per 1k requests at c=64", "{:.3f}"),
    ("p50_c1", "p50 ms at c=1", "{:.3f}"),
    ("p99_c1", "p99 ms at c=1", "{:.3f}"),
)
MANY_KEYS_FIGURES = (
    ("rps_keys", "req/s at c=64, 50 keys", "{:,.0f}"),
    ("cpu_keys", "CPU s per 1k requests at c=64, 50 keys", "{:.3f}"),
)
PROMPT_FIGURES = (
    ("rps_prompt", "req/s at c=64, a 4 KB prompt", "{:,.0f}"),
    ("cpu_prompt", "CPU s per 1k requests at c=64, a 4 KB prompt", "{:.3f}"),
)
LIMITED_FIGURES = (
    ("rps_limited", "req/s at c=64, rate-limited key", "{:,.0f}"),
    ("cpu_limited", "CPU s per 1k requests at c=64, rate-limited key", "{:.3f}"),
)
FIRST_TOKEN_FIGURES = (("first_token", "first token over the floor, ms", "{:.3f}"),)


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def base_tree(base: str) -> tuple[Path, str]:
    """A worktree of `base` (made once per commit) with an extension that matches its Rust code."""
    sha = git("rev-parse", "--verify", f"{base}^{{commit}}")
    tree = ROOT / "benches" / ".ab" / sha[:12]
    if not tree.exists():
        git("worktree", "add", "--detach", str(tree), sha)
    if not (tree / EXTENSION).exists():
        same_rust = (
            subprocess.run(
                ["git", "diff", "--quiet", sha, "--", *RUST_PATHS], check=False, cwd=ROOT
            ).returncode
            == 0
        )
        if same_rust:
            shutil.copy2(ROOT / EXTENSION, tree / EXTENSION)
        else:
            print(f"building the Rust extension of {sha[:12]} ...", file=sys.stderr, flush=True)
            target = ROOT / "target" / "ab"
            subprocess.run(
                [
                    "cargo",
                    "build",
                    "--release",
                    "--locked",
                    "-p",
                    "gateway-py",
                    "--features",
                    "pyo3/extension-module",
                ],
                cwd=tree,
                check=True,
                env={**os.environ, "CARGO_TARGET_DIR": str(target), "PYO3_PYTHON": sys.executable},
            )
            shutil.copy2(target / "release" / "lib_core.so", tree / EXTENSION)
    return tree, sha


@contextlib.contextmanager
def python_path(path: Path) -> Iterator[None]:
    """Processes started meanwhile import the gateway from `path` (ahead of the editable install)."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(path)
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def one_round(
    target: servers.Target,
    seconds: float,
    many_keys: bool = False,
    limited: bool = False,
    prompt: bool = False,
) -> dict[str, float]:
    url, data = target.url("chat"), load.body("chat", target.model["chat"])
    busy, cpu = _busy(target, url, data, seconds, ())
    alone = load.wrk(url, data, target.headers, 1, seconds, CLIENT_CPU)
    if busy.failures or alone.failures:
        raise RuntimeError(f"{target.name}: {busy.failures + alone.failures} requests failed")
    figures = {"rps_c64": busy.rps, "cpu_per_1k": cpu, "p50_c1": alone.p50_ms, "p99_c1": alone.p99_ms}
    if many_keys:
        figures |= _extra(target, "keys", "over many keys", url, data, seconds, target.keys)
    if prompt:
        long_body = load.body(servers.PROMPT, target.model_for(servers.PROMPT))
        figures |= _extra(target, "prompt", "with the long prompt", url, long_body, seconds)
    if limited:
        headers = target.headers_for(servers.LIMITED)
        figures |= _extra(target, "limited", "on the rate-limited key", url, data, seconds, headers=headers)
    return figures


def _extra(
    target: servers.Target,
    name: str,
    what: str,
    url: str,
    data: bytes,
    seconds: float,
    keys: Sequence[str] = (),
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    """One of a round's optional c=64 figures: `rps_<name>` and `cpu_<name>` (`what` says how it
    differs from plain chat, in the error when requests failed)."""
    result, cpu = _busy(target, url, data, seconds, keys, headers)
    if result.failures:
        raise RuntimeError(f"{target.name}: {result.failures} requests failed {what}")
    return {f"rps_{name}": result.rps, f"cpu_{name}": cpu}


def first_token_ms(target: servers.Target) -> float:
    """The p50 time to the first content token of 30 paced streams, one at a time."""
    url, data = target.url("chat_paced"), load.body("chat_paced", target.model["chat_paced"])
    return load.stream_timing(url, data, target.headers).first_token_p50_ms


def _busy(
    target: servers.Target,
    url: str,
    data: bytes,
    seconds: float,
    keys: Sequence[str],
    headers: dict[str, str] | None = None,
) -> tuple[load.WrkResult, float]:
    """wrk at c=64 and the CPU seconds the target spent per 1k of its requests."""
    assert target.pid is not None
    cpu = procstat.cpu_seconds(target.pid)
    busy = load.wrk(url, data, headers or target.headers, 64, seconds, CLIENT_CPU, keys)
    cpu = procstat.cpu_seconds(target.pid) - cpu
    return busy, cpu / busy.requests * 1000 if busy.requests else 0.0


def table(labels: tuple[str, str], rounds: dict[str, list[dict[str, float]]]) -> str:
    a, b = labels
    lines = [f"| figure | A: {a} | B: {b} | B / A |", "|---|---|---|---|"]
    first_token = FIRST_TOKEN_FIGURES if "first_token" in rounds["A"][0] else ()
    figures = (
        FIGURES
        + (MANY_KEYS_FIGURES if "rps_keys" in rounds["A"][0] else ())
        + (LIMITED_FIGURES if "rps_limited" in rounds["A"][0] else ())
        + (PROMPT_FIGURES if "rps_prompt" in rounds["A"][0] else ())
        + first_token
    )
    for key, name, fmt in figures:
        ma = statistics.median(r[key] for r in rounds["A"])
        mb = statistics.median(r[key] for r in rounds["B"])
        ratio = f"{mb / ma:.3f}" if ma else "–"
        lines.append(f"| {name} | {fmt.format(ma)} | {fmt.format(mb)} | {ratio} |")
    lines.append("")
    lines.append(f"Medians of {len(rounds['A'])} interleaved rounds; every round:")
    lines.append("")
    shown = FIGURES[:3] + (LIMITED_FIGURES[:1] if "rps_limited" in rounds["A"][0] else ()) + first_token
    lines.append("| round | " + " | ".join(f"A {name} | B {name}" for _, name, _ in shown) + " |")
    lines.append("|---|" + "---|" * 2 * len(shown))
    for i, (ra, rb) in enumerate(zip(rounds["A"], rounds["B"], strict=True)):
        cells = [fmt.format(r[key]) for key, _, fmt in shown for r in (ra, rb)]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--keys", action="store_true", help="also c=64 over 50 keys (MANY_KEYS)")
    parser.add_argument("--limited", action="store_true", help="also c=64 on the rate-limited key")
    parser.add_argument("--prompt", action="store_true", help="also c=64 with a 4 KB prompt (chat_prompt)")
    parser.add_argument("--pg", action="store_true", help="both on PostgreSQL + Redis, as gateway-pg")
    parser.add_argument("--first-token", action="store_true", help="also the paced streams' first token")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    tree, sha = base_tree(args.base)
    dirty = " (uncommitted changes)" if git("status", "--porcelain", "--", "python", "rust") else ""
    labels = (sha[:12], git("rev-parse", "--short=12", "HEAD") + dirty)
    rounds: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        (work / "a").mkdir()
        (work / "b").mkdir()
        sim = stack.enter_context(servers.simulator(work, CLIENT_CPU))
        serve = partial(servers.gateway_pg, services_cpu=CLIENT_CPU) if args.pg else servers.gateway
        with python_path(tree / "python"):
            a = stack.enter_context(serve(sim, work / "a", SERVER_CPU))
        with python_path(ROOT / "python"):
            b = stack.enter_context(serve(sim, work / "b", SERVER_CPU))
        for target in (a, b):  # warm: connections, caches, the tokenizer
            one_round(target, 1.0)
        straight = servers.floor(sim)
        for i in range(args.rounds):
            order = (("A", a), ("B", b)) if i % 2 == 0 else (("B", b), ("A", a))
            floor = first_token_ms(straight) if args.first_token else 0.0
            for name, target in order:
                figures = one_round(target, args.seconds, args.keys, args.limited, args.prompt)
                if args.first_token:
                    figures["first_token"] = first_token_ms(target) - floor
                rounds[name].append(figures)
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    text = table(labels, rounds)
    print(text)
    if args.out is not None:
        args.out.write_text(f"# A/B: {labels[0]} against {labels[1]}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
