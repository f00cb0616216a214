"""Translation between the two text shapes: chat completions (Shape A) and Anthropic messages
(Shape B), so that either endpoint serves models of both types (docs/translation.md).

Pure functions for request and answer bodies, and two stream translators that are StreamRewriters
(routes/streaming.py). When an endpoint's shape is the model's own, none of this runs.
"""

from .answers import chat_completion_from_message, message_from_chat_completion
from .chat_request import chat_request_from_messages
from .chat_stream import ChatStreamFromMessages
from .messages_request import messages_request_from_chat
from .messages_stream import MessagesStreamFromChat
from .output_text import chat_output_text, message_output_text, response_item_text, response_output_text

__all__ = [
    "ChatStreamFromMessages",
    "MessagesStreamFromChat",
    "chat_completion_from_message",
    "chat_output_text",
    "chat_request_from_messages",
    "message_from_chat_completion",
    "message_output_text",
    "messages_request_from_chat",
    "response_item_text",
    "response_output_text",
]
