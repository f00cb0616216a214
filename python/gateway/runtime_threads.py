"""Granian's runtime threads wait for the core instead of taking it from the event loop.

Every request hands work to Granian's Rust runtime thread several times (each `receive()` spawns a
task there; the answer is handed over to be written). Linux gives a thread woken that way the core
at once, ahead of the event loop that woke it (wakeup preemption): where a worker's threads share a
core (one worker a core, as a busy deployment runs, and the benchmark's pinned worker), each
hand-over cost two context switches and the event loop's warm caches. At SCHED_BATCH the runtime
thread is not run on waking; it runs when the event loop waits or its time slice ends, and then
does the work of every request that queued some. Measured (benches/README.md, "2026-11-30, small
hours"): +23 % requests per second at concurrency 64 on one core, concurrency 1 unchanged. Where a
woken thread finds an idle core, it runs there at once, as before.

Two hand-overs a client waits for still go at once, the event loop giving the core up there
(`hand_over_now`): a stream's first token, before the stream journals its progress
(routes/common.py, HeldStream), and the end of an answer when it is the only request under way,
before the request's clean-up (gateway.edge). A yield at every answer's end would give the batching
back.

Best effort: Linux, and only where the policy may be set (a thread may move itself, or a thread of
its process, to SCHED_BATCH without privileges). SCHED_RESET_ON_FORK keeps the threads the runtime
starts later (its pool for blocking work) at the default policy.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Final

log = logging.getLogger("gateway.server")

# Granian's runtime threads are tokio's, named by it.
RUNTIME_THREAD_PREFIX: Final = "tokio-"
# Granian starts its runtime after the app's lifespan start-up: look for its threads this often,
# this many times (they are there at once; a server without them stops looking).
LOOK_EVERY_SECONDS: Final = 0.05
LOOKS: Final = 40
_batched = False  # this process's runtime threads are at SCHED_BATCH


def batch_runtime_threads(tasks: Path = Path("/proc/self/task")) -> int:
    """Set this process's runtime threads to SCHED_BATCH; returns how many were set."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None or not tasks.is_dir():
        return 0
    policy |= getattr(os, "SCHED_RESET_ON_FORK", 0)
    done = 0
    for task in tasks.iterdir():
        try:
            if not (task / "comm").read_text().startswith(RUNTIME_THREAD_PREFIX):
                continue
            os.sched_setscheduler(int(task.name), policy, os.sched_param(0))
        except (OSError, ValueError):  # gone meanwhile, or not allowed here
            continue
        done += 1
    return done


def hand_over_now() -> None:
    """Let the runtime write what was just handed to it before the event loop goes on (a stream's
    first token): the core is given up once, when the runtime would otherwise wait for it."""
    if _batched:
        os.sched_yield()


async def batch_runtime_threads_once_started() -> None:
    """batch_runtime_threads, once Granian's runtime has started (a task of the lifespan)."""
    for _ in range(LOOKS):
        await asyncio.sleep(LOOK_EVERY_SECONDS)
        done = batch_runtime_threads()
        if done:
            global _batched  # noqa: PLW0603 (set once, when the runtime's threads are found)
            _batched = True
            log.debug("%d runtime threads set to SCHED_BATCH", done)
            return
