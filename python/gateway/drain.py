"""Graceful shutdown of a worker process.

Granian's supervisor answers SIGTERM (or SIGINT) by sending SIGTERM to every worker. Granian then
stops accepting connections, closes idle keep-alive ones and waits for those under way, streams
included, however long they run. The gateway adds the deadline: `[server] drain_seconds` after
the signal, every stream still running is ended with the spec's error chunk (code
service_unavailable), billed for what it delivered, as any stream that ends early is. Plain
requests keep running until the supervisor's kill timeout (drain_seconds + KILL_GRACE_SECONDS,
gateway.supervisor); holds are released and leases returned when the worker's lifespan ends.

The worker learns of the signal through a handler chained before the one already installed (a
loop.add_signal_handler would replace Granian's own and the worker would never stop).

Before SIGTERM the supervisor gives notice with SIGUSR1 (`[server] drain_notice_seconds` ahead,
gateway.supervisor): the worker serves on, but every answer carries `connection: close` and /ready
says 503. A client with a keep-alive connection learns from an answer that the connection ends,
instead of sending its next request into a connection the server is closing, which it would see
as a reset; a load balancer polling /ready stops sending new ones. SIGTERM itself cannot wait:
Granian's handler reaches the worker through the event loop's wakeup descriptor, not through a
handler that could be deferred.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, Final

from .deadline import within

log = logging.getLogger("gateway.drain")

# Past the drain deadline, what a plain request still has before its worker is killed.
KILL_GRACE_SECONDS: Final = 10.0
# ... of which the last moments are for the answers of those still running then (503, logged),
# ended this long before the kill.
FINAL_MARGIN_SECONDS: Final = 2.0
# Sent by the supervisor to a worker ahead of SIGTERM (ignored by a worker still starting: the
# supervisor ignores it and its children inherit that until Drain.install).
NOTICE_SIGNAL: Final = signal.SIGUSR1
# Under `gateway serve`, the supervisor's directory for this start (gateway.supervisor). A worker
# that has started serving leaves a mark there: the supervisor tells a worker that died in service
# (started again, however often) from one that never started (a start-up failure).
RUN_DIR_ENV: Final = "GATEWAY_RUN_DIR"
# ... and the supervisor's process id: a worker whose supervisor has gone (kill -9) stops too.
SUPERVISOR_PID_ENV: Final = "GATEWAY_SUPERVISOR_PID"
_PR_SET_PDEATHSIG: Final = 1  # prctl(2)
CUT_MESSAGE: Final = "The gateway is shutting down: the stream was ended at its drain deadline. Retry."


class Drain:
    """One process's shutdown: `started` once the signal came, `cut` once the deadline passed."""

    def __init__(self, deadline_seconds: float) -> None:
        self.deadline_seconds = deadline_seconds
        # Answers end their connection (`connection: close`) once notice is given or the drain began.
        self.closing = False
        self.started = False
        self.cut = False
        self._streams: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bounded = False  # the kernel's alarm is set (_bound_the_stop)
        self.cut_at: float | None = None  # the loop's time of the deadline, once the drain began
        # Waits for a request's body under way (routes/common.read_body), ended at the deadline:
        # such a request is answered 503 rather than killed with its worker.
        self.waits: set[within] = set()
        # Run just before the kill: ends what still waits (the plain requests' upstream calls).
        self.finals: list[Callable[[], object]] = []

    def install(self) -> None:
        """Chain a handler for SIGTERM and SIGINT before the ones in place (from the lifespan's
        start, in the event loop's thread: the main thread of a Granian worker)."""
        self._loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)

            def handler(number: int, frame: Any, previous: Any = previous) -> None:
                self._bound_the_stop()
                if self._loop is not None and not self._loop.is_closed():
                    self._loop.call_soon_threadsafe(self.begin)
                if callable(previous):
                    previous(number, frame)
                elif previous != signal.SIG_IGN:  # the default: die of it, as without this handler
                    signal.signal(number, signal.SIG_DFL)
                    os.kill(os.getpid(), number)

            with contextlib.suppress(ValueError):  # not the main thread (an embedded app): no drain
                signal.signal(signum, handler)
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            self._loop.add_signal_handler(NOTICE_SIGNAL, self.notice)

    def _bound_the_stop(self) -> None:
        """From the stop signal on, the kernel ends this process (SIGALRM, its default action) if it
        is still there drain_seconds + KILL_GRACE_SECONDS later: the bound the supervisor enforces,
        kept when there is no supervisor (an orphan: end_with_supervisor) and when the process is
        stuck where no Python runs (as Granian's worker was in its own signal handling at a third
        stop signal, until gateway.supervisor made every signal after the first a no-op)."""
        if not self._bounded:
            self._bounded = True
            signal.alarm(math.ceil(self.deadline_seconds + KILL_GRACE_SECONDS) + 1)

    def notice(self) -> None:
        """The drain is coming: end every connection after its current answer."""
        if not self.closing:
            self.closing = True
            log.info("notice of shutdown: answers close their connections from now on")

    def begin(self) -> None:
        if self.started:
            return
        self.started = True
        self.closing = True
        log.info(
            "shutting down: %d streams under way, ended in %g s if still running",
            len(self._streams),
            self.deadline_seconds,
        )
        loop = asyncio.get_running_loop()
        self.cut_at = loop.time() + self.deadline_seconds
        loop.call_later(self.deadline_seconds, self._end_streams)

    def seconds_left(self) -> float:
        """Until the deadline, once the drain began (0 past it; in the loop's thread)."""
        if self.cut_at is None:
            return math.inf
        return max(self.cut_at - asyncio.get_running_loop().time(), 0.0)

    def _end_streams(self) -> None:
        self.cut = True
        if self._streams or self.waits:
            log.warning(
                "drain deadline: ending %d streams, and %d requests still waiting (for their body or"
                " their model's first token)",
                len(self._streams),
                len(self.waits),
            )
        for stop in list(self._streams.values()):
            stop()
        for wait in list(self.waits):
            wait.expire()
        asyncio.get_running_loop().call_later(KILL_GRACE_SECONDS - FINAL_MARGIN_SECONDS, self._end_the_rest)

    def _end_the_rest(self) -> None:
        """Moments before the kill: a plain request still running is answered (503, logged, its hold
        released) rather than cut off with its worker."""
        for final in self.finals:
            final()

    def follow(self, stop: Callable[[], None]) -> Callable[[], None]:
        """A stream under way: `stop()` ends it at the deadline (closing its upstream). Returns the
        function to call when it has ended by itself."""
        if self.cut:
            stop()
            return lambda: None
        self._next += 1
        token = self._next
        self._streams[token] = stop

        def unfollow() -> None:
            self._streams.pop(token, None)

        return unfollow


def serving_mark(run_dir: str, pid: int) -> str:
    """The file that says worker `pid` has started serving."""
    return os.path.join(run_dir, f"serving.{pid}")


def mark_serving() -> None:
    """This worker has started: its lifespan's start-up is done (a no-op outside `gateway serve`)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir:
        with contextlib.suppress(OSError):
            open(serving_mark(run_dir, os.getpid()), "wb").close()


def end_with_supervisor() -> None:
    """Under `gateway serve` on Linux: this worker gets SIGTERM, and drains, when its supervisor
    dies, even of kill -9 (prctl PR_SET_PDEATHSIG), rather than serving on as an orphan that
    nothing reloads or stops, on the port the next `gateway serve` takes too. Workers are forked by
    the supervisor's main thread, the thread whose end the signal follows. A no-op elsewhere."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if not supervisor or not sys.platform.startswith("linux"):
        return
    # The supervisor's own SIGTERM handler came with the fork and would swallow the signal (it only
    # flags the supervisor's copy of itself) until Granian sets the worker's: until then SIGTERM
    # ends this worker, which has nothing to drain yet.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: an orphan is then stopped by hand
        return
    if str(os.getppid()) != supervisor:  # it died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)
