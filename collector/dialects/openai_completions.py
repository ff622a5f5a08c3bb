"""OpenAI completions (`POST /v1/completions`), as vLLM serves them.

Each choice carries its own `prompt_token_ids` (a request may hold several
prompts; choice index = prompt index * n + sample index) and `token_ids` when
the request set `return_token_ids`; streamed chunks carry `text` deltas, the
delta `token_ids`, and `prompt_token_ids` on a choice's first chunk.
"""

from __future__ import annotations

from collector.dialects.base import ChoicesDialect


class OpenAICompletions(ChoicesDialect):
    name = "openai-completions"
    paths = frozenset({"/v1/completions"})
    response_objects = frozenset({"text_completion"})
    prompt_key = "prompt"
    delta_key = None
    delta_text_key = "text"

    def _choice_text(self, choice: dict[str, object]) -> str:
        text = choice.get("text")
        return text if isinstance(text, str) else ""
