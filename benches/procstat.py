"""CPU time and peak memory of a process and all its descendants, read from /proc."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """pid and every descendant."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def cpu_seconds(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / _TICKS


def _status_mb(pid: int, field: str) -> dict[int, float]:
    """Each process of the tree's `field` of /proc/PID/status (a size in kB), in MB."""
    found = {}
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    found[p] = int(line.split()[1]) / 1024
        except OSError:
            continue
    return found


def peak_rss_mb(pid: int) -> float:
    """Sum over the tree of each process's peak resident set (VmHWM)."""
    return sum(_status_mb(pid, "VmHWM").values())


def rss_mb(pid: int) -> dict[int, float]:
    """Each process of the tree's resident set now (VmRSS), in MB."""
    return _status_mb(pid, "VmRSS")
