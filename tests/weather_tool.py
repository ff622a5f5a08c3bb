"""The ``get_weather`` function tool the scripted tiny model (verifierd.tool_model)
calls, as a chat request (``CHAT_TOOL``) and a Responses request (``RESPONSES_TOOL``)
carry it; shared by the in-process and the live pipeline's tool tests."""

from __future__ import annotations

from typing import Any

_FUNCTION: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CHAT_TOOL: dict[str, Any] = {"type": "function", "function": _FUNCTION}
RESPONSES_TOOL: dict[str, Any] = {"type": "function", **_FUNCTION}
