"""The configured models: lookup, access rules and which parameters reach each one (spec 1.3, 5)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from .config import ModelConfig
from .errors import ErrorCode, GatewayError, invalid_request
from .providers import PROVIDERS
from .providers.base import nothing_to_check
from .routing import ChannelBody, json_body
from .store import KeyContext

if TYPE_CHECKING:
    from .context import Call


class _Named(Protocol):
    @property
    def name(self) -> str: ...


Part = TypeVar("Part", bound=_Named)

# Which endpoint serves each model type (spec 4 note 4), for the error that points the caller there.
ENDPOINT_FOR_TYPE: Final[Mapping[str, str]] = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "image": "/v1/images/generations",
    "video": "/v1/videos",
    "embedding": "/v1/embeddings",
    "speech": "/v1/audio/speech",
    "transcription": "/v1/audio/transcriptions",
    "rerank": "/v1/rerank",
    "moderation": "/v1/moderations",
}
# The text shapes the gateway translates (gateway.translate): the endpoint of the key's type also
# serves models of the value's type (chat and messages both ways; responses to chat one way).
TRANSLATED_TYPE: Final[Mapping[str, frozenset[str]]] = {
    "chat": frozenset({"messages"}),
    "messages": frozenset({"chat"}),
    "responses": frozenset({"chat", "messages"}),
}
# Whose model a name without a vendor prefix is, by the endpoint's model type (ModelRegistry.resolve):
# the vendor whose API the endpoint speaks; every other endpoint speaks OpenAI's.
BARE_NAME_VENDOR: Final[Mapping[str, str]] = {"messages": "anthropic", "rerank": "cohere"}
# Fields of a request body that every request of a type carries: always forwarded.
REQUIRED_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "chat": frozenset({"model", "messages"}),
    "embedding": frozenset({"model", "input"}),
    "image": frozenset({"model", "prompt"}),
    "messages": frozenset({"model", "messages", "max_tokens"}),
    "moderation": frozenset({"model", "input"}),
    "rerank": frozenset({"model", "query", "documents"}),
    "responses": frozenset({"model", "input", "previous_response_id"}),
    "speech": frozenset({"model", "input", "voice"}),
    "transcription": frozenset({"model", "file"}),
    "video": frozenset({"model", "prompt", "seconds"}),
}
# Of those, the ones that are the request itself (the model and what it is asked about), not
# parameters: every other field forwarded is listed as a parameter (`forwarded_params`).
CONTENT_FIELDS: Final = frozenset({"model", "messages", "input", "prompt", "query", "documents", "file"})


class ModelRefused(GatewayError):
    """A refusal of a model that exists, knowing which (its request's log entry names it): one
    called on an endpoint that is not its type's (400 invalid_request)."""

    def __init__(self, model: str, message: str, param: str, code: ErrorCode = "invalid_request") -> None:
        super().__init__(code, message, param=param)
        self.model = model


class ModelNotAllowed(ModelRefused):
    """403 model_not_allowed."""

    def __init__(self, model: str, message: str, param: str) -> None:
        super().__init__(model, message, param, "model_not_allowed")


class ModelRegistry:
    def __init__(self, models: Iterable[ModelConfig]) -> None:
        self._by_name = {m.name: m for m in models}
        self._params = {m.name: self._resolve_params(m) for m in self._by_name.values()}
        # What of a request body reaches each model: its parameters and the request itself (made
        # once: a union of a chat model's sets is ~0.25 us, on every request).
        self._upstream_fields = {
            m.name: self._params[m.name] | REQUIRED_FIELDS.get(m.type, frozenset({"model"}))
            for m in self._by_name.values()
        }
        self._forwarded = {name: fields - CONTENT_FIELDS for name, fields in self._upstream_fields.items()}
        # The models whose provider says their requests in another API and checks them first
        # (`check`): a set, so that the others' requests pay one membership test.
        self.checked = frozenset(
            m.name
            for m in self._by_name.values()
            if PROVIDERS[m.channels[0].provider].check is not nothing_to_check
        )

    @staticmethod
    def _resolve_params(model: ModelConfig) -> frozenset[str]:
        if model.supported_params is not None:
            return model.supported_params
        provider = PROVIDERS[model.channels[0].provider]
        upstream = model.channels[0].upstream_model
        for (kind, prefix), own in provider.PARAMS_BY_MODEL.items():
            if kind == model.type and upstream.startswith(prefix):
                return own
        params: frozenset[str] = provider.PARAMS.get(model.type, frozenset())
        return params

    def get(self, name: str) -> ModelConfig | None:
        return self._by_name.get(name)

    def visible(self, ctx: KeyContext) -> list[ModelConfig]:
        allowed = ctx.account.allowed_models
        return [m for m in self._by_name.values() if allowed is None or m.name in allowed]

    def lookup(
        self, name: Any, ctx: KeyContext, param: str = "model", vendor: str | None = None
    ) -> ModelConfig:
        """The model a request names (in `param`), if it exists and this account may use it. With
        `vendor` (the vendor whose API the endpoint speaks), a name without a vendor prefix that is
        no model's own name is that vendor's model of that name, when there is one (`resolve`)."""
        if not isinstance(name, str) or not name:
            raise invalid_request(f"`{param}` is required and must be a string.", param)
        model = self._by_name.get(name)
        if model is None and vendor is not None and "/" not in name:
            model = self._by_name.get(f"{vendor}/{name}")
        if model is None:
            raise GatewayError(
                "model_not_found", f"The model {name!r} does not exist. See GET /v1/models.", param=param
            )
        allowed = ctx.account.allowed_models
        if allowed is not None and model.name not in allowed:
            raise ModelNotAllowed(model.name, f"This key may not use the model {name!r}.", param)
        return model

    def resolve(self, name: Any, ctx: KeyContext, model_type: str) -> ModelConfig:
        """Like lookup, and the model's type must be one this endpoint serves: its own type, or for
        the text endpoints also another text shape's (translated: chat and messages models on
        /v1/responses too).

        A name without a vendor prefix that is no model's own name is the endpoint's vendor's model
        of that name, when there is one: `gpt-4o-mini` is `openai/gpt-4o-mini` on the OpenAI-shaped
        endpoints, `claude-sonnet-4-5` is `anthropic/claude-sonnet-4-5` on /v1/messages. Clients
        that take `vendor/model` names strip their own vendor's prefix before they send a request
        (the openai Agents SDK's `openai/...`, LiteLLM's `openai/...` and `anthropic/...`)."""
        model = self.lookup(name, ctx, "model", BARE_NAME_VENDOR.get(model_type, "openai"))
        if model.type != model_type and model.type not in TRANSLATED_TYPE.get(model_type, ()):
            raise ModelRefused(
                model.name,
                f"The model {name!r} is {_a(model.type)} {model.type} model:"
                f" call {ENDPOINT_FOR_TYPE[model.type]}.",
                "model",
            )
        return model

    def check(self, model: ModelConfig, payload: dict[str, Any]) -> None:
        """A 400 for a request (in the model type's own shape) that the model's provider cannot be
        asked, before it is held; for a model in `checked`."""
        PROVIDERS[model.channels[0].provider].check(model.type, payload)

    def forwarded_params(self, model: ModelConfig) -> frozenset[str]:
        """Exactly the parameters this model receives, the ones its type requires among them
        (`max_tokens` of a message request, a video's `seconds`; spec review: they were left out of
        /model_group/info's list); the rest are dropped (spec 1.3)."""
        return self._forwarded[model.name]

    def received_fields(self, model: ModelConfig) -> frozenset[str]:
        """Every field of a request this model receives: its parameters and the request itself
        (`max_tokens` of a message request, which the shape requires, among them)."""
        return self._upstream_fields[model.name]

    def upstream_body(
        self, model: ModelConfig, payload: dict[str, Any], call: Call | None = None
    ) -> dict[str, Any]:
        """The request as the model's first channel receives it: the request's own fields, the
        supported parameters untouched, everything else dropped, and the upstream's model name.
        With the request's `call`, the names of what was dropped are noted on it (its log entry)."""
        keep = self._upstream_fields[model.name]
        body = {k: v for k, v in payload.items() if k in keep}
        if call is not None and len(body) < len(payload):
            note_dropped(call, payload, keep)
        body["model"] = model.channels[0].upstream_model
        return body

    def channel_body(
        self, model: ModelConfig, payload: dict[str, Any], call: Call | None = None
    ) -> ChannelBody:
        """upstream_body, encoded for whichever channel the request goes to."""
        return json_body(self.upstream_body(model, payload, call))

    def form_parts(
        self, model: ModelConfig, parts: Sequence[Part], required: frozenset[str], call: Call
    ) -> list[Part]:
        """The parts of a multipart request the model receives: the `required` ones (the request
        itself) and its supported parameters; the rest are dropped and noted on the `call`."""
        keep = self._params[model.name] | required
        kept = [p for p in parts if p.name in keep]
        if len(kept) < len(parts):
            note_dropped(call, (p.name for p in parts), keep)
        return kept


def note_dropped(call: Call, names: Iterable[str], keep: frozenset[str]) -> None:
    """Note on the request the names among `names` (its fields or form parts) that are not kept:
    the parameters dropped because the model does not take them (spec 1.3), for its log entry.
    Called only when something was dropped, so a request that drops nothing pays nothing."""
    dropped = {name for name in names if name not in keep}
    if dropped:  # with what an earlier step dropped (a translation's, then the model's own)
        call.dropped_params = tuple(sorted(dropped.union(call.dropped_params)))


def name_as_sent(call: Call, field_of: Mapping[str, str]) -> None:
    """The dropped parameters by the request's own names, where a translation renamed a field that
    the model then did not take (a Messages request's metadata.user_id, sent as `user`)."""
    if call.dropped_params:
        call.dropped_params = tuple(sorted({field_of.get(name, name) for name in call.dropped_params}))


def _a(word: str) -> str:
    """The article before `word` (an image model, a chat model)."""
    return "an" if word[:1] in "aeiou" else "a"
