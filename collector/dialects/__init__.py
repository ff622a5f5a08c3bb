"""API dialect extractors: one module per dialect, chosen by request path.

A dialect turns an exchange's request body and response into the record's
`ApiView`. `DIALECTS` maps a dialect name (as used in config) to its extractor.
Targets are matched by the path the server routes them to (`targets.route_path`),
under each configured path prefix: a gateway that serves the API at
`/openai/v1/chat/completions` is the prefix `/openai` (the empty prefix is the
server's own paths). Matching stays one dictionary lookup per request.
"""

from __future__ import annotations

from collections.abc import Iterable

from collector.dialects.anthropic_messages import AnthropicMessages
from collector.dialects.base import Dialect, Extraction
from collector.dialects.openai_chat import OpenAIChat
from collector.dialects.openai_completions import OpenAICompletions
from collector.dialects.openai_responses import OpenAIResponses
from collector.dialects.targets import route_key, route_path

DIALECTS: dict[str, Dialect] = {
    d.name: d for d in (OpenAIChat(), OpenAICompletions(), OpenAIResponses(), AnthropicMessages())
}


class DialectRegistry:
    """The enabled dialects, looked up by request target."""

    def __init__(self, names: Iterable[str], path_prefixes: Iterable[str] = ("",)) -> None:
        self.dialects = [DIALECTS[name] for name in names]
        prefixes = tuple(path_prefixes)
        self._by_path = {
            route_key(prefix + path): d
            for d in self.dialects
            for path in d.paths
            for prefix in prefixes
        }

    def for_target(self, target: str) -> Dialect | None:
        return self._by_path.get(route_key(route_path(target)))

    def for_object(self, object_type: str) -> Dialect | None:
        """The dialect whose responses carry this `object` field (for orphan responses)."""
        return next((d for d in self.dialects if object_type in d.response_objects), None)

    def records(self, method: str, target: str) -> bool:
        """Whether an exchange for this request is recorded (its path belongs to a dialect)."""
        return self.for_target(target) is not None


__all__ = ["DIALECTS", "Dialect", "DialectRegistry", "Extraction"]
