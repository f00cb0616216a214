"""Translation between the text shapes: chat completions (Shape A) and Anthropic messages (Shape B)
both ways, so that either endpoint serves models of both types; and responses (Shape A) to chat, so
that /v1/responses serves chat models too (docs/translation.md).

Pure functions for request and answer bodies, and two stream translators that are StreamRewriters
(routes/streaming.py). When an endpoint's shape is the model's own, none of this runs.
"""

from .answers import chat_completion_from_message, message_from_chat_completion
from .chat_request import chat_request_from_messages
from .chat_stream import ChatStreamFromMessages
from .messages_request import messages_request_from_chat
from .messages_stream import MessagesStreamFromChat
from .output_text import chat_output_text, message_output_text, response_item_text, response_output_text
from .responses_answer import response_from_chat_completion
from .responses_request import chat_request_from_responses
from .responses_stream import ResponsesStreamFromChat

__all__ = [
    "ChatStreamFromMessages",
    "MessagesStreamFromChat",
    "ResponsesStreamFromChat",
    "chat_completion_from_message",
    "chat_output_text",
    "chat_request_from_messages",
    "chat_request_from_responses",
    "message_from_chat_completion",
    "message_output_text",
    "messages_request_from_chat",
    "response_from_chat_completion",
    "response_item_text",
    "response_output_text",
]
