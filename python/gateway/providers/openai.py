"""OpenAI and every OpenAI-compatible server (vLLM, Ollama, LM Studio and the like)."""

from __future__ import annotations

from typing import Final

from ..config import ChannelConfig
from .base import bearer_headers, no_stream_translation, nothing_to_check, unchanged, unchanged_answer

# Chat-completions parameters an OpenAI-compatible upstream accepts (spec 1.3 default list): every
# body field of openai-python's request type (types/chat/completion_create_params.py), but
# `service_tier`: its priority tier is billed more, which the gateway's one price per model would
# not follow (an operator lists it in a model's supported_params and prices that model for it).
# "model" and "messages" are not parameters: they always go.
CHAT_PARAMS: Final = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
EMBEDDING_PARAMS: Final = frozenset({"dimensions", "encoding_format", "user"})
SPEECH_PARAMS: Final = frozenset({"instructions", "response_format", "speed", "stream_format"})
# Multipart fields (types/audio/transcription_create_params.py); arrays are sent as name[] fields.
TRANSCRIPTION_PARAMS: Final = frozenset(
    {
        "chunking_strategy",
        "include[]",
        "keywords[]",
        "known_speaker_names[]",
        "known_speaker_references[]",
        "language",
        "languages[]",
        "prompt",
        "response_format",
        "temperature",
        "timestamp_granularities[]",
    }
)
# An image model serves two endpoints and has one list: what either accepts. "model", "prompt" and
# the edited images are the request itself; "mask" is a file part of edits. Streamed partial images
# (stream, partial_images) are not offered: the gateway answers with URLs once the images exist.
# GPT image models always answer base64 and refuse `response_format` (400 unknown_parameter), which
# the gateway honours itself; `style` is DALL-E 3's. DALL-E's list lacks the GPT models' own. An
# upstream model of another name (an OpenAI-compatible server) gets both.
GPT_IMAGE_PARAMS: Final = frozenset(
    {
        "background",
        "input_fidelity",
        "mask",
        "moderation",
        "n",
        "output_compression",
        "output_format",
        "quality",
        "safety_identifier",
        "size",
        "user",
    }
)
DALL_E_PARAMS: Final = frozenset({"mask", "n", "quality", "response_format", "size", "style", "user"})
IMAGE_PARAMS: Final = GPT_IMAGE_PARAMS | DALL_E_PARAMS
# Responses API parameters (types/responses/response_create_params.py). "model", "input" and
# "previous_response_id" are the request itself.
# `background` runs the response as a job (gateway.background), polled with GET /v1/responses/{id}.
# Not `conversation`: it names a conversation the upstream keeps under the gateway's one key, which
# the gateway serves none of and cannot scope to an account (security review).
RESPONSES_PARAMS: Final = frozenset(
    {
        "background",
        "context_management",
        "include",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "moderation",
        "parallel_tool_calls",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
    }
)
# Video jobs (Sora): "model", "prompt" and "seconds" are the request itself.
VIDEO_PARAMS: Final = frozenset({"input_reference", "size"})
# Model type -> the parameters an OpenAI-compatible upstream accepts on that type's endpoint.
PARAMS: Final = {
    "chat": CHAT_PARAMS,
    "embedding": EMBEDDING_PARAMS,
    "image": IMAGE_PARAMS,
    "responses": RESPONSES_PARAMS,
    "speech": SPEECH_PARAMS,
    "transcription": TRANSCRIPTION_PARAMS,
    "video": VIDEO_PARAMS,
    "moderation": frozenset(),  # "model" and "input" are the request itself
}
# GPT image models refuse DALL-E's parameters (response_format above all), and DALL-E theirs.
PARAMS_BY_MODEL: Final = {("image", "gpt-image"): GPT_IMAGE_PARAMS, ("image", "dall-e"): DALL_E_PARAMS}
# Model type (or one of its operations, as image_edit) -> the upstream path, relative to the base URL.
PATHS: Final = {
    "chat": "/chat/completions",
    "embedding": "/embeddings",
    "image": "/images/generations",
    "image_edit": "/images/edits",
    "responses": "/responses",
    "speech": "/audio/speech",
    "transcription": "/audio/transcriptions",
    "video": "/videos",
    "moderation": "/moderations",
}


def url(channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
    return channel.base_url + PATHS[model_type]


headers = bearer_headers


# The upstream speaks the model type's own wire format.
encode = unchanged
check = nothing_to_check
decode = unchanged_answer
stream_translator = no_stream_translation
