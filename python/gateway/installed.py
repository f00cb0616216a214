"""What code this gateway runs: a fingerprint of its installed package, taken when `gateway serve`
starts, to tell a reload that the code on disk has changed since (an upgrade installed over it).

Workers are forked from the supervisor, which has already imported part of the package (its
configuration, the Rust core): a worker started after an upgrade would run the old modules the
supervisor holds beside new ones read from disk, or fail to start (upgrade review: `cannot import
name ...`, and the reload said only that the new worker did not start). So a reload is refused
once the code changed, naming the way to load it: the handover (docs/operations.md, "Upgrading").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_SUFFIXES = (".py", ".so", ".sql", ".html", ".css", ".js")

at_start: str | None = None  # set by the supervisor as it starts; inherited by its workers


def fingerprint() -> str:
    """A digest of every source, extension and asset file of the package: its path and content
    (not its time: a reinstall of the same release, or a file rewritten unchanged, is the same
    code; black-box review: a `touch` held every reload). Tens of ms, at start and at a reload."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(_SUFFIXES):
                path = Path(root, name)
                try:
                    content = path.read_bytes()
                except OSError:  # removed while it was listed: an installation under way
                    continue
                digest.update(f"{path.relative_to(PACKAGE)}\0{len(content)}\0".encode())
                digest.update(content)
    return digest.hexdigest()


def note_start() -> None:
    global at_start  # noqa: PLW0603 (once, in the supervisor, before any worker is forked)
    at_start = fingerprint()


def changed_since_start() -> bool:
    """Whether the installed code differs from what the supervisor started with (False when it was
    not started by `gateway serve`)."""
    return at_start is not None and fingerprint() != at_start


# A dead worker is started again all the same (the gateway would otherwise shrink to nothing), and
# the log says what it runs (black-box review: two releases answered, or it crashed in a loop, and
# nothing named the upgrade).
_HAND_OVER = (
    "start the new installation with `gateway serve` on the same port, then stop this one"
    ' (SIGTERM: it drains): docs/operations.md, "Upgrading"'
)
RESPAWNED_UPGRADED = (
    "the gateway's installed code changed since it started, so this worker loads new modules beside"
    " the old ones its supervisor holds: it may fail to start or run a mix of the two. Hand over"
    f" now: {_HAND_OVER}"
)
UPGRADED = (
    "the gateway's installed code changed since it started: a reload cannot load new code (its"
    f" workers are forked from the running supervisor, which holds the old). Hand over: {_HAND_OVER}"
)
