"""`make bench-instructions`: the instructions one chat request costs a server, counted by valgrind.

Time on this machine moves by ±25 % between windows of a few seconds, so a change of a few percent
in the CPU a request costs cannot be seen in requests per second, even in interleaved rounds
(benches/ab.py). Instructions can: callgrind counts every instruction a process runs in user space,
the same count for the same code and the same requests whatever else the machine does (repeat runs
agree within ~0.5 % on the event loop's thread). What it leaves out is the kernel's side (system
calls, context switches) and the cost of cache misses: a change that saves instructions but adds a
system call must still be timed.

Each path (the gateway on its embedded store; gateway-pg, the same gateway on PostgreSQL + Redis,
skipped when they do not answer; and the stack floor: the same serving stack with no feature) runs
on one Granian worker under `valgrind --tool=callgrind`, with the simulator (and PostgreSQL and
Redis) outside valgrind. After a warm-up, counting starts (callgrind_control), N chat requests are sent one after
another on one kept-alive connection, and the counts are read per thread of the worker. Sequential
requests make the SQLite writer commit almost every settlement alone (at c = 64 it commits them in
groups), so its thread's figure is a c = 1 figure; the event loop's is the same at any concurrency.

Writes benches/results/instructions.md. A run takes about two minutes (the servers start ~30x slower
under valgrind). Compare two commits by running it at each: the figures are meant to be compared
across runs.

Usage: python benches/instructions.py [--requests 1000] [--paths gateway,gateway-pg,stack]
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load
import procstat
import servers

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benches" / "results"
SERVER_CPU = "0"
CLIENT_CPU = "1"
WARM_REQUESTS = 100
PATHS = ("gateway", "gateway-pg", "stack")

Start = Callable[[str, Path, str, servers.Launch], AbstractContextManager[servers.Target]]
STARTS: dict[str, Start] = {
    "gateway": lambda sim, work, cpu, launch: servers.gateway(sim, work, cpu, launch=launch),
    # PostgreSQL and Redis are not counted (they run outside valgrind): what is, is the worker's
    # side of each (asyncpg's and the Redis client's protocol work, on its event loop).
    "gateway-pg": lambda sim, work, cpu, launch: servers.gateway_pg(sim, work, cpu, launch=launch),
    "stack": servers.stack_floor,
}


def callgrind(out_dir: Path) -> servers.Launch:
    """valgrind counting every thread of the server and its forked worker, each in its own file,
    nothing counted until callgrind_control turns it on (start-up runs uninstrumented, faster)."""
    return servers.Launch(
        wrapper=(
            "valgrind",
            "--tool=callgrind",
            "--trace-children=yes",
            "--separate-threads=yes",
            "--instr-atstart=no",
            f"--callgrind-out-file={out_dir}/callgrind.%p",
        ),
        start_seconds=600,
    )


class Client:
    """Chat requests one after another on one kept-alive connection."""

    def __init__(self, target: servers.Target) -> None:
        url = urlsplit(target.url("chat"))
        self._path = url.path
        self._conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=120)
        self._body = load.body("chat", target.model["chat"])
        self._headers = target.headers

    def send(self, count: int) -> None:
        for _ in range(count):
            self._conn.request("POST", self._path, body=self._body, headers=self._headers)
            answer = self._conn.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"chat answered {answer.status}")

    def close(self) -> None:
        self._conn.close()


def object_costs(dump: Path) -> Counter[str]:
    """A callgrind dump's instructions by the object file (binary or library) that ran them: each
    cost line adds to the object of its function; a call's inclusive cost (the line after
    `calls=`) is skipped, so every instruction counts once."""
    costs: Counter[str] = Counter()
    names: dict[str, str] = {}
    current = "?"
    skip_next = False
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("ob=", "cob=")):
            # Names are compressed: "(3) /path" the first time, "(3)" after, in ob= and cob= alike.
            match = re.match(r"c?ob=(\(\d+\))?\s*(.*)", line)
            ref, name = (match[1], match[2]) if match else (None, "")
            if ref and name:
                names[ref] = name
            if line.startswith("ob="):
                current = names.get(ref, name) if ref else name
        elif line.startswith("calls="):
            skip_next = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip_next:
                skip_next = False
                continue
            fields = line.split()
            if len(fields) > 1:
                costs[Path(current).name or "?"] += int(fields[1])
    return costs


def thread_of(dump: Path) -> int:
    match = re.search(r"-(\d+)$", dump.name)
    return int(match[1]) if match else 1


def label(thread: int, costs: Counter[str]) -> str:
    """Thread 1 is the worker's main thread (the event loop); another is named by what it ran most."""
    if thread == 1:
        return "event loop (main thread)"
    top = costs.most_common(1)[0][0] if costs else "?"
    if top.startswith("libsqlite3"):
        return "SQLite writer"
    if "_granian" in top:
        return "Granian runtime"
    return f"thread {thread} (mostly {top})"


def measure(path: str, requests: int) -> list[tuple[str, float, Counter[str]]]:
    """Instructions per request of each of the path's worker threads: (label, per request, by object)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dumps = work / "dumps"
        dumps.mkdir()
        with (
            servers.simulator(work, CLIENT_CPU) as sim,
            STARTS[path](sim, work, SERVER_CPU, callgrind(dumps)) as target,
        ):
            assert target.pid is not None
            client = Client(target)
            client.send(WARM_REQUESTS)
            worker = max(procstat.tree(target.pid))  # Granian's worker, forked by its supervisor
            control = ["callgrind_control"]
            subprocess.run([*control, "--instr=on", str(worker)], check=True, capture_output=True)
            client.send(requests)
            client.close()
            time.sleep(0.5)  # the writer's linger ends: this request's settlement is counted
            subprocess.run([*control, "--dump", str(worker)], check=True, capture_output=True)
            for _ in range(100):  # the dump is written by the worker, after the command returns
                if list(_dumps_of(dumps, worker)):
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            found = sorted(_dumps_of(dumps, worker), key=thread_of)
        rows = []
        for dump in found:
            costs = object_costs(dump)
            total = sum(costs.values())
            if total:
                rows.append((label(thread_of(dump), costs), total / requests, costs))
        return rows


def _dumps_of(dumps: Path, worker: int) -> Iterator[Path]:
    """The dump callgrind_control asked for: callgrind.PID.1 (or .1-THREAD, one per thread)."""
    return dumps.glob(f"callgrind.{worker}.1*")


def report(results: dict[str, list[tuple[str, float, Counter[str]]]], requests: int, version: str) -> str:
    lines = [
        f"# Instructions per chat request ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {version})",
        "",
        f"callgrind (benches/instructions.py): {requests:,} non-streamed chat requests one after another,",
        "after a warm-up, on one worker; user-space instructions only (no kernel, no cache misses).",
        "",
        "| path | thread | instructions per request |",
        "|---|---|---|",
    ]
    for path, rows in results.items():
        for name, per_request, _ in rows:
            lines.append(f"| {path} | {name} | {per_request:,.0f} |")
        lines.append(f"| {path} | all | {sum(r[1] for r in rows):,.0f} |")
    loops = {path: rows[0][1] for path, rows in results.items() if rows}
    if "gateway" in loops and "stack" in loops:
        lines += [
            "",
            f"The features cost the event loop {loops['gateway'] - loops['stack']:,.0f} instructions a request"
            f" over the stack floor's {loops['stack']:,.0f} ({loops['gateway'] / loops['stack']:.2f}x).",
        ]
    if "gateway" in loops and "gateway-pg" in loops:
        lines += [
            "",
            f"On PostgreSQL + Redis the event loop runs {loops['gateway-pg'] - loops['gateway']:+,.0f}"
            f" instructions a request against the embedded store's ({loops['gateway-pg'] / loops['gateway']:.2f}x);"
            " the embedded store's SQLite writer is a thread of its own, where the pg store's writes run on the loop.",
        ]
    for path, rows in results.items():
        if not rows:
            continue
        name, per_request, costs = rows[0]
        lines += [
            "",
            f"{path}, {name}, by object file:",
            "",
            "| object | per request | share |",
            "|---|---|---|",
        ]
        total = sum(costs.values())
        for obj, cost in costs.most_common(8):
            lines.append(f"| {obj} | {cost / requests:,.0f} | {cost / total:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in STARTS]
    if unknown:
        parser.error(f"unknown paths {unknown}; known: {', '.join(STARTS)}")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (make bench-tools installs it)", file=sys.stderr)
        return 2
    results = {}
    for path in paths:
        print(f"{path}: under callgrind ...", flush=True)
        try:
            results[path] = measure(path, args.requests)
        except servers.Unavailable as exc:  # gateway-pg without PostgreSQL or Redis
            print(f"  {path} skipped: {exc}", flush=True)
    text = report(results, args.requests, servers._git_version())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "instructions.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
