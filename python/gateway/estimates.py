"""What a request may consume before it runs, as its hold (gateway.funds) and its tokens-per-minute
reservation (gateway.ratelimits) count it, and what those refusals need to say what would fit.

A text request's estimate is a TextEstimate: a Usage that also knows which parameter of its shape
limits its output (max_completion_tokens / max_tokens / max_output_tokens), whether the request set
it, and for how many choices. Every other estimate is a plain Usage.
"""

from __future__ import annotations

from typing import Final

from .frozen import frozen
from .pricing import Usage

# The output a request that sets no output limit reserves against its key's tokens-per-minute
# limit, per choice (never more than the model's longest answer, nor more than the limit leaves
# beside the prompt). Only an admission estimate: the reservation is corrected to the tokens used.
DEFAULT_RESERVED_OUTPUT: Final = 1024

# Where a request of each model type carries its prompt: the `param` of a refusal that names it.
PROMPT_PARAMS: Final = {
    "chat": "messages",
    "messages": "messages",
    "responses": "input",
    "embedding": "input",
    "moderation": "input",
    "speech": "input",
    "rerank": "documents",
    "image": "prompt",
    "video": "prompt",
    "transcription": "file",
}


@frozen
class TextEstimate(Usage):
    """The most a text request may consume (prompt_tokens, and completion_tokens for all its
    choices), and what limits its output."""

    # The output-limit parameters of the request's shape, in the order they are read.
    limits: tuple[str, ...] = ()
    # The one of them the request set (None: its output is limited only by the model).
    limit_set: str | None = None
    choices: int = 1

    @property
    def per_choice(self) -> int:
        return self.completion_tokens // self.choices

    def limit_param(self, forwarded: frozenset[str] = frozenset()) -> str | None:
        """The parameter a client lowers to fit: the one it set; else, of its shape's that the model
        takes (`forwarded`), max_tokens (every chat model knows it) or the first; else the first."""
        if self.limit_set is not None:
            return self.limit_set
        taken = [p for p in self.limits if p in forwarded] or list(self.limits[:1])
        return "max_tokens" if "max_tokens" in taken else next(iter(taken), None)


def prompt_param(model_type: str) -> str | None:
    return PROMPT_PARAMS.get(model_type)
