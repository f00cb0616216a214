"""The gateway's logs: one JSON object per line (or plain text on a terminal), with levels.

`[logs] format = "auto"` writes JSON lines unless stderr is a terminal; "json" and "text" force
one. Request lines (`gateway.access`, one per request, `[logs] access`) carry the request's ids and
figures as fields; other records carry their message, and their traceback when they have one. Never a
secret: keys are named by id, bodies are not logged here (the request log keeps them)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import sys
from typing import Final, Literal

from ..log_format import formatter, uses_json

LineFormat = Literal["json", "text"]
# Request lines are written together at most this long after the first of them (one write(2) for
# many requests instead of one each through the logging module: a tenth of the gateway's
# throughput at c=64). A process killed with -9 loses at most this much of them.
FLUSH_SECONDS: Final = 0.05


# The handler configure() gave the root logger: the libraries' warnings and errors.
_libraries: logging.Handler | None = None


def configure(format_: str = "auto", level: str = "info", access: bool = True) -> None:
    """Send the `gateway` loggers to stderr in the chosen format (once per process; again replaces
    it), and the warnings and errors of the libraries' own loggers too: without a handler of the
    root's they went out as bare lines in the JSON stream (fuzz review: python-multipart's word on
    a malformed form)."""
    global _libraries  # noqa: PLW0603 (one handler per process, replaced by a second call)
    use_json = uses_json(format_)
    lines = formatter(format_)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(lines)
    root = logging.getLogger("gateway")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False  # Granian's own handler would print it a second time
    libraries = logging.StreamHandler(sys.stderr)
    libraries.setFormatter(lines)
    libraries.setLevel(logging.WARNING)
    if _libraries is not None:
        logging.getLogger().removeHandler(_libraries)
    logging.getLogger().addHandler(libraries)
    _libraries = libraries
    ACCESS.flush()
    ACCESS.format = ("json" if use_json else "text") if access else None


class AccessLines:
    """The request lines (gateway.access): formatted by the Rust core (RequestTally.model_request,
    answer_line) and written to stderr here, in batches. Other records go through the logging
    module as usual."""

    def __init__(self, line_format: LineFormat | None) -> None:
        self.format = line_format  # None: no request lines
        self._pending: list[bytes] = []
        self._flushing = False
        atexit.register(self.flush)

    def add(self, line: bytes) -> None:
        """A request's line, newline included: written with the others within FLUSH_SECONDS."""
        self._pending.append(line)
        if not self._flushing:
            self._flushing = True
            try:
                asyncio.get_running_loop().call_later(FLUSH_SECONDS, self.flush)
            except RuntimeError:  # no event loop (a tool, a test): at once
                self.flush()

    def flush(self) -> None:
        self._flushing = False
        if not self._pending:
            return
        data, self._pending = memoryview(b"".join(self._pending)), []
        # stderr closed: nowhere to write, and never the request's failure.
        with contextlib.suppress(OSError, ValueError):
            while data:
                data = data[os.write(sys.stderr.fileno(), data) :]


ACCESS = AccessLines("json")
