"""vLLM's own OnlineRenderer, as its server builds it when started with a set of
serving flags: the reference the verifier's rendering is checked against."""

from __future__ import annotations

from typing import Any

from verifierd.serving_flags import ServingFlags


def online_renderer(llm: Any, serving: ServingFlags) -> Any:
    from vllm.renderers.online_renderer import OnlineRenderer

    return OnlineRenderer(
        llm.llm_engine.model_config,
        llm.renderer,
        request_logger=None,
        chat_template=serving.chat_template,
        chat_template_content_format=serving.chat_template_content_format,
        enable_auto_tools=serving.enable_auto_tool_choice,
        exclude_tools_when_tool_choice_none=serving.exclude_tools_when_tool_choice_none,
        tool_parser=serving.tool_call_parser,
        reasoning_parser=serving.reasoning_parser,
        tool_strict_level=serving.tool_strict_level,
        default_chat_template_kwargs=serving.chat_template_kwargs,
    )
