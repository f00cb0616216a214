"""Tool calls for the simulator: whether a request gets one, of which tool, with which arguments.

A request gets a tool call when it offers tools and either its tool_choice forces one (OpenAI
`"required"` or `{"type": "function", "function": {"name": ...}}`; Anthropic `{"type": "any"}` or
`{"type": "tool", "name": ...}`) or its last message carries the `[sim tool]` marker (the first tool
is called). A tool_choice of "none" wins over the marker. The arguments are built from the tool's
JSON schema, deterministically: strings a word (an enum's first value), numbers 1, booleans true,
anything else null.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from .words import WORDS

# Characters of the arguments' JSON per streamed fragment: several fragments for any real schema.
FRAGMENT_CHARS = 8


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return orjson.dumps(self.arguments).decode()

    def fragments(self) -> list[str]:
        """The arguments' JSON in the pieces a streaming upstream sends."""
        text = self.arguments_json
        return [text[i : i + FRAGMENT_CHARS] for i in range(0, len(text), FRAGMENT_CHARS)]

    def chat_tool_call(self) -> dict[str, Any]:
        """The call in a chat completion's message.tool_calls."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json},
        }

    def chat_deltas(self) -> list[dict[str, Any]]:
        """The call as a chat stream sends it: id, name and empty arguments first, then the arguments."""
        head = {
            "index": 0,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": ""},
        }
        return [{"tool_calls": [head]}] + [
            {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} for piece in self.fragments()
        ]

    def tool_use_block(self) -> dict[str, Any]:
        """The call as a message's tool_use content block."""
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": self.arguments}


def openai_tool_call(req: dict[str, Any], marked: bool, seed: bytes) -> ToolCall | None:
    """The call a chat completions request gets, if any (`marked`: the `[sim tool]` marker)."""
    tools = req.get("tools")
    functions = [
        t["function"]
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, dict)
        and t.get("type") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]
    choice = req.get("tool_choice")
    if not functions or choice == "none":
        return None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        chosen = [f for f in functions if f["name"] == choice["function"].get("name")]
    elif choice == "required" or marked:
        chosen = functions[:1]
    else:
        return None
    if not chosen:
        return None
    return ToolCall("call_" + _digest(seed), chosen[0]["name"], arguments_for(chosen[0].get("parameters")))


def anthropic_tool_call(req: dict[str, Any], marked: bool, seed: bytes) -> ToolCall | None:
    """The call a messages request gets, if any (server tools, which carry a type, are not called)."""
    tools = req.get("tools")
    client_tools = [
        t
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, dict) and t.get("type", "custom") == "custom" and isinstance(t.get("name"), str)
    ]
    choice = req.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not client_tools or kind == "none":
        return None
    if kind == "tool" and isinstance(choice, dict):
        chosen = [t for t in client_tools if t["name"] == choice.get("name")]
    elif kind == "any" or marked:
        chosen = client_tools[:1]
    else:
        return None
    if not chosen:
        return None
    return ToolCall(
        "toolu_sim" + _digest(seed), chosen[0]["name"], arguments_for(chosen[0].get("input_schema"))
    )


def responses_tool_call(req: dict[str, Any], marked: bool, seed: bytes) -> ToolCall | None:
    """The call a Responses API request gets, if any: its function tools are flat
    ({"type": "function", "name", "parameters"}), as is a forcing tool_choice; hosted tools are not
    called here."""
    tools = req.get("tools")
    functions = [
        t
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)
    ]
    choice = req.get("tool_choice")
    if not functions or choice == "none":
        return None
    if isinstance(choice, dict) and choice.get("type") == "function":
        chosen = [f for f in functions if f["name"] == choice.get("name")]
    elif choice == "required" or marked:
        chosen = functions[:1]
    else:
        return None
    if not chosen:
        return None
    return ToolCall("call_" + _digest(seed), chosen[0]["name"], arguments_for(chosen[0].get("parameters")))


def arguments_for(schema: Any) -> dict[str, Any]:
    """One value per property of an object schema, by the property's type."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return {}
    return {name: _value(name, spec) for name, spec in properties.items()}


def _value(name: str, spec: Any) -> Any:
    if not isinstance(spec, dict):
        return None
    kind = spec.get("type")
    if isinstance(kind, list):  # ["string", "null"] and the like: the first real type
        kind = next((k for k in kind if k != "null"), None)
    if kind == "string":
        enum = spec.get("enum")
        if isinstance(enum, list) and enum:
            return enum[0]
        return WORDS[int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest()) % len(WORDS)]
    if kind in ("number", "integer"):
        return 1
    if kind == "boolean":
        return True
    return None


def _digest(seed: bytes) -> str:
    return hashlib.blake2b(seed, digest_size=12).hexdigest()
