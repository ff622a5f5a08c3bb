"""Per-choice evidence cut from a captured record (daemon side: no torch, no vLLM).

A record holds the request body as captured and, per choice, the text the
client received with the prover's claims beside it. `choice_evidence` keeps
exactly those: the engine process renders the request and checks the claims.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from veritap.request_body import request_body
from veritap.v1 import record_pb2

from verifierd.errors import VerifierdError
from verifierd.evidence.api_claims import (
    MESSAGES,
    RESPONSES,
    chat_finish,
    ignored_sampling_fields,
)
from verifierd.evidence.logprobs import LogprobsClaim, claimed_logprobs
from verifierd.evidence.prompt_logprobs import PromptLogprobsClaim, claimed_prompt_logprobs
from verifierd.request_sampling import SamplingNotReproducibleError
from verifierd.serving_flags import VLLM_DEFAULTS, ServingFlags
from verifierd.verdicts import Reason

CHAT = "openai-chat"
COMPLETIONS = "openai-completions"
DIALECTS = (CHAT, COMPLETIONS, RESPONSES, MESSAGES)


@dataclass(frozen=True)
class ToolCallView:
    """One tool call as the client's SDK shows it (its id is the server's, not the model's)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ReceivedOutput:
    """What the client read of one choice: content, reasoning, tool calls."""

    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCallView, ...] = ()


class EvidenceUnavailable(VerifierdError):  # noqa: N818 (a reason, like TokensUnavailable)
    """The record does not hold what the verifier needs to rebuild the client's view."""


@dataclass(frozen=True)
class ChoiceEvidence:
    """What the client sent and received for one choice, and what the prover claims."""

    dialect: str
    #: The captured request body (JSON text, as the client sent it).
    request_json: str
    #: Which prompt of the request this choice continues (completions may send several).
    prompt_index: int
    #: The text the client received.
    text: str
    #: The prover's finish claim in chat's terms (`api_claims`), as is the stop reason.
    finish_reason: str
    #: The prover's stop reason as JSON ("" when absent): a stop string or token id.
    stop_reason_json: str
    claimed_prompt_ids: tuple[int, ...] | None = None
    claimed_output_ids: tuple[int, ...] | None = None
    #: Chat: the reasoning and tool calls the client received beside the text.
    reasoning: str = ""
    tool_calls: tuple[ToolCallView, ...] = ()
    #: The commitment's serving flags (how the prover's server renders and parses).
    serving: ServingFlags = VLLM_DEFAULTS
    #: The logprobs the response states for this choice (None: it states none).
    claimed_logprobs: LogprobsClaim | None = None
    #: The ``prompt_logprobs`` the response states for this choice (None: none).
    claimed_prompt_logprobs: PromptLogprobsClaim | None = None

    @property
    def received(self) -> ReceivedOutput:
        return ReceivedOutput(self.text, self.reasoning, self.tool_calls)

    @property
    def claimed_stop(self) -> object:
        """The decoded stop reason (None when absent or not JSON)."""
        if not self.stop_reason_json:
            return None
        try:
            value: object = json.loads(self.stop_reason_json)
        except ValueError:
            return None
        return value


def choice_evidence(
    record: record_pb2.InferenceRecord, serving: ServingFlags = VLLM_DEFAULTS
) -> tuple[ChoiceEvidence, ...]:
    """The evidence of every choice of ``record`` in index order, for a prover
    whose server runs with ``serving``.

    Raises EvidenceUnavailable when the dialect is unknown or the request body
    is not UTF-8 JSON, and SamplingNotReproducibleError when the request carries
    sampling fields its server ignores (`api_claims.ignored_sampling_fields`)."""
    api = record.api
    if api.dialect not in DIALECTS:
        raise EvidenceUnavailable(f"unknown API dialect {api.dialect!r}")
    try:
        request_json = request_body(record).decode("utf-8")
        request = json.loads(request_json)
    except (UnicodeDecodeError, ValueError) as exc:
        raise EvidenceUnavailable(f"the captured request body is not JSON: {exc}") from exc
    n = api.sampling.n if api.sampling.HasField("n") and api.sampling.n > 0 else 1
    shared_prompt = tuple(api.prompt_token_ids.ids) if api.HasField("prompt_token_ids") else None
    # Only chat and completions state logprobs in vLLM's choices.
    logprobs = (
        claimed_logprobs(
            api.dialect,
            record.response.body,
            streamed=api.sampling.stream,
            chat=api.dialect == CHAT,
            most_listed=serving.most_listed,
        )
        if api.dialect in (CHAT, COMPLETIONS)
        else {}
    )
    prompt_logprobs = (
        claimed_prompt_logprobs(
            record.response.body,
            streamed=api.sampling.stream,
            chat=api.dialect == CHAT,
            indices=[c.index for c in api.choices],
            most_listed=serving.most_listed,
        )
        if api.dialect in (CHAT, COMPLETIONS)
        else {}
    )
    fields = request if isinstance(request, dict) else {}
    ignored = ignored_sampling_fields(api.dialect, fields)
    if ignored:
        raise SamplingNotReproducibleError(
            Reason.SAMPLER_NOT_REPRODUCIBLE,
            f"{', '.join(ignored)}: vLLM's Messages server ignores them",
        )
    out = []
    for choice in sorted(api.choices, key=lambda c: c.index):
        finish_reason, stop_reason_json = chat_finish(
            api.dialect, choice.finish_reason, choice.stop_reason_json, fields
        )
        prompt = (
            tuple(choice.prompt_token_ids.ids)
            if choice.HasField("prompt_token_ids")
            else shared_prompt
        )
        out.append(
            ChoiceEvidence(
                dialect=api.dialect,
                request_json=request_json,
                prompt_index=choice.index // n,
                text=choice.text,
                finish_reason=finish_reason,
                stop_reason_json=stop_reason_json,
                claimed_prompt_ids=prompt,
                claimed_output_ids=(
                    tuple(choice.token_ids.ids) if choice.HasField("token_ids") else None
                ),
                reasoning=choice.reasoning,
                tool_calls=tuple(
                    ToolCallView(c.function_name, c.function_arguments) for c in choice.tool_calls
                ),
                serving=serving,
                claimed_logprobs=logprobs.get(choice.index),
                claimed_prompt_logprobs=prompt_logprobs.get(choice.index),
            )
        )
    return tuple(out)
