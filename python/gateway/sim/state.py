"""What the simulator keeps between requests, in memory: the log of requests it received (so tests
can see exactly which parameters arrived), stored and background responses, video jobs, and the
tokens it issued."""

from __future__ import annotations

import collections
from typing import Any

from .prompt_cache import PromptCache
from .responses import ResponseStore
from .videos import VideoJobs


class Simulator:
    def __init__(self, history: int = 1000) -> None:
        self.requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=history)
        self.responses = ResponseStore()
        self.videos = VideoJobs()
        self.prompt_cache = PromptCache()  # Anthropic's (sim/prompt_cache.py)
        self.entra_tokens: set[str] = set()  # the bearer tokens Entra ID (sim/azure.py) issued
        self.google_tokens: set[str] = set()  # and Google's token endpoint (sim/vertex.py)

    def record(self, entry: dict[str, Any] | None) -> None:
        """Keep what a request carried (None: it was refused before it was understood). Every entry
        has a path and a body (empty when there is none to show)."""
        if entry is not None:
            entry.setdefault("body", {})
            self.requests.append(entry)
