"""`within(seconds)`: asyncio.timeout's behaviour for the calls on a request's path, at a fraction of
its cost.

asyncio.timeout is a state machine written in Python (its object, an enum of states, the task's
cancelling count, a reschedule): about 5 us a use in a loaded worker, where the timer itself (one
call_at and its cancel on uvloop) is about 0.2 us. Every model request waits for its upstream under
one such deadline. This is the same contract in a plain context manager (`with`, not `async with`:
entering and leaving it awaits nothing): the task is cancelled when the time is up, and leaving
turns that cancellation into TimeoutError, unless something else cancelled the task too (the
client leaving, the server stopping), which then stands.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class within:
    """Raise TimeoutError from the block if it runs longer than `seconds`."""

    __slots__ = ("_cancelling", "_handle", "_seconds", "_task", "expired")

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
        self._handle = loop.call_at(loop.time() + self._seconds, self._expire)
        return self

    def _expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._handle.cancel()
        # As asyncio.timeout: our own cancel is taken back; the block's CancelledError is ours to
        # turn into TimeoutError only when nobody else asked for a cancellation meanwhile.
        if self.expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
