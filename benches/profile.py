"""`make bench-profile`: where one gateway worker's CPU goes under chat load at c=64.

Two views of the same set-up as `make bench` (one worker pinned to the server core, embedded store,
the simulator and wrk on the other core):

- CPU per request of each of the worker's threads, read from /proc (the event loop's thread, the
  SQLite writer, Granian's Rust runtime): exact, where a sampling profiler is not;
- a flame graph of the Python stacks (py-spy record --nonblocking), to see which code that CPU runs.
  py-spy counts a thread that is runnable but waiting for the core as busy, so frames right after a
  hand-over to another thread (the answer's `send`) look heavier than they are.

Writes benches/results/profile.md and benches/results/profile.svg.

Usage: python benches/profile.py [--seconds 15]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load
import procstat
import servers

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benches" / "results"
SERVER_CPU = "0"
CLIENT_CPU = "1"
_TICKS = os.sysconf("SC_CLK_TCK")


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of `pid`: its name and its user + system CPU ticks so far."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        found[int(task.name)] = (name, int(fields[11]) + int(fields[12]))
    return found


def python_thread_names(py_spy: str, pid: int) -> dict[int, str]:
    """The Python names of `pid`'s threads by thread id (py-spy dump: `Thread 123 (idle): "name"`);
    the OS sees every Python thread as `python`."""
    out = subprocess.run(
        [py_spy, "dump", "--pid", str(pid)], check=False, capture_output=True, text=True
    ).stdout
    names = {}
    for line in out.splitlines():
        if line.startswith("Thread ") and '"' in line:
            names[int(line.split()[1])] = line.split('"')[1]
    return names


def worker_of(supervisor: int) -> int:
    """Granian's worker process (the supervisor's only child that serves)."""
    children = [p for p in procstat.tree(supervisor) if p != supervisor]
    if not children:
        raise RuntimeError("the gateway has no worker process")
    return max(children)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    RESULTS.mkdir(parents=True, exist_ok=True)
    svg = RESULTS / "profile.svg"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with servers.simulator(work, CLIENT_CPU) as sim, servers.gateway(sim, work, SERVER_CPU) as gw:
            assert gw.pid is not None
            url, data = gw.url("chat"), load.body("chat", gw.model["chat"])
            load.wrk(url, data, gw.headers, 64, 3, CLIENT_CPU)  # warm
            worker = worker_of(gw.pid)
            names = python_thread_names(py_spy, worker)
            # The per-thread figures first, without the profiler on the core.
            before = thread_ticks(worker)
            measured = load.wrk(url, data, gw.headers, 64, args.seconds, CLIENT_CPU)
            after = thread_ticks(worker)
            # Then the flame graph, under the same load.
            loaded = threading.Thread(
                target=load.wrk, args=(url, data, gw.headers, 64, args.seconds + 4, CLIENT_CPU)
            )
            loaded.start()
            time.sleep(1)
            record = ["record", "--nonblocking", "--threads", "--rate", "250", "--format", "flamegraph"]
            subprocess.run(
                [
                    py_spy,
                    *record,
                    "--duration",
                    str(int(args.seconds)),
                    "--output",
                    str(svg),
                    "--pid",
                    str(worker),
                ],
                check=True,
                capture_output=True,
            )
            loaded.join()
    requests = measured.requests
    rows = []
    for tid, (name, ticks) in sorted(after.items()):
        spent = ticks - before.get(tid, (name, 0))[1]
        if spent:
            label = "event loop (MainThread)" if tid == worker else names.get(tid, name)
            rows.append((label, spent / _TICKS / requests * 1e6))
    total = sum(us for _, us in rows)
    lines = [
        f"# Profile of one gateway worker, chat at c=64 ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"{measured.rps:,.0f} requests/s over {args.seconds:g} s; CPU per request by thread (from /proc):",
        "",
        "| thread | µs per request | share |",
        "|---|---|---|",
        *(f"| {label} | {us:.1f} | {us / total:.0%} |" for label, us in sorted(rows, key=lambda r: -r[1])),
        f"| all | {total:.1f} | |",
        "",
        "`gateway-sqlite-writer` applies settlements and log entries (group commits);",
        "`tokio-rt-worker` is Granian's Rust runtime (sockets, HTTP parsing, the ASGI messages);",
        "a thread named `python` is one of Granian's or uvloop's own.",
        f"The flame graph of the same load: [{svg.name}]({svg.name}) (py-spy --nonblocking).",
        "",
    ]
    (RESULTS / "profile.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
