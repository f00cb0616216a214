"""`within(seconds)`: asyncio.timeout's behaviour for the calls on a request's path, at a fraction of
its cost.

asyncio.timeout is a state machine written in Python (its object, an enum of states, the task's
cancelling count, a reschedule): about 5 us a use in a loaded worker. Every model request waits for
its body and for its upstream under such a deadline. This is the same contract in a plain context
manager (`with`, not `async with`: entering and leaving it awaits nothing): the task is cancelled
when the time is up, and leaving turns that cancellation into TimeoutError, unless something else
cancelled the task too (the client leaving, the server stopping), which then stands.

Nor does each use make a timer of its own: on uvloop a timer made and cancelled (a libuv handle
opened, stopped and closed) costs more instructions than the rest of the block's bookkeeping
(benches/instructions.py). The deadlines of one length in one loop end in the order they began, so
they share one timer (`_Deadlines`), armed for the earliest; a block that ends in time only leaves
that group, and the timer, when it fires for a block already gone, moves on to the next one.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType


class _Deadlines:
    """The running deadlines of one length in one loop, in the order they end (begun later, ending
    later: one length, and the loop's clock never goes back), under one timer."""

    __slots__ = ("_loop", "_running", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._running: dict[within, float] = {}  # insertion order is the order they end
        self._timer: asyncio.TimerHandle | None = None

    def add(self, block: within, due: float) -> None:
        self._running[block] = due
        if self._timer is None:
            self._timer = self._loop.call_at(due, self._fire)

    def idle(self) -> bool:
        return not self._running

    def remove(self, block: within) -> None:
        # The timer stays: when it fires for a block already gone, it waits for the next one.
        self._running.pop(block, None)

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        running = self._running
        while running:
            block, due = next(iter(running.items()))
            if due > now:
                self._timer = self._loop.call_at(due, self._fire)
                return
            del running[block]
            block.expire()


# The deadline groups a thread keeps before it drops those with no block running.
MAX_IDLE_GROUPS = 64


class _ThreadDeadlines(threading.local):
    """The deadline groups of the loop this thread runs (a thread runs one loop at a time; a block
    keeps its own group, so one begun on an earlier loop still ends on it)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.groups: dict[float, _Deadlines] = {}

    def group(self, loop: asyncio.AbstractEventLoop, seconds: float) -> _Deadlines:
        if loop is not self.loop:
            self.loop, self.groups = loop, {}
        found = self.groups.get(seconds)
        if found is None:
            if len(self.groups) >= MAX_IDLE_GROUPS:
                # Lengths come from settings, so there are a few; a caller passing ever new ones
                # (a remaining budget) must not grow this for ever: groups with no block go.
                self.groups = {length: group for length, group in self.groups.items() if not group.idle()}
            found = self.groups[seconds] = _Deadlines(loop)
        return found


_deadlines = _ThreadDeadlines()


def expire_all(seconds: float) -> int:
    """End now every block of this length running on this thread's loop (a draining worker's last
    moment: the synchronous window's blocks are its plain requests' waits); how many."""
    loop = asyncio.get_running_loop()
    group = _deadlines.group(loop, seconds)
    running = list(group._running)
    for block in running:
        group.remove(block)
        block.expire()
    return len(running)


class within:
    """Raise TimeoutError from the block if it runs longer than `seconds`."""

    __slots__ = ("_cancelling", "_group", "_seconds", "_task", "expired")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self.expired = False

    def __enter__(self) -> within:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("within() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        loop = task.get_loop()
        self._group = _deadlines.group(loop, self._seconds)
        self._group.add(self, loop.time() + self._seconds)
        return self

    def expire(self) -> None:
        """The time is up (called by the block's group, or by whoever ends the wait early: a
        worker's drain). Once: a second call would leave a cancellation that exit does not take back."""
        if not self.expired:
            self.expired = True
            self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._group.remove(self)
        # As asyncio.timeout: our own cancel is taken back; the block's CancelledError is ours to
        # turn into TimeoutError only when nobody else asked for a cancellation meanwhile.
        if self.expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
