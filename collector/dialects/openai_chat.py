"""OpenAI chat completions (`POST /v1/chat/completions`), as vLLM serves them.

Non-streamed: `choices[i].message.content`, per-choice `token_ids` and the
top-level `prompt_token_ids` when the request set `return_token_ids`.
Streamed: the first chunk of each choice carries the role and (with
`return_token_ids`) the top-level `prompt_token_ids`; later chunks carry
`delta.content` and the delta `token_ids`; the finishing chunk has
`finish_reason`; an optional last chunk has only `usage`; `[DONE]` ends it.
Tool calls and reasoning, in both, are read by `chat_extras`.
"""

from __future__ import annotations

from collector.dialects.base import ChoiceExtras, ChoicesDialect
from collector.dialects.chat_extras import ChatExtras
from collector.dialects.tool_call_budget import ToolCallBudget


class OpenAIChat(ChoicesDialect):
    name = "openai-chat"
    paths = frozenset({"/v1/chat/completions"})
    response_objects = frozenset({"chat.completion", "chat.completion.chunk"})
    prompt_key = "messages"
    delta_key = "delta"
    delta_text_key = "content"

    def _extras(self, budget: ToolCallBudget, problems: list[str]) -> ChoiceExtras:
        return ChatExtras(budget, problems)

    def _choice_text(self, choice: dict[str, object]) -> str:
        message = choice.get("message")
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, str):
                return content
        return ""
